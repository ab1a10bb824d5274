"""The pipeline's option rules (--pp, --microbatches, --schedule, --virtual-stages, --stage-layers,
--recompute) and the schedule shapes the rest of simpar asks about: how many model chunks a schedule
cuts (model_chunks) and which stage holds the loss (loss_stage).

config.validate calls pipeline_rules, once the data-parallel size is known; `simpar plan
--show-schedule` asks schedule_problem directly. Whether a schedule's steps can deadlock is
parallel/schedule_check.py's job, run before training starts.
"""

from __future__ import annotations

from ..errors import require


def pipeline_rules(cfg) -> None:
    """The rules of a RunConfig's pipeline (cfg.dp already filled in): enough layers and rows for the
    stages and micro-batches, --recompute only with stages, the schedule's shape, --stage-layers."""
    if cfg.pp > 1:
        require(
            cfg.pp <= cfg.n_layers,
            f"--pp {cfg.pp} asks for more pipeline stages than the model has layers ({cfg.n_layers})",
        )
        need = cfg.microbatches * cfg.dp * cfg.grad_accum
        require(
            cfg.batch >= need,
            f"--batch {cfg.batch} is too small for {cfg.microbatches} micro-batches on {cfg.dp} "
            f"data-parallel rank(s) x {cfg.grad_accum} accumulation step(s): "
            f"every micro-batch needs a row (>= {need})",
        )
    require(
        cfg.recompute == "none" or cfg.pp > 1,
        f"--recompute {cfg.recompute} recomputes pipeline stages' activations: use it with --pp > 1",
    )
    problem = schedule_problem(cfg.schedule, cfg.pp, cfg.microbatches, cfg.virtual_stages, cfg.n_layers)
    require(problem is None, problem or "")
    chunks = model_chunks(cfg.schedule, cfg.pp, cfg.virtual_stages)
    if cfg.stage_layers is not None:
        require(
            len(cfg.stage_layers) == chunks
            and all(n >= 1 for n in cfg.stage_layers)
            and sum(cfg.stage_layers) == cfg.n_layers,
            f"--stage-layers {cfg.stage_layers} must give {chunks} positive counts summing to {cfg.n_layers}",
        )


def schedule_problem(schedule: str, S: int, M: int, V: int, n_layers: int | None = None) -> str | None:
    """What is wrong with this schedule's shape, in one line, or None (the rules of schedules.py;
    whether its steps can deadlock is schedule_check's job, run before training starts)."""
    if V < 1:
        return f"--virtual-stages must be at least 1, got {V}"
    if V > 1 and schedule != "interleaved":
        return (
            f"--virtual-stages {V} needs --schedule interleaved (the other schedules hold one chunk per rank)"
        )
    if schedule == "interleaved" and S > 1:
        if V < 2:
            return "--schedule interleaved needs --virtual-stages V >= 2 model chunks per rank"
        if M % S:
            return (
                f"--schedule interleaved needs --microbatches divisible by --pp: {M} micro-batches go round "
                f"{S} stages in groups of {S} (try {M + S - M % S})"
            )
        if n_layers is not None and S * V > n_layers:
            return (
                f"--pp {S} x --virtual-stages {V} = {S * V} model chunks, but the model has {n_layers} layers"
            )
    if schedule == "zb-v" and S > 1 and n_layers is not None and 2 * S > n_layers:
        return (
            f"--schedule zb-v cuts the model into 2 x --pp {S} = {2 * S} chunks (two per rank, in a V), "
            f"but the model has {n_layers} layers"
        )
    return None


def model_chunks(schedule: str, S: int, V: int = 1) -> int:
    """How many chunks the pipeline cuts the model into: S*V interleaved, 2S for zb-v, else S."""
    return S * {"interleaved": V, "zb-v": 2}.get(schedule, 1)


def loss_stage(schedule: str, S: int) -> int:
    """The pipeline stage that holds the last chunk (the loss, so the labels): S-1, or 0 for zb-v,
    whose V brings the micro-batch back up to rank 0."""
    return 0 if schedule == "zb-v" else S - 1
