"""Ranks agree before they train: on every error, on the options, on the data.

Why: an MPI job hangs when one rank leaves while the others wait in a collective. A check that
can fail on ONE rank only (an option only it was given in an MPMD launch, a file only its copy
lacks, memory only its node is short of) must therefore not raise there alone. `together` runs a
check on every rank, then all ranks exchange (ok, message) and all raise the same SimparError;
cli/base.finish_error prints it once (rank 0) and every rank leaves with status 2.

Options that differ between ranks would otherwise train silently wrong (`--lr 0.05 : --lr 0.5`),
so `same_config` compares the whole RunConfig, and `same_data` a fingerprint of the data.

`world` is a comm.Communicator (duck-typed: only gather_object and bcast_object are used).
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

from ..config import RunConfig, SimparError, validate
from ..run.limits import check_memory

# Config fields whose command-line flag is not simply --field-name.
_FLAGS = {"overlap": "--no-overlap", "eval_every_epoch": "(eval every epoch)", "blocks": "--n-layers"}


def allgather(world, obj) -> list:
    """Every rank's `obj`, in rank order, on every rank (booked as control traffic)."""
    if world.size == 1:
        return [obj]
    return world.bcast_object(world.gather_object(obj, root=0), root=0)


def together(world, fn, *args):
    """fn(*args) on every rank; if it raised SimparError (or ran out of memory) on any rank, every
    rank raises the same one: the lowest failing rank's message, naming it if others were fine."""
    result, problem = None, None
    try:
        result = fn(*args)
    except SimparError as exc:
        problem = str(exc)
    except MemoryError:
        problem = "ran out of memory while preparing the run; try smaller --layers, --samples or --batch"
    problems = allgather(world, problem)
    failed = [(rank, p) for rank, p in enumerate(problems) if p]
    if failed:
        rank, message = failed[0]
        raise SimparError(message if len(failed) == world.size else f"rank {rank}: {message}")
    return result


def same_config(cfg: RunConfig, world) -> None:
    """Every option equal on every rank, compared before validation fills anything in."""
    mine = {key: repr(value) for key, value in cfg.to_dict().items()}  # repr: nan == nan
    everyone = allgather(world, mine)
    for key in mine:  # RunConfig's field order, so "the first differing option" is well defined
        odd = [rank for rank, d in enumerate(everyone) if d.get(key) != everyone[0][key]]
        if odd:
            flag = _FLAGS.get(key, "--" + key.replace("_", "-"))
            ranks = "rank" + ("s " if len(odd) > 1 else " ") + ", ".join(map(str, odd))
            raise SimparError(
                f"ranks disagree on {flag}: rank 0 has {everyone[0][key]}, {ranks} "
                f"{'have' if len(odd) > 1 else 'has'} {everyone[odd[0]][key]}; "
                "start every rank with the same options"
            )


def preflight(cfg: RunConfig, world, load_profile) -> RunConfig:
    """The checks before any training traffic: same options, valid options, model fits in memory, and
    the hardware profile (of the prediction in the metrics, and of --clock sim) is sound:
    `load_profile(name)` reads and checks it (the cost model's; runtime/ does not import it)."""
    same_config(cfg, world)  # first: a differing option is the cause of any one-rank failure below
    together(world, validate, cfg, world.size)
    together(world, check_memory, cfg, world.size)
    together(world, load_profile, cfg.hardware)  # a bad profile fails now, not after the last step
    return cfg


def fingerprint(data) -> str:
    """A hash of the training and validation arrays (shape, dtype and bytes)."""
    h = hashlib.blake2b(digest_size=16)
    for a in (data.x_train, data.y_train, data.x_val, data.y_val):
        h.update(f"{a.shape}{a.dtype}".encode())
        h.update(np.ascontiguousarray(a).view(np.uint8))  # raw bytes (bfloat16 has no buffer format)
    return h.hexdigest()


def same_data(data, world) -> None:
    """With --data-source local every rank loads its own copy: the copies must be identical."""
    if world.size == 1:
        return
    everyone = allgather(world, fingerprint(data))
    odd = [rank for rank, f in enumerate(everyone) if f != everyone[0]]
    if odd:
        raise SimparError(
            f"ranks loaded different data: rank {odd[0]} differs from rank 0 (fingerprint "
            f"{everyone[odd[0]][:8]} vs {everyone[0][:8]}); give every rank identical data files, "
            "or use --data-source root"
        )


def _mpi_world():
    """COMM_WORLD when this process is one rank of several (MPI started, or a launcher says so)."""
    import sys

    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None:
        size = next((os.environ[v] for v in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE") if v in os.environ), "1")
        if not size.isdigit() or int(size) < 2:
            return None
        from mpi4py import MPI as mpi
    if not mpi.Is_initialized() or mpi.Is_finalized() or mpi.COMM_WORLD.Get_size() < 2:
        return None
    return mpi.COMM_WORLD


def same_command(argv: list[str]) -> None:
    """The first exchange of every subcommand: all ranks run the same one (else one would wait in a
    collective the others never call), learn rank 0's run id (job.py), and start their guardians.
    `train` leaves differing options to same_config, which names the option; every other command
    must have identical arguments."""
    from .. import job

    world = _mpi_world()
    if world is None:
        job.set_run_id(job.new_run_id())  # a lone process's guardian starts when it trains (run/loop.py)
        return
    everyone = world.gather(list(argv), root=0)
    verdict = None
    if world.rank == 0:
        verdict = (_command_problem(everyone), job.new_run_id())
    problem, run_id = world.bcast(verdict, root=0)
    job.set_run_id(run_id)
    job.start_guardian(world.rank, world.size)
    if problem:
        raise SimparError(problem)


def _command_problem(everyone: list[list[str]]) -> str | None:
    first = everyone[0]
    command = first[0] if first else ""
    differs = [args[:1] != first[:1] or (command != "train" and args != first) for args in everyone]
    odd = [rank for rank, d in enumerate(differs) if d]
    if not odd:
        return None
    ranks = "rank" + ("s " if len(odd) > 1 else " ") + ", ".join(map(str, odd))
    what = "commands" if everyone[odd[0]][:1] != first[:1] else f"arguments of `simpar {command}`"
    return (
        f"ranks run different {what}: rank 0 runs `simpar {' '.join(first)}`, {ranks} "
        f"{'run' if len(odd) > 1 else 'runs'} `simpar {' '.join(everyone[odd[0]])}`; "
        "start every rank with the same command"
    )
