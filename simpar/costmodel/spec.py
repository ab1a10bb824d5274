"""The question the cost model answers, and how simpar cuts it up.

A Spec is a model (its widths), a global batch and a layout: a RunConfig without the I/O; `check`
holds it to the rules `simpar train` enforces. The rest writes down, as closed forms of its
own, the rules by which simpar divides the work -- tensor-parallel column/row kinds and shard sizes,
gradient buckets, micro-batch rows, a rank's (pp, dp, tp) coordinates; the pipeline stages in
stages.py -- so that the
per-rank formulas (rank.py) can be held to what runs. It imports none of the code that moves bytes or
schedules work: if that code changes its rules, the prediction and the ledger disagree and
`prediction_mismatches` says so (tests/mpi/costmodel/test_costmodel.py mutates the execution code to
prove it).
Shape bundles the facts all ranks share.

Precisions (bytes per parameter): fp64 and fp32 store everything in that type; `mixed` is the ZeRO
paper's mixed-precision Adam (sec. 3.1): 2-byte params and grads, and K = 12 bytes of optimizer state
(fp32 master weights, momentum and variance). Communication moves params/grads in their own type.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import SimparError
from .collectives import chunk
from .order import stage_chunks
from .resblocks import local_unit_sizes, unit_kinds
from .stages import stage_bounds

# -- precisions ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Precision:
    name: str
    param: int  # bytes per parameter (also what parameters are communicated in)
    grad: int  # bytes per gradient element (also what gradients are communicated in)
    act: int  # bytes per activation element
    optimizer: dict  # (optimizer, has momentum) -> bytes of optimizer state per parameter


PRECISIONS = {
    "fp64": Precision(
        "fp64", 8, 8, 8, {("sgd", True): 8, ("sgd", False): 0, ("adam", True): 16, ("adam", False): 16}
    ),
    "fp32": Precision(
        "fp32", 4, 4, 4, {("sgd", True): 4, ("sgd", False): 0, ("adam", True): 8, ("adam", False): 8}
    ),
    # ZeRO paper sec. 3.1: fp16 params + grads (2 + 2 bytes), fp32 copy of params, momentum and
    # variance (K = 12). SGD keeps the fp32 master (4) and, with momentum, a velocity (4).
    "mixed": Precision(
        "mixed", 2, 2, 2, {("sgd", True): 8, ("sgd", False): 4, ("adam", True): 12, ("adam", False): 12}
    ),
}
DTYPE_PRECISION = {"float64": "fp64", "float32": "fp32"}


def precision_of(cfg) -> str:
    """The Precision of a RunConfig: --precision mixed-fp16 and mixed-bf16 are both `mixed` (2-byte
    halves, float32 master and state); otherwise the --dtype's."""
    if getattr(cfg, "precision", "fp32") != "fp32":
        return "mixed"
    return DTYPE_PRECISION[cfg.dtype]


# -- the question ---------------------------------------------------------------------------------------


