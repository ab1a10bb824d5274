"""The cost model: closed-form bytes, messages, memory and time of one training step, per rank.

Nothing here runs MPI. Given a model (its widths), a global batch and a layout, `predict` says what
every rank will send per step, by category and by collective, how much memory it will hold, and how
long a step should take on some hardware (simpar/hardware.py). For every layout simpar can run, the
bytes and the params/grads/optimizer memory are not estimates: they are derived from the same rules
the implementation follows, and the tests hold the ledger to them to the byte.

Where the numbers come from (p ranks in a group, N elements, chunks cut by np.array_split, so
chunk i of N has N//p + (i < N%p) elements -- collectives.chunk_bounds):

  ring reduce-scatter  rank r sends every chunk but its own:            N - c_r
  ring all-gather      rank r sends every chunk but chunk r+1:          N - c_(r+1)
  ring all-reduce      both:  2N - c_r - c_(r+1) = 2(p-1)/p * N (+-1 per chunk)   (Patarasuk & Yuan 2009)
  data parallel        each gradient BUCKET is one all-reduce, so a rank sends the sum over buckets
                       (buckets: parallel/data.py GradientBuckets; 2(p-1)/p * P * bpe overall)
  ZeRO-1               reduce-scatter + all-gather of the flat P        (ZeRO paper, Rajbhandari et al.
  ZeRO-2               the same, layer by layer                          2020, sec. 7.2.1: = DDP)
  ZeRO-3               per micro-step, per layer: all-gather in forward, again in backward, and a
                       reduce-scatter of the gradient: 3(p-1)/p * P       (sec. 7.2.2: 1.5x DDP)
  tensor parallel      per (column, row) pair per micro-batch: g = all-reduce of rows x out-width in
                       forward, f = all-reduce of rows x in-width in backward (skipped at layer 0)
                       (Megatron-LM, Shoeybi et al. 2019, sec. 3, Fig. 3; parallel/tensor.py)
  pipeline             per micro-batch: rows x out-width forward ("pp-send-act") from every stage but
                       the last, rows x in-width backward ("pp-send-grad") from every stage but the first
  data (root)          rank 0 sends each rank its rows: x (rows x width) to first-stage ranks and
                       labels (rows x 8 bytes, int64) to last-stage ranks, every tp rank its own copy

Time: the alpha-beta-gamma model (Thakur, Rabenseifner & Gropp 2005): a collective costs
messages*alpha + bytes*beta + reduced bytes*gamma on the link its group uses (hardware.group_link),
plus compute = exact matmul FLOPs / FLOP rate (forward 2*rows*in*out per layer, backward twice that,
except layer 0 which needs no input gradient). The pipeline bubble is (S-1)/(M+S-1) for GPipe and
1F1B (Huang et al. 2019, GPipe sec. 2.2), (S-1)/S for the naive schedule.

Precisions (bytes per parameter): fp64 and fp32 store everything in that type; `mixed` is the ZeRO
paper's mixed-precision Adam (sec. 3.1): 2-byte params and grads, and K = 12 bytes of optimizer state
(fp32 master weights, momentum and variance). Communication moves params/grads in their own type.
The CLI is in simpar/plan.py (`python -m simpar plan`).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

from .config import SimparError

CATS = ("data", "model", "activation")
MEMORY_KINDS = ("params", "grads", "optimizer", "activations_peak")


# -- precisions ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Precision:
    name: str
    param: int            # bytes per parameter (also what parameters are communicated in)
    grad: int             # bytes per gradient element (also what gradients are communicated in)
    act: int              # bytes per activation element
    optimizer: dict       # (optimizer, has momentum) -> bytes of optimizer state per parameter


PRECISIONS = {
    "fp64": Precision("fp64", 8, 8, 8, {("sgd", True): 8, ("sgd", False): 0, ("adam", True): 16, ("adam", False): 16}),
    "fp32": Precision("fp32", 4, 4, 4, {("sgd", True): 4, ("sgd", False): 0, ("adam", True): 8, ("adam", False): 8}),
    # ZeRO paper sec. 3.1: fp16 params + grads (2 + 2 bytes), fp32 copy of params, momentum and
    # variance (K = 12). SGD keeps the fp32 master (4) and, with momentum, a velocity (4).
    "mixed": Precision("mixed", 2, 2, 2, {("sgd", True): 8, ("sgd", False): 4, ("adam", True): 12, ("adam", False): 12}),
}
DTYPE_PRECISION = {"float64": "fp64", "float32": "fp32"}


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
        return cls(widths=list(cfg.layers), batch=cfg.batch, dp=dp, tp=cfg.tp, pp=cfg.pp, zero=cfg.zero,
                   schedule=cfg.schedule, microbatches=cfg.microbatches, grad_accum=cfg.grad_accum,
                   collectives=cfg.collectives, bucket_mb=cfg.bucket_mb, overlap=cfg.overlap,
                   data_source=cfg.data_source, stage_layers=cfg.stage_layers,
                   precision=DTYPE_PRECISION[cfg.dtype], optimizer=cfg.optimizer, momentum=cfg.momentum,
                   activation=cfg.activation)


def check(spec: Spec) -> Spec:
    """The rules of config.validate that matter for a prediction, as SimparErrors."""
    def need(ok, msg):
        if not ok:
            raise SimparError(msg)
    need(len(spec.widths) >= 2 and min(spec.widths) >= 1, f"need at least two positive widths, got {spec.widths}")
    need(spec.batch >= 1, f"--batch must be at least 1, got {spec.batch}")
    need(min(spec.dp, spec.tp, spec.pp, spec.grad_accum, spec.microbatches) >= 1,
         "--dp, --tp, --pp, --grad-accum and --microbatches must be at least 1")
    need(spec.precision in PRECISIONS, f"unknown precision {spec.precision!r} (choose from {', '.join(PRECISIONS)})")
    need(spec.optimizer in ("sgd", "adam"), f"unknown optimizer {spec.optimizer!r} (choose from sgd, adam)")
    need(spec.zero in (0, 1, 2, 3), f"--zero must be 0, 1, 2 or 3, got {spec.zero}")
    need(not spec.zero or (spec.tp == 1 and spec.pp == 1), "--zero shards data parallelism; combine it with --dp only")
    need(spec.schedule in ("naive", "gpipe", "1f1b"), f"unknown schedule {spec.schedule!r} (choose from naive, gpipe, 1f1b)")
    need(spec.collectives in ALLREDUCE, f"unknown collectives {spec.collectives!r} (choose from {', '.join(ALLREDUCE)})")
    need(spec.batch >= spec.dp * spec.grad_accum,
         f"--batch {spec.batch} is smaller than dp*grad-accum = {spec.dp * spec.grad_accum}: some rank would get no rows")
    bad = [w for w in spec.widths[1:-1] if w % spec.tp]
    need(not bad, f"hidden widths {bad[:4]} are not divisible by --tp {spec.tp}")
    need(spec.pp <= spec.n_layers, f"--pp {spec.pp} asks for more pipeline stages than the model has layers ({spec.n_layers})")
    if spec.pp > 1:
        need(spec.batch >= spec.microbatches * spec.dp,
             f"--batch {spec.batch} is too small for {spec.microbatches} micro-batches on {spec.dp} data-parallel ranks")
    return spec


# -- collective volumes (elements), per rank --------------------------------------------------------

def chunk(n: int, p: int, i: int) -> int:
    """Elements in chunk i of n split p ways (np.array_split)."""
    base, extra = divmod(n, p)
    return base + (1 if i % p < extra else 0)


@dataclass
class Cost:
    """One rank's part of one collective: elements sent, messages sent, elements it reduced (+=)."""
    sent: int = 0
    messages: int = 0
    reduced: int = 0
    rounds: int = 0        # sequential rounds (each pays alpha once on the critical path)
    round_elems: int = 0   # elements in the largest message of a round, summed over rounds (time)

    def __add__(self, o: "Cost") -> "Cost":
        return Cost(self.sent + o.sent, self.messages + o.messages, self.reduced + o.reduced,
                    self.rounds + o.rounds, self.round_elems + o.round_elems)

    def times(self, k: int) -> "Cost":
        return Cost(self.sent * k, self.messages * k, self.reduced * k, self.rounds * k, self.round_elems * k)


