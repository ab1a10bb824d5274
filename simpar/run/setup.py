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
from functools import partial

import numpy as np

from .. import job
from ..config import RunConfig, SimparError, parse_inject
from ..costmodel import hardware
from ..files import output_problem
from ..inputs import run_inputs
from ..registries import check as check_registries
from ..runtime import flight, simclock
from ..runtime.agree import same_data, together
from ..runtime.comm import Communicator, Ledger
from ..runtime.mesh import Mesh, axis_sizes, group_of
from ..runtime.network import Network
from ..runtime.trace import Tracer
from . import checkpoint
from .data import Dataset, load_dataset

check_registries()  # a name one side lacks stops every run here, not after training (registries.py)


def init_mpi():
    from mpi4py import MPI

    return Communicator(MPI.COMM_WORLD, Ledger(), "world")


def select_kernels(cfg: RunConfig, world: Communicator) -> str:
    """--kernels (`auto`: kernels.AUTO, NumPy's, and why). The backend goes into the run's runtime (the
    layers, optimizers and collectives' reduce-add take it from there), not into the process: another
    run in this process may choose another."""
    import kernels

    name = kernels.AUTO if cfg.kernels == "auto" else cfg.kernels
    if name == "cuda":
        from numba import cuda

        if not cuda.is_available():
            raise SimparError(
                "--kernels cuda needs an NVIDIA GPU with its driver (or NUMBA_ENABLE_CUDASIM=1 "
                "to run the same kernels in Numba's CPU simulator, slowly)"
            )
    backend = kernels.load(name)
    if cfg.mixed:  # half tensors, each layer computed in float32 and rounded back (precision.py)
        from ..model.precision import HalfKernels

        backend = HalfKernels(backend, cfg.compute_dtype())
    world.runtime.kernels = backend  # the `dst += src` inside every reducing collective, too
    if name == "numba":
        # Load (or compile, the very first time: about 20 s) every kernel of the run's compute dtype
        # now, so that neither step 1's wall time nor the watchdog's first step includes it (the other
        # dtype's kernels load if a collective ever calls them).
        from kernels import cpu

        cpu.warm_up([np.float32 if cfg.mixed else np.dtype(cfg.dtype)])
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
    job.note_checkpoint_root(cfg.checkpoint_dir)  # for Ctrl-C's line (cli/__init__.py)
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
    """--trace: the run's tracer, in the runtime every group of this run carries (after start_clock:
    under --clock sim its events take simulated time)."""
    world.runtime.tracer = Tracer(world.rank, world.runtime.clock) if cfg.trace else None
    return world.runtime.tracer


def start_recorder(cfg: RunConfig, world: Communicator):
    """The flight recorder and its watchdog (flight.py), and --check-collectives / --inject desync."""
    if world.rank == 0:
        flight.prune_dumps()  # this job's dumps go to a folder of its own; only old jobs' are pruned
    world.barrier()
    recorder = world.runtime.recorder = flight.start(world.rank, world.size, cfg.watchdog)
    recorder.check_collectives = cfg.check_collectives
    flight.show_progress_bar(recorder, not cfg.quiet)
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
    """--clock sim: a simulated clock on the hardware profile (simclock.py) in the run's runtime,
    else None. The profile's numbers are copied in as plain data (runtime/ never imports the cost
    model): each message's link follows from where its two ranks sit (runtime/network.py)."""
    world.runtime.clock = None
    if cfg.clock != "sim":
        return None
    hw = hardware.load(cfg.hardware)
    from ..costmodel.spec import precision_of

    precision = precision_of(cfg)  # mixed: the profile's half-precision FLOP rate
    # Ranks that outnumber a node's cores share them (the local profile): each computes that much slower.
    share = hw.compute_share(min(world.size, hw.devices_per_node))
    rails = bool(hw.ring_proto)  # GPU profiles: NCCL drives one rail per member of a group on a node
    network = Network(
        hw.devices_per_node,
        hw.intra_alpha,
        hw.intra_bw,
        hw.inter_alpha,
        hw.nic_bw,
        hw.nics_per_node,
        rails=rails,
        world_size=world.size,  # a part-filled last node shares its NICs among fewer ranks
    )
    # NCCL's tuner (costmodel/nccl.py) as a function of plain numbers: the clock hands it the group's
    # size, node span and link, found from where its ranks sit; the profile's protocol table is data.
    tuner = partial(hardware.tuning, hw) if hw.ring_proto else None
    local = hardware.load("local")
    profile = simclock.Profile(
        name=hw.name,
        flop_rate=hw.flop_rate(precision) * share,
        gamma=hw.gamma,
        layer_overhead=hw.layer_overhead,
        compute_share=share,
        stream_share=hw.stream_share(min(world.size, hw.devices_per_node)),
        links={},
        network=network,
        measured_scale=local.flop_rate(precision) / hw.flop_rate(precision),
        host_progress=hw.host_progress,
        tuner=tuner,
        reduce_gamma=0.0 if hw.reduce_in_transfer else None,
    )
    clock = world.runtime.clock = simclock.SimClock(profile, measured=cfg.compute == "measured")
    world.enable_headers()
    return clock


def build_mesh(cfg: RunConfig, world: Communicator, clock) -> Mesh:
    """The run's mesh: every group split and wrapped (bfloat16 travels as uint16) once, here, and
    placed on nodes of the profile's size under --clock sim."""
    from ..model.precision import wire

    nodes = clock.profile.network.devices_per_node if clock is not None else None
    if clock is not None:
        check_placement(cfg, clock.profile.network, world.size)
    return Mesh.build(
        world,
        cfg.dp,
        cfg.tp,
        cfg.pp,
        ep=cfg.ep,
        wrap=lambda comm: wire(comm, cfg),
        devices_per_node=nodes,
        experts=cfg.experts > 0,
        cp=cfg.cp,
    )


def check_placement(cfg: RunConfig, network: Network, world_size: int) -> None:
    """--clock sim: refuse a placement whose groups of one kind do not all talk over one link (a group
    with more members on one node than on another, or a part-filled last node that gives its ranks
    more of its NICs each: network.uneven_group). The closed form prices each kind of collective on one
    link, so it could not follow such a run; every rank reaches the same answer, before any traffic."""
    sizes = axis_sizes(cfg.dp, cfg.tp, cfg.pp, cfg.ep, cfg.cp)
    names = ["tp", "dp", "pp"] + (["ep", "edp", "edpcp"] if cfg.experts else []) + ["cp", "dpcp"]
    names += ["world"] if cfg.data_source == "root" else []  # the world group carries data then
    groups = {
        n: list({min(g): g for g in (group_of(r, n, sizes) for r in range(world_size))}.values())
        for n in names
    }
    kind = network.uneven_group(groups)
    if kind:
        G = network.devices_per_node
        raise SimparError(
            f"--clock sim: on nodes of {G} devices, {world_size} ranks put the {kind} groups' members "
            "unevenly on nodes (so their messages would not all take one link, which the closed form "
            f"assumes); choose a layout whose {kind} groups fill nodes alike, or another devices_per_node"
        )


def mpi_max():
    from mpi4py import MPI

    return MPI.MAX


def mpi_min():
    from mpi4py import MPI

    return MPI.MIN
