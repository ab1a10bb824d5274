"""The sections of a run's configuration, each a dataclass whose fields carry their own option.

Every field is written once, here: its type (which the command line parses it as), its default, its
help text and the names it accepts. cli/options.py generates the `train` and `tour` parsers from these
fields, and core.RunConfig is the fields of all sections side by side, in section order, which is also
the order of `simpar train --help`: model, data, optimisation, layout, time, reliability, output,
checkpoints.

A field's metadata (all optional):
    help      the text of its option in --help (None: the flag says it all, and `note` says why it exists)
    choices   the names it accepts; the parser refuses others, unless check="validate" (then validate
              refuses them with its own message, which names the option's context)
    flag      the option, when it is not --field-name (overlap: --no-overlap, which clears it)
    train_only  not an option of `tour` (the tour chooses the layouts and writes no checkpoints)
    tour_help   appended to the help text in `tour --help`
    option    False: no command-line option (set by code, e.g. the tour); `note` says who sets it
"""

from __future__ import annotations

from dataclasses import dataclass, field

DATASETS = ("digits", "synthetic", "mnist", "text", "copy")  # text, copy: --arch gpt (run/textdata.py)
OPTIMIZERS = ("sgd", "adam")
DTYPES = ("float32", "float64")
ARCHS = ("mlp", "resmlp", "gpt")
PRECISIONS = ("fp32", "mixed-fp16", "mixed-bf16")  # fp32: everything in --dtype (model/precision.py)
ACTIVATIONS = ("relu", "tanh", "gelu")
SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved", "zb-h1", "zb-v")
RECOMPUTE = ("none", "full", "selective")
COLLECTIVES = ("ring", "rabenseifner", "tree", "ps", "mpi", "auto")  # auto: the ring, priced as NCCL picks
CP_ALGOS = ("ring", "ulysses")  # context parallelism's attention (parallel/context.py)
ALLTOALLS = ("pairwise", "bruck")  # expert parallelism's all-to-all (collectives/alltoall.py, bruck.py)
KERNELS = ("auto", "numpy", "numba", "cuda")
DATA_SOURCES = ("local", "root")
CLOCKS = ("wall", "sim")
COMPUTE_MODELS = ("model", "measured")


def option(default=None, *, factory=None, **meta):
    """A field with its command-line metadata (see the module docstring for the keys)."""
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class Model:
    """What is trained: the network, its number format, its experts and its seed."""

    layers: list[int] = option(
        factory=lambda: [64, 128, 128, 128, 10],
        help="widths, input first (default 64,128,128,128,10 for digits, 784,256,256,10 for mnist)",
        parse_default=None,  # the dataset decides (cli/options.py)
    )
    activation: str = option("relu", choices=ACTIVATIONS, note="the hidden layers' nonlinearity")
    arch: str = option(
        "mlp",
        choices=ARCHS,
        help="mlp, or resmlp: pre-LayerNorm residual blocks x + W2 act(W1 LN(x)) (dp, --zero, --tp or --pp), "
        "or gpt: a decoder-only transformer on --dataset text or copy (serial, dp, --zero)",
    )
    # --arch gpt (model/gpt.py): --n-layers is `blocks` (n_layers is the MLP's len(layers) - 1)
    blocks: int = option(2, flag="--n-layers", help="gpt: transformer blocks L")
    hidden: int = option(64, help="gpt: width h of the residual stream")
    heads: int = option(4, help="gpt: attention heads a (head size h/a)")
    seq_len: int = option(32, help="gpt: tokens per sequence s")
    vocab: int = option(256, help="gpt: vocabulary V (text: bytes, 256)")
    dtype: str = option("float32", choices=DTYPES, note="weights, activations and messages (fp32 precision)")
    # mixture of experts (model/moe.py): 0 experts = the plain MLP; --ep (layout) shards them
    experts: int = option(
        0,
        help="mixture of experts: E experts in every hidden-to-hidden layer (0: the plain MLP)",
        tour_help="; the tour then shows serial, dp and each dp x ep layout",
    )
    top_k: int = option(2, help="experts per token (gates renormalised)")
    capacity_factor: float = option(
        1.25, help="token slots per expert = ceil(C * K * rows / E); tokens beyond are dropped (counted)"
    )
    aux_loss_coef: float = option(0.01, help="Switch load-balancing loss weight alpha")
    precision: str = option(
        "fp32",
        choices=PRECISIONS,
        help="fp32: all in --dtype; mixed-fp16|mixed-bf16: half weights, activations, gradients and "
        "messages, float32 master weights and optimizer state, dynamic loss scaling (every layout: dp, "
        "--zero, --tp/--sp, --pp; --arch mlp --experts with mixed-bf16)",
    )
    loss_scale: float | None = option(
        None, help="mixed precision: the initial loss scale (default 65536 for fp16, 1 for bf16)"
    )
    seed: int = option(0, note="initial weights and the order of the batches")

    @property
    def n_layers(self) -> int:
        """The model's layers (units): --layers' count, or for --arch gpt its L blocks + embedding + head."""
        return self.blocks + 2 if self.arch == "gpt" else len(self.layers) - 1

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