def ring_reduce_scatter(n: int, p: int, r: int) -> Cost:
    if p == 1:
        return Cost()
    big = -(-n // p)
    return Cost(n - chunk(n, p, r), p - 1, n - chunk(n, p, r - 1), p - 1, (p - 1) * big)


def ring_allgather(n: int, p: int, r: int) -> Cost:
    if p == 1:
        return Cost()
    return Cost(n - chunk(n, p, r + 1), p - 1, 0, p - 1, (p - 1) * -(-n // p))


def ring_allreduce(n: int, p: int, r: int) -> Cost:
    return ring_reduce_scatter(n, p, r) + ring_allgather(n, p, r)


ALLREDUCE = {"ring": ring_allreduce}      # more algorithms: see _register_algorithms at the end


# -- how the implementation cuts things up ------------------------------------------------------------

def split(n: int, parts: int) -> list[int]:
    """Sizes of np.array_split(range(n), parts)."""
    return [chunk(n, parts, i) for i in range(parts)]


def micro_rows(spec: Spec, dp_index: int) -> list[list[int]]:
    """Rows of each pipeline micro-batch of each grad-accum micro-step on data-parallel rank dp_index
    (data.micro_steps -> data.distributed_sampler -> np.array_split into M; M = 1 without a pipeline)."""
    return [split(chunk(k_rows, spec.dp, dp_index), spec.microbatches_used)
            for k_rows in split(spec.batch, spec.grad_accum)]


def stage_bounds(spec: Spec) -> list[tuple[int, int]]:
    """[(first layer, one past last)] per pipeline stage, as parallel/schedules.partition_layers cuts them."""
    n, S = spec.n_layers, spec.pp
    counts = spec.stage_layers
    if counts is None:
        costs = [a * b + b for a, b in zip(spec.widths[:-1], spec.widths[1:])]
        if len(set(costs)) == 1 or n * n * S > 2_000_000:
            counts = _even_counts(n, S)       # uniform layers: the balanced split in O(n)
        else:
            from .parallel.schedules import _balanced_counts
            counts = _balanced_counts(costs, S)
    bounds, lo = [], 0
    for c in counts:
        bounds.append((lo, lo + c))
        lo += c
    return bounds


def _even_counts(n: int, S: int) -> list[int]:
    """Equal layers: ceil(n/S) per stage from the back (the later stages take as many as they can,
    schedules._balanced_counts's tie rule), what is left goes to the front."""
    per = -(-n // S)
    counts, left = [], n
    for k in range(S, 0, -1):
        c = min(per, left - (k - 1))
        counts.append(c)
        left -= c
    return counts[::-1]


def tp_kinds(n_stage_layers: int, tp: int) -> list[str]:
    """parallel/tensor.pair_kinds: column, row, column, row, ...; an odd last layer replicated."""
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


def dp_buckets(layer_sizes: list[int], elem_bytes: int, bucket_mb: float) -> list[int]:
    """parallel/data.GradientBuckets: from the LAST layer back, close a bucket once it reaches bucket_mb MiB."""
    buckets, current = [], 0
    limit = bucket_mb * 2 ** 20
    for n in reversed(layer_sizes):
        current += n
        if current * elem_bytes >= limit:
            buckets.append(current)
            current = 0
    if current:
        buckets.append(current)
    return buckets


def layer_flops(rows: int, fan_in: int, fan_out: int, first: bool) -> tuple[int, int]:
    """(forward, backward) matmul FLOPs of one layer: x@W is 2*rows*in*out; backward needs dW = x^T dz
    and, except for layer 0, dx = dz W^T. Biases and activations are O(rows*out): left out."""
    f = 2 * rows * fan_in * fan_out
    return f, f if first else 2 * f


