"""One training loop for every layout.

    validate (all ranks, no traffic) -> mesh -> data -> strategy -> for each step:
        rows of the global batch (same on every rank) -> this rank's micro-steps -> strategy.train_step
        -> loss reduced over the world (control traffic) -> NaN check, progress bar, epoch summary
    -> final weights gathered to rank 0 -> accuracy -> metrics JSON, weights, tables
    With --checkpoint-dir the full-shape state is gathered to rank 0 and saved every N steps (and at
    the end); --resume loads one (rank 0 reads and verifies, broadcasts) and each rank takes its
    slice, so a run continues exactly where any layout left it (resume.py, checkpoint.py).
    What is set up around the loop -- kernels, data, outputs, the flight recorder, the simulated
    clock, the tracer, injected faults -- is in runsetup.py.

Run it:
    python -m simpar train --dtype float64 --steps 20
    mpiexec -n 4 python -m mpi4py -m simpar train --dp 4 --metrics-out m.json

(Over 300 lines: the loop is read top to bottom as one story, from validate to the metrics; what
is set up around it is already in runsetup.py, checkpoints in resume.py, the report in report/.)
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import numpy as np

from . import console, flight, simclock
from .agree import preflight
from .comm import Communicator
from .config import RunConfig, SimparError, parse_inject
from .costmodel import hardware
from .data import (
    BatchFeeder,
    Dataset,
    global_batches,
    steps_per_epoch,
    total_steps,
)
from .files import write_json, write_trace, write_weights
from .limits import diverged, divergence_message
from .mesh import Mesh
from .model import parameter_count, predict
from .report.metrics import build_metrics, sim_summary
from .report.tables import print_summary
from .resume import resume_collectively, save_checkpoint
from .runsetup import (
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


def evaluate(weights, data: Dataset, activation: str, cfg: RunConfig | None = None) -> float:
    """Validation accuracy of full weights; `cfg` says the architecture (default: the MLP)."""
    x = data.x_val
    if x.dtype.itemsize < 4:  # half precision: NumPy's half matmul is slow; float32 holds it exactly
        x = x.astype(np.float32)
        weights = [(W.astype(np.float32), b.astype(np.float32)) for W, b in weights]
    if cfg is not None and cfg.experts:
        from .moe import predict_logits

        logits = predict_logits(cfg, weights, x)
    elif cfg is not None and cfg.arch == "resmlp":
        from .resmlp import build_units, predict_logits

        logits = predict_logits(build_units(cfg), weights, x)
    else:
        logits = predict(weights, x, activation)
    return float(np.mean(np.argmax(logits, axis=1) == data.y_val))


class Progress:
    """A tqdm bar on rank 0 (nothing elsewhere, nothing under --quiet)."""

    def __init__(self, total: int, enabled: bool):
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="train", unit="step", leave=False, dynamic_ncols=True)
            console.show_bar(self.bar)  # any error line clears it first (console.say)

    def update(self, loss: float) -> None:
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
            self.bar.update(1)

    def write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


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
    with np.errstate(all="ignore"):
        try:
            return _run_training(cfg, world)
        finally:  # the tour runs several layouts in one process: nothing may outlive its run
            flight.uninstall()


def _run_training(cfg: RunConfig, world: Communicator) -> RunResult | None:
    preflight(cfg, world)  # same options on every rank, valid, and the model fits in memory
    if cfg.pp > 1:  # every rank executes the schedule symbolically: refuse a deadlock before any traffic
        from .parallel.schedule_check import refuse_unsound

        refuse_unsound(cfg.schedule, cfg.pp, cfg.microbatches, cfg.virtual_stages)
    recorder = start_recorder(cfg, world)
    check_outputs(cfg, world)
    data, n_train = load_data_collectively(cfg, world)
    steps = total_steps(cfg, n_train)
    resumed = resume_collectively(cfg, world, n_train, steps)  # a bad checkpoint fails here, early
    if resumed is not None and resumed[1] is None:  # --resume auto: the final step is saved already
        return None
    kernels_name = select_kernels(cfg)  # after every check: Numba may compile for seconds
    clock = start_clock(cfg, world)  # --clock sim; before the mesh: its groups need headers
    mesh = Mesh.build(world, cfg.dp, cfg.tp, cfg.pp)
    from .parallel import build_strategy

    strategy = build_strategy(cfg, mesh)
    first = 0
    if resumed is not None:
        strategy.load_full_state(resumed[1])  # every rank slices its shard: no traffic
        first = resumed[2]
    feeder = BatchFeeder(data, cfg, mesh, cfg.compute_dtype())

    per_epoch = steps_per_epoch(n_train, cfg.batch)
    is_root = world.rank == 0
    show = is_root and not cfg.quiet
    progress = Progress(steps - first, show)
    saved, save_s = [], 0.0
    losses, epoch_log, step_times = [], [], []
    tracer = start_tracer(cfg, world)

    world.barrier()
    start = time.perf_counter()
    epoch_start, epoch_samples, eval_s = start, 0, 0.0
    batches = global_batches(n_train, cfg.batch, cfg.seed, steps, first)
    for step, (epoch, rows) in enumerate(batches, start=first):
        step_start = time.perf_counter()
        recorder.step, recorder.step_since = step, time.monotonic()
        if clock is not None:
            clock.begin_step(world.mpi.allreduce(clock.now, op=mpi_max()))
        micro = inject(cfg, world.rank, step, feeder.get(rows))
        loss = world.allreduce_scalar(strategy.train_step(micro, cfg.batch))
        if clock is not None:  # the loss all-reduce synchronises the ranks: clocks meet at the latest
            clock.end_step(world.mpi.allreduce(clock.now, op=mpi_max()))
        step_times.append(time.perf_counter() - step_start)
        if not math.isfinite(loss) or (losses and diverged(loss, losses[0])):
            progress.close()  # so the error line starts a line of its own, not after the bar
            _raise_nonfinite(loss, step, strategy, world, losses[:1])
        losses.append(loss)
        progress.update(loss)
        epoch_samples += cfg.batch
        if (step + 1) % per_epoch == 0 or step + 1 == steps:
            now = time.perf_counter()
            entry = {
                "epoch": epoch + 1,
                "step": step + 1,
                "loss": loss,
                "samples_per_s": epoch_samples / max(now - epoch_start, 1e-9),
            }
            if cfg.eval_every_epoch:  # every rank joins: gathering weights may be collective
                eval_start = time.perf_counter()
                weights = strategy.full_weights()
                if is_root and data is not None:
                    entry["val_accuracy"] = evaluate(weights, data, cfg.activation, cfg)
                eval_s += time.perf_counter() - eval_start
            if show:
                acc = f"  val acc {entry['val_accuracy']:.3f}" if "val_accuracy" in entry else ""
                progress.write(
                    f"epoch {entry['epoch']:3d}  step {step + 1:5d}  loss {loss:.4f}{acc}"
                    f"  {entry['samples_per_s']:.0f} samples/s"
                )
            epoch_log.append(entry)
            epoch_start, epoch_samples = time.perf_counter(), 0
        every = cfg.checkpoint_every
        if cfg.checkpoint_dir and ((every and (step + 1) % every == 0) or step + 1 == steps):
            save_start = time.perf_counter()
            saved.append(save_checkpoint(cfg, world, strategy, step + 1, n_train))
            save_s += time.perf_counter() - save_start
    recorder.step_since = None  # the steps are over: the watchdog's step rule stops here
    world.barrier()
    elapsed = time.perf_counter() - start
    progress.close()

    # Everything below is bookkeeping: snapshot the training traffic before control traffic adds up.
    ledger = world.ledger.snapshot()
    weights = strategy.full_weights()
    if weights is not None and cfg.mixed:  # float32 holds every half value exactly; npz can't hold bf16
        weights = [(W.astype(np.float32), b.astype(np.float32)) for W, b in weights]
    gathered = world.gather_object(
        {
            "rank": world.rank,
            "coords": [mesh.pp_index, mesh.dp_index, mesh.tp_index],
            "ledger": ledger,
            "memory": strategy.memory(),
            "trace": tracer.events if tracer else None,
            "sim": [dataclasses.asdict(s) for s in clock.steps] if clock else None,
        },
        root=0,
    )
    if tracer is not None:
        tracer.uninstall()  # the tour runs several layouts in one process
    simclock.uninstall()
    if not is_root:
        return None
    metrics = build_metrics(
        cfg,
        world.size,
        mesh,
        _param_count(cfg),
        losses,
        epoch_log,
        gathered,
        elapsed,
        steps - first,  # the steps this run did (resumed: from `first` on)
        kernels_name,
        step_times,
        eval_s,
    )
    if data is not None:
        metrics["accuracy"] = evaluate(weights, data, cfg.activation, cfg)
    if cfg.experts:  # routing per step: tokens per expert, drops, kept rows per (dp rank, expert)
        metrics["moe"] = strategy.routing_summary()
    if cfg.mixed:  # rank 0's scaler: every rank took the same skip decisions (precision.py)
        metrics["precision"] = {"name": cfg.precision, **strategy.optimizer.summary()}
    # The closed-form prediction beside the measurement: bytes and shard memory must agree exactly.
    from .costmodel import mismatches, predict_from_config

    hw = hardware.load(cfg.hardware)  # the profile of the prediction (and of the simulated clock)
    # The backend that ran (auto resolved; "numba+float16" under mixed precision is numba's float32
    # work): its memory passes are what the clock charged (costmodel/passes.py).
    cfg = dataclasses.replace(cfg, kernels=kernels_name.split("+")[0])
    metrics["predicted"] = predict_from_config(
        cfg, world.size, steps=steps - first, hw=hw, routing=metrics.get("moe")
    )
    if cfg.experts:  # the all-to-all as routed, beside what perfectly balanced routing would move
        balanced = predict_from_config(cfg, world.size, steps=1, hw=hw)["comm"]["per_step"]["activation"]
        metrics["moe"]["activation_per_step"] = {
            "measured": metrics["comm"]["per_step"]["activation"],
            "balanced": balanced,
        }
    metrics["checkpoint"] = {
        "dir": cfg.checkpoint_dir,
        "every": cfg.checkpoint_every,
        "saved": saved,
        "save_s": save_s,
        "resumed_from": resumed[0] if resumed else None,
        "start_step": first,
    }
    if clock is not None:
        serial = dataclasses.replace(
            cfg,
            dp=1,
            tp=1,
            sp=False,
            pp=1,
            zero=0,
            stage_layers=None,
            schedule="1f1b",
            virtual_stages=1,
            recompute="none",
            ep=1,
        )
        serial_step = predict_from_config(serial, 1, steps=1, hw=hw)["time"]["step_s"]
        per_rank = [g["sim"] for g in sorted(gathered, key=lambda g: g["rank"])]
        metrics["time"]["sim"] = sim_summary(per_rank, cfg, hw, metrics["predicted"], serial_step)
    metrics["prediction_mismatches"] = mismatches(metrics, metrics["predicted"])
    return RunResult(metrics, weights, [g["trace"] for g in gathered])


def _param_count(cfg) -> int:
    if cfg.experts:
        from .moe import moe_param_count

        return sum(moe_param_count(cfg.layers, cfg.experts))
    return parameter_count(cfg.layers) if cfg.arch == "mlp" else sum(u.size for u in _units(cfg))


def _units(cfg):
    from .resmlp import build_units

    return build_units(cfg)


def _raise_nonfinite(loss: float, step: int, strategy, world: Communicator, first_loss=()) -> None:
    """All ranks see the same reduced loss, so all get here together; find who went bad first."""
    if math.isfinite(loss):
        raise SimparError(divergence_message(loss, step + 1, first_loss[0], strategy.cfg.lr))
    mine = strategy.first_nonfinite
    first = world.allreduce_scalar(mine if mine is not None else math.inf, op=mpi_min())
    where = (
        f"the output of layer {int(first)} was the first to hold NaN/inf"
        if math.isfinite(first)
        else "no layer output was non-finite, so the loss itself overflowed"
    )
    cfg = strategy.cfg
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