@dataclass
class Spec:
    """A model, a batch and a layout: everything the formulas need (a RunConfig without the I/O)."""

    widths: list
    batch: int
    dp: int = 1
    tp: int = 1
    pp: int = 1
    zero: int = 0
    schedule: str = "1f1b"
    microbatches: int = 4
    virtual_stages: int = 1
    recompute: str = "none"
    grad_accum: int = 1
    collectives: str = "ring"
    bucket_mb: float = 1.0
    overlap: bool = True
    data_source: str = "local"
    stage_layers: list | None = None
    precision: str = "fp32"
    optimizer: str = "sgd"
    momentum: float = 0.9
    activation: str = "relu"
    arch: str = "mlp"
    sp: bool = False  # sequence parallelism (resmlp under --tp): costmodel/resblocks.py
    experts: int = 0  # mixture of experts (costmodel/moe.py): 0 = none
    top_k: int = 2
    capacity_factor: float = 1.25
    ep: int = 1
    alltoall: str = "pairwise"  # expert parallelism's all-to-all: pairwise | bruck (collectives.ALLTOALL)
    kernels: str = "auto"  # --kernels: which backward writes the gradients how (work.first_grads)

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def n_layers(self) -> int:
        return len(self.widths) - 1

    @property
    def prec(self) -> Precision:
        return PRECISIONS[self.precision]

    @property
    def microbatches_used(self) -> int:
        return self.microbatches if self.pp > 1 else 1

    @classmethod
    def from_config(cls, cfg, world_size: int | None = None) -> "Spec":
        dp = cfg.dp if cfg.dp is not None else (world_size or 1) // (cfg.tp * cfg.pp)
        return cls(
            widths=list(cfg.layers),
            batch=cfg.batch,
            dp=dp,
            tp=cfg.tp,
            pp=cfg.pp,
            zero=cfg.zero,
            schedule=cfg.schedule,
            microbatches=cfg.microbatches,
            virtual_stages=cfg.virtual_stages,
            recompute=cfg.recompute,
            grad_accum=cfg.grad_accum,
            collectives=cfg.collectives,
            bucket_mb=cfg.bucket_mb,
            overlap=cfg.overlap,
            data_source=cfg.data_source,
            stage_layers=cfg.stage_layers,
            precision=precision_of(cfg),
            optimizer=cfg.optimizer,
            momentum=cfg.momentum,
            activation=cfg.activation,
            arch=getattr(cfg, "arch", "mlp"),
            sp=getattr(cfg, "sp", False),
            experts=getattr(cfg, "experts", 0),
            top_k=getattr(cfg, "top_k", 2),
            capacity_factor=getattr(cfg, "capacity_factor", 1.25),
            ep=getattr(cfg, "ep", 1),
            alltoall=getattr(cfg, "alltoall", "pairwise"),
            kernels=getattr(cfg, "kernels", "auto"),
        )


def check(spec: Spec) -> Spec:
    """Every rule `simpar train` enforces (config.validate, same messages), plus a known precision."""
    from ..config import RunConfig, validate

    if spec.precision not in PRECISIONS:
        raise SimparError(f"unknown precision {spec.precision!r} (choose from {', '.join(PRECISIONS)})")
    if min(spec.dp, spec.tp, spec.pp) < 1:
        raise SimparError("--dp, --tp and --pp must be at least 1")
    cfg = RunConfig(
        layers=list(spec.widths),
        dataset="synthetic",
        batch=spec.batch,
        optimizer=spec.optimizer,
        grad_accum=spec.grad_accum,
        dp=spec.dp,
        tp=spec.tp,
        pp=spec.pp,
        zero=spec.zero,
        schedule=spec.schedule,
        microbatches=spec.microbatches,
        virtual_stages=spec.virtual_stages,
        recompute=spec.recompute,
        stage_layers=spec.stage_layers,
        bucket_mb=spec.bucket_mb,
        collectives=spec.collectives,
        data_source=spec.data_source,
        activation=spec.activation,
        arch=spec.arch,
        sp=spec.sp,
        experts=spec.experts,
        top_k=spec.top_k,
        capacity_factor=spec.capacity_factor,
        ep=spec.ep,
        alltoall=spec.alltoall,
    )
    validate(cfg, spec.world)
    return spec


# -- how the implementation cuts things up ------------------------------------------------------------


def split(n: int, parts: int) -> list[int]:
    """Sizes of np.array_split(range(n), parts)."""
    return [chunk(n, parts, i) for i in range(parts)]


def micro_rows(spec: Spec, dp_index: int) -> list[list[int]]:
    """Rows of each pipeline micro-batch of each grad-accum micro-step on data-parallel rank dp_index
    (data.micro_steps -> data.distributed_sampler -> np.array_split into M; M = 1 without a pipeline)."""
    return [
        split(chunk(k_rows, spec.dp, dp_index), spec.microbatches_used)
        for k_rows in split(spec.batch, spec.grad_accum)
    ]