@dataclass
class Data:
    """Where the rows come from, and who reads them."""

    dataset: str = option(
        "digits",
        choices=DATASETS,
        help="digits ships with simpar; text (shipped) and copy: --arch gpt (its default: text)",
    )
    samples: int = option(4096, help="synthetic: number of samples")
    data_dir: str | None = option(None, help="mnist: folder with the four IDX files")
    data_source: str = option(
        "local",
        choices=DATA_SOURCES,
        help="local: each rank reads its own rows (no traffic); "
        "root: rank 0 scatters every batch (data traffic)",
    )


@dataclass
class Optimisation:
    """How the weights move: the batch, how long, the optimizer."""

    batch: int = option(64, help="global batch size")  # all data-parallel ranks together
    steps: int | None = option(None, note="optimizer steps (default: --epochs, else one epoch)")
    epochs: int | None = option(None, note="passes over the training rows")
    lr: float = option(0.05, note="learning rate")
    momentum: float = option(0.9, note="SGD's momentum (Adam's beta1)")
    optimizer: str = option("sgd", choices=OPTIMIZERS, note="sgd (with momentum) or adam")
    grad_accum: int = option(1, help="micro-steps per optimizer step")


@dataclass
class Layout:
    """How the ranks share the work (dp x tp x pp, ZeRO, experts, the pipeline's schedule) and how
    they talk (buckets, overlap, the collective algorithms) and compute (the kernels)."""

    dp: int | None = option(
        None, help="data-parallel ranks (default: world / (cp*tp*pp))", train_only=True
    )  # None: whatever is left of the world after cp*tp*pp (validate fills it in)
    tp: int = option(1, help="tensor-parallel ranks", train_only=True)
    sp: bool = option(
        False,
        help="sequence parallelism (--arch resmlp, --tp > 1): LayerNorm and the residual on a 1/tp "
        "share of the rows; g a reduce-scatter, f an all-gather",
        train_only=True,
    )
    pp: int = option(1, help="pipeline stages", train_only=True)
    cp: int = option(
        1,
        help="context-parallel ranks (--arch gpt): the sequence split over them, 2 chunks each",
        train_only=True,
    )
    cp_algo: str = option(
        "ring",
        choices=CP_ALGOS,
        help="context parallelism's attention: ring (K/V blocks around the cp ring, online softmax) or "
        "ulysses (all-to-all from sequence shards to head shards and back)",
    )
    zero: int = option(0, help="ZeRO stage 0-3 (with data parallelism)", train_only=True)
    ep: int = option(1, help="expert-parallel ranks (inside --dp; with --experts)", train_only=True)
    stage_layers: list[int] | None = option(
        None, help="layers per pipeline stage, e.g. 2,1,1", train_only=True
    )
    alltoall: str = option(
        "pairwise",
        choices=ALLTOALLS,
        check="validate",  # validate's message says it needs --experts E --ep P
        help="expert parallelism's all-to-all: pairwise (P-1 messages) or bruck (log2 P messages, "
        "more bytes)",
        tour_help="; the tour's dp x ep layouts use it",
    )
    schedule: str = option("1f1b", choices=SCHEDULES, help="pipeline schedule")
    microbatches: int = option(4, note="micro-batches per step in the pipeline")
    virtual_stages: int = option(1, help="model chunks per rank (interleaved)")
    recompute: str = option("none", choices=RECOMPUTE, help="activation recomputation")
    bucket_mb: float = option(1.0, help="gradient bucket size in MiB")
    overlap: bool = option(True, flag="--no-overlap", help="all-reduce gradients only after backward")
    collectives: str = option("ring", choices=COLLECTIVES, help="all-reduce algorithm")
    kernels: str = option("auto", choices=KERNELS, help="compute kernels")


