"""One training loop for every layout, read like nanoGPT's: set up, then for each step: data, step,
log, checkpoint; then gather, and report.

    _set_up: validate (all ranks, no traffic), memory, schedule, outputs, data, checkpoint to resume
        -> kernels, clock, mesh, strategy, the batches' feeder                    (helpers: setup.py)
    for each step: rows of the global batch (same on every rank) -> this rank's micro-steps ->
        strategy.train_step -> loss reduced over the world -> NaN/divergence check, progress bar,
        epoch line (and validation accuracy), checkpoint every N steps and at the end
    _finish: every rank's ledger, memory, trace and simulated steps gathered to rank 0 -> accuracy
        -> the metrics and the cost model's prediction beside them (report/postrun.py)
With --checkpoint-dir the full-shape state is gathered to rank 0 and saved; --resume loads one (rank
0 reads and verifies, broadcasts) and each rank takes its slice, so a run continues exactly where any
layout left it (resume.py, checkpoint.py).

Run it:
    python -m simpar train --dtype float64 --steps 20
    mpiexec -n 4 python -m mpi4py -m simpar train --dp 4 --metrics-out m.json
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import numpy as np

from .. import job
from ..config import RunConfig, SimparError, parse_inject
from ..costmodel import hardware
from ..files import write_json, write_trace, write_weights
from ..report.postrun import Measured, run_metrics
from ..report.tables import print_summary
from ..runtime import flight
from ..runtime.agree import preflight
from ..runtime.comm import Communicator
from ..runtime.mesh import Mesh
from .data import (
    BatchFeeder,
    Dataset,
    global_batches,
    steps_per_epoch,
    total_steps,
)
from .evaluate import evaluate
from .limits import diverged, divergence_message
from .progress import Progress
from .resume import resume_collectively, save_checkpoint
from .setup import (
    build_mesh,
    check_outputs,
    init_mpi,
    inject,
    load_data_collectively,
    mpi_max,
    mpi_min,
    select_kernels,
    start_clock,
    start_recorder,
    start_tracer,
)


@dataclass
class RunResult:
    """What one run leaves on rank 0: the metrics document (report/metrics.py; JSON-ready), the final
    full-shape weights [(W, b), ...], and every rank's trace events (None per rank without --trace)."""

    metrics: dict
    weights: list
    trace: list


def run_training(cfg: RunConfig, world: Communicator) -> RunResult | None:
    """Train one layout on all ranks of `world`; returns a RunResult on rank 0 (None elsewhere)."""
    # Overflow is detected where it matters (a non-finite loss, blamed on a layer): NumPy's own
    # warnings would only print the same news once per rank, in the middle of the progress bar.
    job.start_guardian(world.rank, world.size)  # names this rank if it is killed outright (job.py)
    with np.errstate(all="ignore"):
        try:
            return _run_training(cfg, world)
        finally:  # the tour runs several layouts in one process: nothing may outlive its run
            flight.stop(world.runtime.recorder)


@dataclass
class Run:
    """What the loop works with, set up once: the data, the mesh and strategy, the batches' feeder,
    the step to start from (0, or a checkpoint's), the clocks, the recorder, the tracer, the progress bar."""

    cfg: RunConfig
    world: Communicator
    data: Dataset | None
    n_train: int
    steps: int
    first: int
    resumed_from: str | None
    kernels_name: str
    mesh: Mesh
    strategy: object
    feeder: BatchFeeder
    clock: object
    recorder: object
    tracer: object
    progress: Progress


def _run_training(cfg: RunConfig, world: Communicator) -> RunResult | None:
    run = _set_up(cfg, world)
    if run is None:  # --resume auto: the final step is saved already
        return None
    log, per_epoch = Measured(), steps_per_epoch(run.n_train, cfg.batch)
    batches = global_batches(run.n_train, cfg.batch, cfg.seed, run.steps, run.first)
    world.barrier()
    start = time.perf_counter()
    this_epoch = _EpochClock(start)
    for step, (epoch, rows) in enumerate(batches, start=run.first):
        step_start = time.perf_counter()
        loss = _train_step(run, step, rows)  # data, forward, backward, optimizer, loss over the world
        log.step_times.append(time.perf_counter() - step_start)
        _check_loss(run, loss, step, log.losses)
        log.losses.append(loss)
        run.progress.update(loss)
        this_epoch.samples += cfg.batch
        if (step + 1) % per_epoch == 0 or step + 1 == run.steps:
            _end_epoch(run, log, this_epoch, epoch, step, loss)
        if _checkpoint_due(cfg, step, run.steps):
            save_start = time.perf_counter()
            log.saved.append(save_checkpoint(cfg, world, run.strategy, step + 1, run.n_train))
            log.save_s += time.perf_counter() - save_start
    run.recorder.step_since = None  # the steps are over: the watchdog's step rule stops here
    world.barrier()
    log.elapsed = time.perf_counter() - start
    run.progress.close()
    return _finish(run, log)


