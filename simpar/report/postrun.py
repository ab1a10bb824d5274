"""After the last step (rank 0): the metrics of a run and the cost model's prediction beside them.

run/loop.py trains and gathers what every rank measured; this file turns it into the metrics document
(report/metrics.py builds the measured part): the accuracy, the experts' routing and the mixed-precision
scaler's summaries, the closed-form prediction (costmodel/) for the same layout, what the same model
would take on one rank (under --clock sim: the speed-up), and the list of places where measurement
and prediction disagree (bytes and shard memory must agree exactly).
"""

from __future__ import annotations

import dataclasses

from ..costmodel import hardware, mismatches, predict_from_config
from ..model.mlp import parameter_count
from .metrics import build_metrics, sim_summary


@dataclasses.dataclass
class Measured:
    """What the training loop recorded on rank 0: per-step losses and times, the epoch log, the wall
    clock of the loop (and of the evaluations in it), the checkpoints it saved and how long that took."""

    losses: list = dataclasses.field(default_factory=list)
    epoch_log: list = dataclasses.field(default_factory=list)
    step_times: list = dataclasses.field(default_factory=list)
    elapsed: float = 0.0
    eval_s: float = 0.0
    saved: list = dataclasses.field(default_factory=list)
    save_s: float = 0.0


def run_metrics(
    cfg,
    world_size: int,
    mesh,
    strategy,
    gathered: list,
    measured: Measured,
    *,
    kernels_name: str,
    steps: int,
    first: int,
    accuracy: float | None,
    resumed_from: str | None,
    simulated: bool,
) -> dict:
    """The metrics document of a finished run. `steps` is the run's last step, `first` the step it
    started from (resumed: the checkpoint's), so this run did steps - first of them; `gathered` is
    every rank's ledger, memory, trace and simulated steps."""
    done = steps - first
    metrics = build_metrics(
        cfg,
        world_size,
        mesh,
        param_count(cfg),
        measured.losses,
        measured.epoch_log,
        gathered,
        measured.elapsed,
        done,
        kernels_name,
        measured.step_times,
        measured.eval_s,
    )
    if accuracy is not None:
        metrics["accuracy"] = accuracy
    if cfg.experts:  # routing per step: tokens per expert, drops, kept rows per (dp rank, expert)
        metrics["moe"] = strategy.routing_summary()
    if cfg.mixed:  # rank 0's scaler: every rank took the same skip decisions (model/precision.py)
        metrics["precision"] = {"name": cfg.precision, **strategy.optimizer.summary()}
    hw = hardware.load(cfg.hardware)  # the profile of the prediction (and of the simulated clock)
    # The backend that ran (auto resolved; "numba+float16" under mixed precision is numba's float32
    # work): its memory passes are what the clock charged (costmodel/passes.py).
    cfg = dataclasses.replace(cfg, kernels=kernels_name.split("+")[0])
    add_prediction(metrics, cfg, world_size, done, hw)
    metrics["checkpoint"] = {
        "dir": cfg.checkpoint_dir,
        "every": cfg.checkpoint_every,
        "saved": measured.saved,
        "save_s": measured.save_s,
        "resumed_from": resumed_from,
        "start_step": first,
    }
    if simulated:
        per_rank = [g["sim"] for g in sorted(gathered, key=lambda g: g["rank"])]
        serial = serial_prediction(cfg, hw)
        metrics["time"]["sim"] = sim_summary(per_rank, cfg, hw, metrics["predicted"], serial)
    metrics["prediction_mismatches"] = mismatches(metrics, metrics["predicted"])
    return metrics


def add_prediction(metrics: dict, cfg, world_size: int, steps: int, hw) -> None:
    """The closed-form prediction beside the measurement; with experts, also the all-to-all that
    perfectly balanced routing would move beside the one the routing measured."""
    routing = metrics.get("moe")
    metrics["predicted"] = predict_from_config(cfg, world_size, steps=steps, hw=hw, routing=routing)
    if cfg.experts:
        balanced = predict_from_config(cfg, world_size, steps=1, hw=hw)["comm"]["per_step"]["activation"]
        metrics["moe"]["activation_per_step"] = {
            "measured": metrics["comm"]["per_step"]["activation"],
            "balanced": balanced,
        }


def serial_prediction(cfg, hw) -> float:
    """The predicted step time of the same model and batch on one rank: the baseline of the speed-up."""
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
    return predict_from_config(serial, 1, steps=1, hw=hw)["time"]["step_s"]


def param_count(cfg) -> int:
    """Parameters of the whole model (every expert, every block), as the metrics report them."""
    if cfg.experts and cfg.arch != "gpt":  # gpt: gpt_param_count counts every block's E experts
        from ..model.moe import moe_param_count

        return sum(moe_param_count(cfg.layers, cfg.experts))
    if cfg.arch == "mlp":
        return parameter_count(cfg.layers)
    if cfg.arch == "gpt":
        from ..model.gpt_build import gpt_param_count

        return gpt_param_count(cfg.model)
    from ..model.resmlp import build_units

    return sum(u.size for u in build_units(cfg))