@dataclass
class Time:
    """Which clock times the run: this machine's, or the simulated cluster of runtime/simclock.py."""

    clock: str = option("wall", choices=CLOCKS, help="wall: this machine's clock; sim: a simulated cluster")
    hardware: str = option(
        "local",
        help="the profile of the cost model's prediction in the metrics and of --clock sim: local | "
        "dgx-h100 | h200 | dgx-a100 | ib-cluster | ethernet-100g | FILE.json",
    )
    compute: str = option(
        "model",
        choices=COMPUTE_MODELS,
        help="with --clock sim: model (FLOPs and bytes on the profile) or measured (CPU time, scaled)",
    )


@dataclass
class Reliability:
    """The watchdog (seconds; 0 = off), collective fingerprints, fault injection."""

    watchdog: float = option(
        120.0,
        help="end the job when one wait lasts longer than this many seconds; 0 turns it off (default 120)",
    )
    check_collectives: bool = option(
        False, help="before each collective, its group compares op, category, bytes and dtype"
    )
    inject: str | None = option(
        None, help="a fault, for teaching: kill|stall|nan|desync@rank=R,step=S (stall: ,seconds=T)"
    )


@dataclass
class Output:
    """What rank 0 writes when the run ends."""

    metrics_out: str | None = option(None, help="write the metrics JSON here (rank 0)")
    weights_out: str | None = option(None, help="write the final full-shape weights (.npz, rank 0)")
    trace: str | None = option(None, help="write a Chrome trace JSON (open in Perfetto)")
    quiet: bool = option(False, note="no progress bar, no summary")


@dataclass
class Checkpoints:
    """Where checkpoints go (run/checkpoint.py), how often (None: at the end only), what to resume from."""

    checkpoint_dir: str | None = option(
        None,
        help="write full-shape checkpoints here (rank 0): DIR/step-000040/, the newest 3 kept",
        train_only=True,
    )
    checkpoint_every: int | None = option(
        None, help="every N steps, and at the end (default: the end)", train_only=True
    )
    resume: str | None = option(
        None,
        help="continue from a checkpoint folder, in any layout; auto: the newest complete one in "
        "--checkpoint-dir (none yet: start fresh)",
        train_only=True,
    )
    eval_every_epoch: bool = option(
        True, option=False, note="code that needs only the final accuracy turns it off (no option)"
    )


# The sections in the order of `simpar train --help`; RunConfig's fields are theirs, in this order.
SECTIONS = {
    "model": Model,
    "data": Data,
    "optimisation": Optimisation,
    "layout": Layout,
    "time": Time,
    "reliability": Reliability,
    "output": Output,
    "checkpoints": Checkpoints,
}


@dataclass(frozen=True)
class StrategySections:
    """What a parallel strategy (parallel/) is built from: the sections it reads, and no other.

    model         the units, their widths, dtype and precision, the seed of the initial weights
    layout        the groups' sizes, ZeRO's stage, the schedule, buckets and overlap, the algorithms
    optimisation  the optimizer each strategy builds for the parameters it owns (sgd or adam, lr,
                  momentum) and the micro-steps (--grad-accum, --batch: the experts' capacity per
                  micro-step, the pipeline's micro-steps)
    Not data, time, reliability, output or checkpoints: the run (run/) reads those, around the strategy.
    """

    model: Model
    layout: Layout
    optimisation: Optimisation

    @classmethod
    def of(cls, cfg) -> StrategySections:
        return cls(cfg.model, cfg.layout, cfg.optimisation)