def _set_up(cfg: RunConfig, world: Communicator) -> Run | None:
    """Every check first (options, memory, schedule, outputs, data, checkpoint), then what trains:
    kernels, the clock, the mesh, the strategy (from a checkpoint if resuming), the batches' feeder."""
    preflight(
        cfg, world, hardware.load
    )  # same options on every rank, valid, the model fits, the profile sound
    if cfg.pp > 1:  # every rank executes the schedule symbolically: refuse a deadlock before any traffic
        from ..parallel.pipeline.check import refuse_unsound

        refuse_unsound(cfg.schedule, cfg.pp, cfg.microbatches, cfg.virtual_stages)
    recorder = start_recorder(cfg, world)
    check_outputs(cfg, world)
    data, n_train = load_data_collectively(cfg, world)
    steps = total_steps(cfg, n_train)
    resumed = resume_collectively(cfg, world, n_train, steps)  # a bad checkpoint fails here, early
    if resumed is not None and resumed[1] is None:
        return None
    kernels_name = select_kernels(cfg, world)  # after every check: Numba may compile for seconds
    clock = start_clock(cfg, world)  # --clock sim; before the mesh: its groups need headers
    mesh = build_mesh(cfg, world, clock)
    from ..parallel import build_strategy

    strategy = build_strategy(cfg, mesh)
    first = 0
    if resumed is not None:
        strategy.load_full_state(resumed[1])  # every rank slices its shard: no traffic
        first = resumed[2]
    feeder = BatchFeeder(data, cfg, mesh, cfg.compute_dtype())
    progress = Progress(steps - first, world.rank == 0 and not cfg.quiet)
    tracer = start_tracer(cfg, world)
    resumed_from = resumed[0] if resumed else None
    return Run(
        cfg, world, data, n_train, steps, first, resumed_from, kernels_name, mesh, strategy, feeder, clock,
        recorder, tracer, progress,
    )  # fmt: skip


def _train_step(run: Run, step: int, rows) -> float:
    """This rank's micro-steps of the global batch's `rows`, one optimizer step, the loss reduced over
    the world (which synchronises the ranks: the simulated clocks meet at the latest)."""
    world, clock = run.world, run.clock
    run.recorder.step, run.recorder.step_since = step, time.monotonic()
    if clock is not None:
        clock.begin_step(world.mpi.allreduce(clock.now, op=mpi_max()))
    micro = inject(run.cfg, world.rank, step, run.feeder.get(rows))
    loss = world.allreduce_scalar(run.strategy.train_step(micro, run.cfg.batch))
    if clock is not None:
        clock.end_step(world.mpi.allreduce(clock.now, op=mpi_max()))
    return loss


def _check_loss(run: Run, loss: float, step: int, losses: list) -> None:
    """A non-finite or diverging loss ends the run on every rank (all see the same reduced loss)."""
    if not math.isfinite(loss) or (losses and diverged(loss, losses[0])):
        run.progress.close()  # so the error line starts a line of its own, not after the bar
        _raise_nonfinite(loss, step, run.cfg, run.strategy, run.world, losses[:1])


@dataclass
class _EpochClock:
    """When the current epoch started and how many samples it has trained."""

    start: float
    samples: int = 0


