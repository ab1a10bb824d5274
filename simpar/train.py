"""One training loop for every layout.

    validate (all ranks, no traffic) -> mesh -> data -> strategy -> for each step:
        rows of the global batch (same on every rank) -> this rank's micro-steps -> strategy.train_step
        -> loss reduced over the world (control traffic) -> NaN check, progress bar, epoch summary
    -> final weights gathered to rank 0 -> accuracy -> metrics JSON, weights, tables

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

from . import collectives, simclock
from .comm import Communicator, Ledger
from .config import RunConfig, SimparError, validate
from .costmodel import hardware
from .data import BatchFeeder, Dataset, global_batches, load_dataset, steps_per_epoch, total_steps
from .files import writable, write_json, write_trace, write_weights
from .mesh import Mesh
from .model import parameter_count, predict
from .report.metrics import build_metrics, sim_summary
from .report.tables import print_summary


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
        data = load_dataset(cfg)
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


def evaluate(weights, data: Dataset, activation: str, cfg: RunConfig | None = None) -> float:
    """Validation accuracy of full weights; `cfg` says the architecture (default: the MLP)."""
    x = data.x_val
    if x.dtype.itemsize < 4:  # half precision: NumPy's half matmul is slow; float32 holds it exactly
        x = x.astype(np.float32)
        weights = [(W.astype(np.float32), b.astype(np.float32)) for W, b in weights]
    if cfg is not None and cfg.arch == "resmlp":
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
        return _run_training(cfg, world)


def _run_training(cfg: RunConfig, world: Communicator) -> RunResult | None:
    validate(cfg, world.size)
    _check_outputs(cfg, world)
    data, n_train = load_data_collectively(cfg, world)
    kernels_name = select_kernels(cfg)  # after every check: Numba may compile for seconds
    clock = start_clock(cfg, world)  # --clock sim; before the mesh: its groups need headers
    mesh = Mesh.build(world, cfg.dp, cfg.tp, cfg.pp)
    from .parallel import build_strategy

    strategy = build_strategy(cfg, mesh)
    feeder = BatchFeeder(data, cfg, mesh, cfg.compute_dtype())

    steps = total_steps(cfg, n_train)
    per_epoch = steps_per_epoch(n_train, cfg.batch)
    is_root = world.rank == 0
    show = is_root and not cfg.quiet
    progress = Progress(steps, show)
    losses, epoch_log, step_times = [], [], []
    tracer = _tracer(cfg, world)

    world.barrier()
    start = time.perf_counter()
    epoch_start, epoch_samples, eval_s = start, 0, 0.0
    for step, (epoch, rows) in enumerate(global_batches(n_train, cfg.batch, cfg.seed, steps)):
        step_start = time.perf_counter()
        if clock is not None:
            clock.begin_step(world.mpi.allreduce(clock.now, op=_mpi_max()))
        micro = feeder.get(rows)
        loss = world.allreduce_scalar(strategy.train_step(micro, cfg.batch))
        if clock is not None:  # the loss all-reduce synchronises the ranks: clocks meet at the latest
            clock.end_step(world.mpi.allreduce(clock.now, op=_mpi_max()))
        step_times.append(time.perf_counter() - step_start)
        if not math.isfinite(loss):
            _raise_nonfinite(loss, step, strategy, world)
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
        parameter_count(cfg.layers) if cfg.arch == "mlp" else sum(u.size for u in _units(cfg)),
        losses,
        epoch_log,
        gathered,
        elapsed,
        steps,
        kernels_name,
        step_times,
        eval_s,
    )
    if data is not None:
        metrics["accuracy"] = evaluate(weights, data, cfg.activation, cfg)
    if cfg.mixed:  # rank 0's scaler: every rank took the same skip decisions (precision.py)
        metrics["precision"] = {"name": cfg.precision, **strategy.optimizer.summary()}
    # The closed-form prediction beside the measurement: bytes and shard memory must agree exactly.
    from .costmodel import mismatches, predict_from_config

    hw = hardware.load(cfg.hardware)  # the profile of the prediction (and of the simulated clock)
    metrics["predicted"] = predict_from_config(cfg, world.size, steps=steps, hw=hw)
    if clock is not None:
        serial = dataclasses.replace(cfg, dp=1, tp=1, pp=1, zero=0, stage_layers=None)
        serial_step = predict_from_config(serial, 1, steps=1, hw=hw)["time"]["step_s"]
        per_rank = [g["sim"] for g in sorted(gathered, key=lambda g: g["rank"])]
        metrics["time"]["sim"] = sim_summary(per_rank, cfg, hw, metrics["predicted"], serial_step)
    metrics["prediction_mismatches"] = mismatches(metrics, metrics["predicted"])
    return RunResult(metrics, weights, [g["trace"] for g in gathered])


def _units(cfg):
    from .resmlp import build_units

    return build_units(cfg)


def _check_outputs(cfg: RunConfig, world: Communicator) -> None:
    """Fail before training, not after it, if rank 0 will not be able to write an output file."""
    problem = None
    if world.rank == 0:
        for flag, path in (
            ("--metrics-out", cfg.metrics_out),
            ("--weights-out", cfg.weights_out),
            ("--trace", cfg.trace),
        ):
            if path and not writable(path):
                problem = (
                    f"{flag} {path}: not a writable file path "
                    "(its folder is missing or read-only, or it is a folder)"
                )
                break
    problem = world.bcast_object(problem, root=0) if world.size > 1 else problem
    if problem:
        raise SimparError(problem)


def _tracer(cfg, world):
    if not cfg.trace:
        return None
    from .trace import Tracer

    return Tracer.install(world.rank)


def _raise_nonfinite(loss: float, step: int, strategy, world: Communicator) -> None:
    """All ranks see the same reduced loss, so all get here together; find who went bad first."""
    mine = strategy.first_nonfinite
    first = world.allreduce_scalar(mine if mine is not None else math.inf, op=_mpi_min())
    where = (
        f"the output of layer {int(first)} was the first to hold NaN/inf"
        if math.isfinite(first)
        else "no layer output was non-finite, so the loss itself overflowed"
    )
    raise SimparError(
        f"loss became {loss} at step {step + 1}: {where}; try a smaller --lr "
        f"(now {strategy.cfg.lr}) or --dtype float64"
    )


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
    local = hardware.load("local")
    profile = simclock.Profile(
        name=hw.name,
        flop_rate=hw.flop_rate(precision) * share,
        gamma=hw.gamma,
        layer_overhead=hw.layer_overhead,
        compute_share=share,
        links=links,
        measured_scale=local.flop_rate(precision) / hw.flop_rate(precision),
    )
    clock = simclock.install(simclock.SimClock(profile, measured=cfg.compute == "measured"))
    world.enable_headers()
    return clock


def _mpi_max():
    from mpi4py import MPI

    return MPI.MAX


def _mpi_min():
    from mpi4py import MPI

    return MPI.MIN


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
