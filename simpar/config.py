"""RunConfig: everything a training run needs, and `validate`, every rule a layout must obey.

`validate` runs on every rank before any MPI traffic, on the same inputs, so every rank reaches the
same verdict: a bad configuration ends the whole job with one clear line instead of a hang.

validate is the one entry point. The general rules are here; two cohesive groups have a file of their
own, called from validate in their turn: config_pipeline.py (--pp, --schedule, --virtual-stages,
--stage-layers, --recompute; the schedule shapes model_chunks and loss_stage) and config_moe.py
(--experts, --top-k, --capacity-factor, --aux-loss-coef, --ep). SimparError lives in errors.py, so that
all three can raise it; import it from here.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from .config_moe import moe_rules
from .config_pipeline import pipeline_rules
from .errors import SimparError
from .errors import require as _require  # validate's many one-line rules

MIN_WATCHDOG_S = 1.0  # a smaller --watchdog fires on healthy steps (or the first Numba call)

DATASETS = ("digits", "synthetic", "mnist")
OPTIMIZERS = ("sgd", "adam")
DTYPES = ("float32", "float64")
ARCHS = ("mlp", "resmlp")
PRECISIONS = ("fp32", "mixed-fp16", "mixed-bf16")  # fp32: everything in --dtype (simpar/precision.py)
ACTIVATIONS = ("relu", "tanh", "gelu")
SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved", "zb-h1", "zb-v")
RECOMPUTE = ("none", "full", "selective")
COLLECTIVES = ("ring", "rabenseifner", "tree", "ps", "mpi")
ALLTOALLS = ("pairwise", "bruck")  # expert parallelism's all-to-all (collectives/alltoall.py, bruck.py)
KERNELS = ("auto", "numpy", "numba", "cuda")
DATA_SOURCES = ("local", "root")
CLOCKS = ("wall", "sim")
COMPUTE_MODELS = ("model", "measured")


@dataclass
class RunConfig:
    # model
    layers: list[int] = field(default_factory=lambda: [64, 128, 128, 128, 10])
    activation: str = "relu"
    arch: str = "mlp"  # resmlp: pre-LayerNorm residual blocks between two projections (resmlp.py)
    dtype: str = "float32"
    precision: str = "fp32"  # mixed-fp16 | mixed-bf16: half weights/activations/grads, fp32 master
    loss_scale: float | None = None  # mixed: the initial dynamic loss scale (None: the format's default)
    seed: int = 0
    # mixture of experts (moe.py): 0 experts = the plain MLP; --ep shards the experts (parallel/expert.py)
    experts: int = 0
    top_k: int = 2
    capacity_factor: float = 1.25
    aux_loss_coef: float = 0.01
    ep: int = 1
    # data
    dataset: str = "digits"
    samples: int = 4096  # synthetic only
    data_dir: str | None = None  # mnist only
    data_source: str = "local"  # local: every rank reads its own rows; root: rank 0 scatters them
    # optimisation
    batch: int = 64  # GLOBAL batch (all data-parallel ranks together)
    steps: int | None = None
    epochs: int | None = None
    lr: float = 0.05
    momentum: float = 0.9
    optimizer: str = "sgd"
    grad_accum: int = 1
    # layout
    dp: int | None = None  # None: whatever is left of the world after tp*pp
    tp: int = 1
    sp: bool = False  # sequence parallelism: resmlp's rows split over the tp group (parallel/restensor.py)
    pp: int = 1
    zero: int = 0
    schedule: str = "1f1b"
    microbatches: int = 4
    virtual_stages: int = 1  # model chunks per rank (--schedule interleaved)
    recompute: str = "none"  # activation recomputation: none | full | selective
    stage_layers: list[int] | None = None
    bucket_mb: float = 1.0
    overlap: bool = True
    collectives: str = "ring"
    alltoall: str = "pairwise"  # --alltoall: expert parallelism's all-to-all algorithm
    kernels: str = "auto"
    # time: the wall clock, or the simulated clock of simclock.py on a hardware profile
    clock: str = "wall"
    hardware: str = "local"
    compute: str = "model"
    # reliability: the watchdog (seconds; 0 = off), collective fingerprints, fault injection
    watchdog: float = 120.0
    check_collectives: bool = False
    inject: str | None = None
    # output
    metrics_out: str | None = None
    weights_out: str | None = None
    trace: str | None = None
    quiet: bool = False
    # checkpoints (checkpoint.py): where, how often (None: at the end only), and what to resume from
    checkpoint_dir: str | None = None
    checkpoint_every: int | None = None
    resume: str | None = None  # a checkpoint folder, or "auto": the newest in checkpoint_dir
    eval_every_epoch: bool = True

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def n_layers(self) -> int:
        return len(self.layers) - 1

    @property
    def mixed(self) -> bool:
        return self.precision != "fp32"

    def compute_dtype(self):
        """The dtype of weights, activations, gradients and messages: --dtype, or with mixed precision
        float16 / bfloat16 (ml_dtypes; imported only when asked for)."""
        import numpy as np

        if self.precision == "mixed-bf16":
            import ml_dtypes

            return np.dtype(ml_dtypes.bfloat16)
        return np.dtype(np.float16 if self.precision == "mixed-fp16" else self.dtype)


def validate(cfg: RunConfig, world_size: int) -> RunConfig:
    """Check every rule; fill in dp from the world size. Raises SimparError naming the first problem."""
    _require(len(cfg.layers) >= 2, "--layers needs at least an input and an output width, e.g. 64,128,10")
    _require(all(w >= 1 for w in cfg.layers), f"--layers widths must be positive, got {cfg.layers}")
    _require(cfg.dataset in DATASETS, f"unknown dataset {cfg.dataset!r} (choose from {', '.join(DATASETS)})")
    _require(
        cfg.optimizer in OPTIMIZERS,
        f"unknown optimizer {cfg.optimizer!r} (choose from {', '.join(OPTIMIZERS)})",
    )
    _require(cfg.dtype in DTYPES, f"unknown dtype {cfg.dtype!r} (choose from {', '.join(DTYPES)})")
    _require(
        cfg.precision in PRECISIONS,
        f"unknown precision {cfg.precision!r} (choose from {', '.join(PRECISIONS)})",
    )
    _require(cfg.arch in ARCHS, f"unknown arch {cfg.arch!r} (choose from {', '.join(ARCHS)})")
    if cfg.arch == "resmlp":
        hidden = cfg.layers[1:-1]
        _require(
            len(hidden) >= 1 and len(set(hidden)) == 1,
            f"--arch resmlp needs equal hidden widths (the residual stream), e.g. 64,128,128,128,10; got "
            f"{cfg.layers}",
        )
    if cfg.mixed:
        # The master weights and optimizer state are float32 (ZeRO paper sec. 3.1). Ranks holding
        # different gradients (ZeRO shards, pipeline stages, tp shards) vote on skipping a step.
        _require(
            cfg.dtype == "float32", f"--precision {cfg.precision} keeps float32 master weights; drop --dtype"
        )
        _require(
            not (cfg.precision == "mixed-bf16" and cfg.collectives == "mpi"),
            "--collectives mpi cannot sum bfloat16 (MPI has no such type); use ring, tree, ...",
        )
        _require(
            cfg.loss_scale is None or (cfg.loss_scale > 0 and math.isfinite(cfg.loss_scale)),
            f"--loss-scale must be a positive number, got {cfg.loss_scale}",
        )
    _require(
        cfg.mixed or cfg.loss_scale is None,
        "--loss-scale sets mixed precision's loss scaler: add --precision mixed-fp16 or mixed-bf16",
    )
    _require(cfg.activation in ACTIVATIONS, f"unknown activation {cfg.activation!r}")
    _require(
        cfg.schedule in SCHEDULES, f"unknown schedule {cfg.schedule!r} (choose from {', '.join(SCHEDULES)})"
    )
    _require(
        cfg.recompute in RECOMPUTE,
        f"unknown recompute {cfg.recompute!r} (choose from {', '.join(RECOMPUTE)})",
    )
    _require(cfg.collectives in COLLECTIVES, f"unknown collectives {cfg.collectives!r}")
    _require(
        cfg.alltoall in ALLTOALLS, f"unknown alltoall {cfg.alltoall!r} (choose from {', '.join(ALLTOALLS)})"
    )
    _require(
        cfg.alltoall == "pairwise" or cfg.ep > 1,
        f"--alltoall {cfg.alltoall} picks expert parallelism's all-to-all: add --experts E --ep P (P >= 2)",
    )
    _require(cfg.kernels in KERNELS, f"unknown kernels {cfg.kernels!r} (choose from {', '.join(KERNELS)})")
    _require(cfg.data_source in DATA_SOURCES, f"unknown data source {cfg.data_source!r}")
    _require(cfg.clock in CLOCKS, f"unknown clock {cfg.clock!r} (choose from {', '.join(CLOCKS)})")
    _require(
        cfg.compute in COMPUTE_MODELS, f"unknown compute model {cfg.compute!r} (choose model or measured)"
    )
    _require(cfg.watchdog >= 0 and math.isfinite(cfg.watchdog), "--watchdog must be a number of seconds >= 0")
    _require(  # a tinier limit fires on a healthy step: an error on a run that was fine
        cfg.watchdog == 0 or cfg.watchdog >= MIN_WATCHDOG_S,
        f"--watchdog {cfg.watchdog:g}: give at least {MIN_WATCHDOG_S:g} s, or 0 to turn it off",
    )
    if cfg.inject:
        _require(parse_inject(cfg.inject)["rank"] < world_size, f"--inject {cfg.inject}: no such rank")
        _require(  # a fault that never happens would teach nothing, silently
            cfg.steps is None or parse_inject(cfg.inject)["step"] <= cfg.steps,
            f"--inject {cfg.inject}: step {parse_inject(cfg.inject)['step']} is past --steps {cfg.steps}",
        )
    _require(cfg.batch >= 1, f"--batch must be at least 1, got {cfg.batch}")
    _require(cfg.lr > 0 and math.isfinite(cfg.lr), f"--lr must be a positive number, got {cfg.lr}")
    _require(0 <= cfg.momentum < 1, f"--momentum must be in [0, 1), got {cfg.momentum}")
    _require(cfg.seed >= 0, f"--seed must be a non-negative integer, got {cfg.seed}")
    _require(cfg.grad_accum >= 1, "--grad-accum must be at least 1")
    _require(cfg.steps is None or cfg.steps >= 1, "--steps must be at least 1")
    _require(cfg.epochs is None or cfg.epochs >= 1, "--epochs must be at least 1")
    _require(cfg.samples >= 2, "--samples must be at least 2")
    _require(cfg.zero in (0, 1, 2, 3), f"--zero must be 0, 1, 2 or 3, got {cfg.zero}")
    _require(cfg.microbatches >= 1, "--microbatches must be at least 1")
    _require(cfg.bucket_mb > 0, "--bucket-mb must be positive")
    _require(cfg.tp >= 1 and cfg.pp >= 1, "--tp and --pp must be at least 1")
    _require(
        cfg.checkpoint_every is None or cfg.checkpoint_every >= 1, "--checkpoint-every must be at least 1"
    )
    _require(
        cfg.checkpoint_every is None or cfg.checkpoint_dir,
        "--checkpoint-every needs --checkpoint-dir DIR (where to write them)",
    )
    _require(
        cfg.resume != "auto" or cfg.checkpoint_dir, "--resume auto needs --checkpoint-dir DIR (where to look)"
    )
    if cfg.dataset == "mnist":
        _require(cfg.data_dir is not None, "--dataset mnist needs --data-dir DIR with the four IDX files")

    model_ranks = cfg.tp * cfg.pp
    if cfg.dp is None:
        _require(
            world_size % model_ranks == 0,
            f"world size {world_size} is not divisible by tp*pp = {cfg.tp}*{cfg.pp} = {model_ranks}",
        )
        cfg.dp = world_size // model_ranks
    _require(cfg.dp >= 1, "--dp must be at least 1")
    _require(
        cfg.dp * model_ranks == world_size,
        f"world size {world_size} does not factor into dp*tp*pp = {cfg.dp}*{cfg.tp}*{cfg.pp} = "
        f"{cfg.dp * model_ranks}; launch with mpiexec -n {cfg.dp * model_ranks} or change the layout",
    )
    _require(
        cfg.batch >= cfg.dp * cfg.grad_accum,
        f"--batch {cfg.batch} is smaller than dp*grad-accum = {cfg.dp * cfg.grad_accum}: "
        "some rank would get no rows",
    )
    if cfg.tp > 1:
        hidden = cfg.layers[1:-1]
        bad = [w for w in hidden if w % cfg.tp]
        _require(not bad, f"hidden widths {bad} are not divisible by --tp {cfg.tp}")
    if cfg.sp:
        _require(
            cfg.arch == "resmlp" and cfg.tp > 1,
            "--sp splits the rows of resmlp's residual stream over the tp group: use it with "
            "--arch resmlp and --tp > 1",
        )
        rows = cfg.dp * cfg.grad_accum * cfg.tp
        _require(
            cfg.batch % rows == 0,
            f"--sp splits every micro-step's rows evenly over --tp {cfg.tp}: --batch {cfg.batch} must be a "
            f"multiple of dp*grad-accum*tp = {rows}",
        )
        # Under --pp the row shards are cut per micro-batch (np.array_split parts differ by at most
        # one row, so they all divide by tp >= 2 only when they are all equal).
        rows *= cfg.microbatches
        _require(
            cfg.pp == 1 or cfg.batch % rows == 0,
            f"--sp with --pp splits every micro-batch's rows evenly over --tp {cfg.tp}: --batch {cfg.batch} "
            f"must be a multiple of dp*grad-accum*microbatches*tp = {rows}",
        )
    pipeline_rules(cfg)
    moe_rules(cfg, RunConfig())
    if cfg.zero:
        _require(cfg.tp == 1 and cfg.pp == 1, "--zero shards data parallelism; combine it with --dp only")
        _require(
            cfg.collectives == "ring",
            f"--zero uses ring reduce-scatter and all-gather; --collectives {cfg.collectives} applies to "
            "all-reduce layouts only",
        )
    return cfg


INJECTIONS = {
    "kill": ("rank", "step"),
    "stall": ("rank", "step", "seconds"),
    "nan": ("rank", "step"),
    "desync": ("rank", "step"),
}


def parse_inject(text: str) -> dict:
    """'stall@rank=1,step=3,seconds=20' -> {"kind": "stall", "rank": 1, "step": 3, "seconds": 20.0}."""
    kind, _, rest = (text or "").partition("@")
    usage = (
        "--inject KIND@rank=R,step=S with KIND kill, stall (add ,seconds=T), nan or desync, "
        f"e.g. stall@rank=1,step=3,seconds=20; got {text!r}"
    )
    _require(kind in INJECTIONS, usage)
    fields = {}
    for part in filter(None, rest.split(",")):
        key, _, value = part.partition("=")
        _require(key in INJECTIONS[kind] and value, usage)
        try:
            fields[key] = float(value) if key == "seconds" else int(value)
        except ValueError:
            raise SimparError(usage) from None
    _require(set(fields) == set(INJECTIONS[kind]), usage)
    _require(fields["step"] >= 1 and fields["rank"] >= 0, usage)
    seconds = fields.get("seconds", 0.0)
    _require(math.isfinite(seconds) and seconds >= 0, f"--inject {text}: seconds must be a number >= 0")
    return {"kind": kind, **fields}


def layout_name(layout) -> str:
    """dp4, dp2xzero1, tp2, tp2-sp, pp2-1f1b, dp2xtp2, ... ("serial" for one rank). `layout` is anything with
    dp, tp, pp, zero and schedule attributes: a RunConfig or the cost model's Spec."""
    parts = [f"dp{layout.dp}"] if layout.dp and layout.dp > 1 else []
    parts += [f"zero{layout.zero}"] if layout.zero else []
    parts += [f"ep{layout.ep}"] if getattr(layout, "ep", 1) > 1 else []
    parts += [f"tp{layout.tp}" + ("-sp" if getattr(layout, "sp", False) else "")] if layout.tp > 1 else []
    parts += [f"pp{layout.pp}-{layout.schedule}"] if layout.pp > 1 else []
    return "x".join(parts) or "serial"
