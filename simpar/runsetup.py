"""What a run sets up around its training loop (train.py), on every rank, before the first step.

MPI and the world communicator; the kernel backend (and the reduce inside the collectives); the
data, loaded so that every rank succeeds or fails together; the output paths, checked before any
work is done; the flight recorder and its watchdog (flight.py); the simulated clock on a hardware
profile (simclock.py); the Chrome tracer; and the faults `--inject` asks for, for teaching.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np

from . import checkpoint, collectives, flight, simclock
from .agree import same_data, together
from .comm import Communicator, Ledger
from .config import RunConfig, SimparError, parse_inject
from .costmodel import hardware
from .data import Dataset, load_dataset
from .files import output_problem
from .inputs import run_inputs


def init_mpi():
    from mpi4py import MPI

    return Communicator(MPI.COMM_WORLD, Ledger(), "world")


def select_kernels(cfg: RunConfig) -> str:
    """--kernels, or for `auto` kernels.choose_auto's rule applied to the shapes ONE kernel call sees
    on this layout: the rank's micro-batch rows and its tensor-parallel share of the hidden widths."""
    import kernels

    name = cfg.kernels
    if name == "auto":
        splits = cfg.dp * cfg.grad_accum * (cfg.microbatches if cfg.pp > 1 else 1)
        rows = -(-cfg.batch // splits)
        widths = [cfg.layers[0]] + [w // cfg.tp for w in cfg.layers[1:-1]] + [cfg.layers[-1]]
        name = kernels.choose_auto(widths, rows, cfg.dtype)  # mixed: the float32 compute under HalfKernels
    if name == "cuda":
        from numba import cuda

        if not cuda.is_available():
            raise SimparError(
                "--kernels cuda needs an NVIDIA GPU with its driver (or NUMBA_ENABLE_CUDASIM=1 "
                "to run the same kernels in Numba's CPU simulator, slowly)"
            )
    backend = kernels.use(name)
    if cfg.mixed:  # half tensors, each layer computed in float32 and rounded back (precision.py)
        from .precision import HalfKernels

        backend = kernels.install(HalfKernels(backend, cfg.compute_dtype()))
    collectives.set_reduce_kernel(backend.reduce_add)  # the `dst += src` inside every reducing collective
    if name == "numba":
        # Load (or compile, the very first time) every kernel now, so step 1 is not 0.4-8 s long.
        from kernels import cpu

        cpu.warm_up()
    return backend.name


def load_data_collectively(cfg: RunConfig, world: Communicator) -> tuple[Dataset | None, int]:
    """Every rank must agree on success or failure, or some would wait forever for the others.

    local: every rank loads (identical inputs give identical errors). root: only rank 0 loads and
    tells the others the outcome and the number of training rows (control traffic).
    """
    if cfg.data_source == "local" or world.size == 1:
        data = together(world, load_dataset, cfg)  # a file only one rank lacks must not hang the rest
        same_data(data, world)
        return data, len(data.x_train)
    data, outcome = None, None
    if world.rank == 0:
        try:
            data = load_dataset(cfg)
            outcome = len(data.x_train)
        except SimparError as exc:
            outcome = str(exc)
    outcome = world.bcast_object(outcome, root=0)
    if isinstance(outcome, str):
        raise SimparError(outcome)
    return data, outcome


def check_outputs(cfg: RunConfig, world: Communicator) -> None:
    """Fail before training, not after it, if rank 0 will not be able to write an output file."""
    outputs = {"--metrics-out": cfg.metrics_out, "--weights-out": cfg.weights_out, "--trace": cfg.trace}
    problem = output_problem(outputs, run_inputs(cfg)) if world.rank == 0 else None
    if world.rank == 0 and not problem and cfg.checkpoint_dir:
        try:  # create it, and clear what a killed writer left there
            checkpoint.prepare(cfg.checkpoint_dir)
        except SimparError as exc:
            problem = str(exc)
        found = checkpoint.complete(cfg.checkpoint_dir)
        if not problem and found and not cfg.resume:
            # A fresh run would prune them as it saves: say so instead of deleting someone's work.
            problem = (
                f"--checkpoint-dir {cfg.checkpoint_dir} already holds checkpoints (newest "
                f"{os.path.basename(found[-1][1])}): add --resume auto to continue, "
                "or choose another folder"
            )
    problem = world.bcast_object(problem, root=0) if world.size > 1 else problem
    if problem:
        raise SimparError(problem)


def start_tracer(cfg, world):
    if not cfg.trace:
        return None
    from .trace import Tracer

    return Tracer.install(world.rank)


def start_recorder(cfg: RunConfig, world: Communicator):
    """The flight recorder and its watchdog (flight.py), and --check-collectives / --inject desync."""
    if world.rank == 0:
        flight.prune_dumps()  # this job's dumps go to a folder of its own; only old jobs' are pruned
    world.barrier()
    recorder = flight.install(world.rank, world.size, cfg.watchdog)
    recorder.check_collectives = cfg.check_collectives
    recorder.progress_bar = not cfg.quiet
    fault = parse_inject(cfg.inject) if cfg.inject else None
    if fault and fault["kind"] == "desync" and fault["rank"] == world.rank:
        recorder.desync_at = fault["step"]
    return recorder


def inject(cfg: RunConfig, rank: int, step: int, micro: list) -> list:
    """--inject KIND@rank=R,step=S: the fault, on rank R as step S begins (for teaching: see what the
    watchdog, the flight recorder and the NaN check say). kill: SIGKILL, as a crashed node would;
    stall: sleep T seconds, as a rank stuck in I/O would; nan: a NaN in the rank's input rows (a rank
    without input rows -- a middle pipeline stage -- is left alone); desync: see flight.take_desync."""
    fault = parse_inject(cfg.inject) if cfg.inject else None
    if not fault or fault["rank"] != rank or fault["step"] != step + 1:
        return micro
    if fault["kind"] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault["kind"] == "stall":
        time.sleep(fault["seconds"])
    if fault["kind"] == "nan" and micro and micro[0][0] is not None:
        x = micro[0][0].copy()
        x[0, 0] = np.nan
        micro = [(x, micro[0][1]), *micro[1:]]
    return micro


def start_clock(cfg: RunConfig, world: Communicator):
    """--clock sim: install a simulated clock on the hardware profile (simclock.py), else None."""
    if cfg.clock != "sim":
        return None
    hw = hardware.load(cfg.hardware)
    from .costmodel.spec import precision_of

    precision = precision_of(cfg)  # mixed: the profile's half-precision FLOP rate
    # Ranks that outnumber a node's cores share them (the local profile): each computes that much slower.
    share = hw.compute_share(min(world.size, hw.devices_per_node))
    links = {}
    for group in ("tp", "dp", "pp", "world"):
        link = hardware.group_link(hw, group, cfg.dp, cfg.tp, cfg.pp)
        links[group] = simclock.Link(link.alpha, link.bw)
    links["ep"] = links["edp"] = links["dp"]  # expert parallelism's groups live inside the dp group
    local = hardware.load("local")
    profile = simclock.Profile(
        name=hw.name,
        flop_rate=hw.flop_rate(precision) * share,
        gamma=hw.gamma,
        layer_overhead=hw.layer_overhead,
        compute_share=share,
        stream_share=hw.stream_share(min(world.size, hw.devices_per_node)),
        links=links,
        measured_scale=local.flop_rate(precision) / hw.flop_rate(precision),
        host_progress=hw.host_progress,
    )
    clock = simclock.install(simclock.SimClock(profile, measured=cfg.compute == "measured"))
    world.enable_headers()
    return clock


def mpi_max():
    from mpi4py import MPI

    return MPI.MAX


def mpi_min():
    from mpi4py import MPI

    return MPI.MIN