def tp_kinds(n_stage_layers: int, tp: int) -> list[str]:
    """Megatron pairs inside a stage: column, row, column, row, ...; an odd last layer replicated."""
    if tp == 1:
        return ["full"] * n_stage_layers
    kinds = ["column" if i % 2 == 0 else "row" for i in range(n_stage_layers)]
    if n_stage_layers % 2:
        kinds[-1] = "replicated"
    return kinds


def local_layer_size(fan_in: int, fan_out: int, kind: str, tp: int) -> int:
    """Parameters of one layer on one tp rank: column W[:, cols] + b[cols]; row W[rows, :] + whole b."""
    if kind == "column":
        return fan_in * (fan_out // tp) + fan_out // tp
    if kind == "row":
        return (fan_in // tp) * fan_out + fan_out
    return fan_in * fan_out + fan_out


def dp_bucket_layers(layer_sizes: list[int], elem_bytes: int, bucket_mb: float) -> list[list[int]]:
    """DDP gradient buckets: from the LAST layer back, close a bucket once it reaches bucket_mb MiB.
    Each bucket as the positions of its layers (last layer first)."""
    buckets, current, size = [], [], 0
    limit = bucket_mb * 2**20
    for i in reversed(range(len(layer_sizes))):
        current.append(i)
        size += layer_sizes[i]
        if size * elem_bytes >= limit:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


def dp_buckets(layer_sizes: list[int], elem_bytes: int, bucket_mb: float) -> list[int]:
    """Elements in each DDP gradient bucket (see dp_bucket_layers)."""
    return [sum(layer_sizes[i] for i in b) for b in dp_bucket_layers(layer_sizes, elem_bytes, bucket_mb)]


def layer_flops(rows: int, fan_in: int, fan_out: int, first: bool) -> tuple[int, int]:
    """(forward, backward) matmul FLOPs of one layer: x@W is 2*rows*in*out; backward needs dW = x^T dz
    and, except for layer 0, dx = dz W^T. Biases and activations are O(rows*out): left out."""
    f = 2 * rows * fan_in * fan_out
    return f, f if first else 2 * f


def coords_of(rank: int, spec: Spec) -> tuple[int, int, int]:
    """(pp, dp, tp) index of a world rank: tp fastest, then dp, then pp (docs/strategies.md, "Hybrids")."""
    return rank // (spec.tp * spec.dp), (rank // spec.tp) % spec.dp, rank % spec.tp


@dataclass
class Shape:
    """Per-spec facts every rank shares: model chunks (one per stage unless interleaved), their tp
    kinds, local layer sizes and gradient buckets, and which chunks each stage holds."""

    bounds: list  # per chunk
    kinds: list  # per chunk
    sizes: list  # per chunk: parameters of each layer on one (tp) rank
    buckets: list  # per chunk: elements per gradient bucket
    chunks: list  # per stage: its chunks

    @classmethod
    def of(cls, spec: Spec) -> "Shape":
        bounds = stage_bounds(spec)
        kinds = [tp_kinds(hi - lo, spec.tp) for lo, hi in bounds]
        sizes = [
            [
                local_layer_size(spec.widths[i], spec.widths[i + 1], k, spec.tp)
                for i, k in zip(range(lo, hi), ks)
            ]
            for (lo, hi), ks in zip(bounds, kinds)
        ]
        if spec.arch == "resmlp":  # each chunk's units; with --tp their blocks split (resblocks.py)
            sizes = [local_unit_sizes(spec)[lo:hi] for lo, hi in bounds]
            if spec.tp > 1:
                kinds = [unit_kinds(spec)[lo:hi] for lo, hi in bounds]
        buckets = [dp_buckets(sz, spec.prec.grad, spec.bucket_mb) for sz in sizes]
        chunks = [stage_chunks(spec.schedule, spec.pp, spec.virtual_stages, s) for s in range(spec.pp)]
        return cls(bounds, kinds, sizes, buckets, chunks)