def _end_epoch(run: Run, log: Measured, clock: _EpochClock, epoch: int, step: int, loss: float) -> None:
    """One line of the epoch log: throughput, and the validation accuracy unless turned off."""
    cfg = run.cfg
    entry = {
        "epoch": epoch + 1,
        "step": step + 1,
        "loss": loss,
        "samples_per_s": clock.samples / max(time.perf_counter() - clock.start, 1e-9),
    }
    if cfg.eval_every_epoch:  # every rank joins: gathering weights may be collective
        eval_start = time.perf_counter()
        weights = run.strategy.full_weights()
        if run.world.rank == 0 and run.data is not None:
            entry["val_accuracy"] = evaluate(weights, run.data, cfg.activation, cfg)
        log.eval_s += time.perf_counter() - eval_start
    if run.world.rank == 0 and not cfg.quiet:
        acc = f"  val acc {entry['val_accuracy']:.3f}" if "val_accuracy" in entry else ""
        run.progress.write(
            f"epoch {entry['epoch']:3d}  step {step + 1:5d}  loss {loss:.4f}{acc}"
            f"  {entry['samples_per_s']:.0f} samples/s"
        )
    log.epoch_log.append(entry)
    clock.start, clock.samples = time.perf_counter(), 0


def _checkpoint_due(cfg: RunConfig, step: int, steps: int) -> bool:
    """With --checkpoint-dir: every --checkpoint-every steps, and after the last one."""
    every = cfg.checkpoint_every
    return bool(cfg.checkpoint_dir) and ((every and (step + 1) % every == 0) or step + 1 == steps)


def _finish(run: Run, log: Measured) -> RunResult | None:
    """Gather every rank's ledger, memory, trace and simulated steps to rank 0 (snapshotting the
    training traffic before this control traffic adds up), then the report (report/postrun.py)."""
    cfg, world, strategy, clock = run.cfg, run.world, run.strategy, run.clock
    ledger = world.ledger.snapshot()
    weights = strategy.full_weights()
    if weights is not None and cfg.mixed:  # float32 holds every half value exactly; npz can't hold bf16
        weights = [(W.astype(np.float32), b.astype(np.float32)) for W, b in weights]
    mesh = run.mesh
    gathered = world.gather_object(
        {
            "rank": world.rank,
            "coords": [mesh.pp_index, mesh.dp_index, mesh.tp_index, mesh.coords.get("cp", 0)],
            "ledger": ledger,
            "memory": strategy.memory(),
            "trace": run.tracer.events if run.tracer else None,
            "sim": [dataclasses.asdict(s) for s in clock.steps] if clock else None,
        },
        root=0,
    )
    if world.rank != 0:
        return None
    accuracy = evaluate(weights, run.data, cfg.activation, cfg) if run.data is not None else None
    metrics = run_metrics(
        cfg, world.size, mesh, strategy, gathered, log,
        kernels_name=run.kernels_name, steps=run.steps, first=run.first, accuracy=accuracy,
        resumed_from=run.resumed_from, simulated=clock is not None,
    )  # fmt: skip
    return RunResult(metrics, weights, [g["trace"] for g in gathered])


def _raise_nonfinite(loss: float, step: int, cfg, strategy, world: Communicator, first_loss=()) -> None:
    """All ranks see the same reduced loss, so all get here together; find who went bad first."""
    if math.isfinite(loss):
        raise SimparError(divergence_message(loss, step + 1, first_loss[0], cfg.lr))
    mine = strategy.first_nonfinite
    first = world.allreduce_scalar(mine if mine is not None else math.inf, op=mpi_min())
    where = (
        f"the output of layer {int(first)} was the first to hold NaN/inf"
        if math.isfinite(first)
        else "no layer output was non-finite, so the loss itself overflowed"
    )
    fault = parse_inject(cfg.inject) if cfg.inject else {}
    advice = (  # a fault put there on purpose (lesson 07) is not a learning-rate problem
        f"--inject {cfg.inject} put NaN into rank {fault['rank']}'s input rows at step {fault['step']}"
        if fault.get("kind") == "nan"
        else f"try a smaller --lr (now {cfg.lr}) or --dtype float64"
    )
    raise SimparError(f"loss became {loss} at step {step + 1}: {where}; {advice}")


def train_main(cfg: RunConfig) -> int:
    world = init_mpi()
    result = run_training(cfg, world)
    if result is not None:
        if not cfg.quiet:
            print_summary(result.metrics)
        if cfg.metrics_out:
            write_json(cfg.metrics_out, result.metrics)
        if cfg.weights_out:
            write_weights(cfg.weights_out, result.weights)
        if cfg.trace:
            write_trace(cfg.trace, result.trace)
    return 0
