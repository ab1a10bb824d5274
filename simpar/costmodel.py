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
from dataclasses import dataclass
from functools import lru_cache

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
    """Every rule `simpar train` enforces (config.validate, same messages), plus a known precision."""
    from .config import RunConfig, validate
    if spec.precision not in PRECISIONS:
        raise SimparError(f"unknown precision {spec.precision!r} (choose from {', '.join(PRECISIONS)})")
    if min(spec.dp, spec.tp, spec.pp) < 1:
        raise SimparError("--dp, --tp and --pp must be at least 1")
    cfg = RunConfig(layers=list(spec.widths), dataset="synthetic", batch=spec.batch, optimizer=spec.optimizer,
                    grad_accum=spec.grad_accum, dp=spec.dp, tp=spec.tp, pp=spec.pp, zero=spec.zero,
                    schedule=spec.schedule, microbatches=spec.microbatches, stage_layers=spec.stage_layers,
                    bucket_mb=spec.bucket_mb, collectives=spec.collectives, data_source=spec.data_source,
                    activation=spec.activation)
    validate(cfg, spec.world)
    return spec


# -- collective volumes (elements), per rank --------------------------------------------------------

def chunk(n: int, p: int, i: int) -> int:
    """Elements in chunk i of n split p ways (np.array_split)."""
    base, extra = divmod(n, p)
    return base + (1 if i % p < extra else 0)


@dataclass
class Cost:
    """One rank's part of one collective. `sent` and `messages` are what THIS rank sends (the ledger
    must agree exactly); `rounds`, `round_elems` and `reduced` describe the collective's critical
    path for the time model (Thakur et al. 2005): sequential rounds (alpha each), elements through
    the slowest link over all rounds (beta each), elements reduced along the way (gamma each)."""
    sent: int = 0
    messages: int = 0
    reduced: int = 0
    rounds: int = 0
    round_elems: int = 0

    def __add__(self, o: "Cost") -> "Cost":
        return Cost(self.sent + o.sent, self.messages + o.messages, self.reduced + o.reduced,
                    self.rounds + o.rounds, self.round_elems + o.round_elems)


def ring_reduce_scatter(n: int, p: int, r: int) -> Cost:
    if p == 1:
        return Cost()
    big = -(-n // p)
    return Cost(n - chunk(n, p, r), p - 1, (p - 1) * big, p - 1, (p - 1) * big)


def ring_allgather(n: int, p: int, r: int) -> Cost:
    if p == 1:
        return Cost()
    return Cost(n - chunk(n, p, r + 1), p - 1, 0, p - 1, (p - 1) * -(-n // p))


def ring_allreduce(n: int, p: int, r: int) -> Cost:
    return ring_reduce_scatter(n, p, r) + ring_allgather(n, p, r)


def rabenseifner_allreduce(n: int, p: int, r: int) -> Cost:
    """Recursive halving reduce-scatter + recursive doubling all-gather over q = 2^floor(log2 p)
    ranks, the e = p - q extra ranks folded in first and out last (collectives_more.py; Rabenseifner
    2004; Thakur et al. 2005 sec. 4.4). Blocks: np.array_split(n, q). Rank m of the q sends, at
    halving step d, the half of its block range it gives away; at doubling step d, all it holds."""
    if p == 1:
        return Cost()
    q = 1 << (p.bit_length() - 1)
    e, L = p - q, q.bit_length() - 1
    fold = 2 if e else 0
    block = -(-n // q)
    path = dict(rounds=2 * L + fold, round_elems=2 * (q - 1) * block + fold * n, reduced=(q - 1) * block + fold // 2 * n)
    if r < 2 * e and r % 2:                     # odd folding rank: sends its data once, gets the sum
        return Cost(n, 1, **path)
    m = r // 2 if r < 2 * e else r - e
    size = lambda a, b: chunk_offset(n, q, b) - chunk_offset(n, q, a)
    sent, lo, hi, d = 0, 0, q, q // 2
    while d >= 1:                               # halving: keep one half of [lo, hi), send the other
        mid = (lo + hi) // 2
        (lo, hi), give = ((lo, mid), (mid, hi)) if m & d == 0 else ((mid, hi), (lo, mid))
        sent += size(*give)
        d //= 2
    d = 1
    while d < q:                                # doubling: send everything held, get the sibling range
        sent += size(lo, hi)
        width = hi - lo
        other = lo + width if m & d == 0 else lo - width
        lo, hi = min(lo, other), max(hi, other + width)
        d *= 2
    extra = 1 if r < 2 * e else 0               # even folding rank: sends the result up at the end
    return Cost(sent + extra * n, 2 * L + extra, **path)


def chunk_offset(n: int, p: int, i: int) -> int:
    """Start of chunk i of n split p ways (collectives.chunk_bounds[i])."""
    base, extra = divmod(n, p)
    return i * base + min(i, extra)


def tree_allreduce(n: int, p: int, r: int) -> Cost:
    """Binomial reduce to rank 0, binomial broadcast back (collectives_more.py; Thakur et al. 2005,
    sec. 4): rank r sends the whole buffer to its parent (r != 0) and to each of its c(r) children,
    c(r) = #{k : 2^k > r and r + 2^k < p}. Rank 0 sends ceil(log2 p) * n: the bottleneck."""
    if p == 1:
        return Cost()
    children = sum(1 for k in range(p.bit_length()) if (1 << k) > r and r + (1 << k) < p)
    depth = (p - 1).bit_length()                # ceil(log2 p) rounds each way
    own = (1 if r else 0) + children
    return Cost(own * n, own, reduced=depth * n, rounds=2 * depth, round_elems=2 * depth * n)


def ps_allreduce(n: int, p: int, r: int) -> Cost:
    """Parameter server (Li et al. 2014): workers push n to rank 0 and get n back; rank 0 receives
    and sends (p-1) n through its one link -- the critical path for everybody."""
    if p == 1:
        return Cost()
    path = dict(reduced=(p - 1) * n, rounds=2, round_elems=2 * (p - 1) * n)
    return Cost((p - 1) * n, p - 1, **path) if r == 0 else Cost(n, 1, **path)


def mpi_allreduce(n: int, p: int, r: int) -> Cost:
    """MPI_Allreduce hides its messages; simpar books what the ring would send (marked "modeled").
    For time we take the better of ring and Rabenseifner, as MPICH picks by message size."""
    ring, rab = ring_allreduce(n, p, r), rabenseifner_allreduce(n, p, 0)
    best = rab if rab.rounds < ring.rounds and rab.round_elems <= ring.round_elems else ring
    return Cost(ring.sent, ring.messages, best.reduced, best.rounds, best.round_elems)


ALLREDUCE = {"ring": ring_allreduce, "rabenseifner": rabenseifner_allreduce, "tree": tree_allreduce,
             "ps": ps_allreduce, "mpi": mpi_allreduce}


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
    uniform = len({a * b + b for a, b in zip(spec.widths[:-1], spec.widths[1:])}) == 1
    if counts is None and not uniform and n * n * S <= 2_000_000:
        from .parallel.schedules import partition_layers   # O(S n^2): fine for a model one can run
        return partition_layers(spec.widths, S)
    if counts is None:
        # Equal layers (the --params stand-in), or too many to balance exactly in an instant.
        counts = _even_counts(n, S)
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


# -- one rank's step --------------------------------------------------------------------------------

class Book:
    """What one rank sends in a step, per (category, op, group): bytes, messages, reduced bytes and
    the critical-path rounds -- the same keys as the ledger's by_op ("category/op")."""

    def __init__(self):
        self.ops: dict[tuple[str, str, str], Cost] = {}

    def add(self, category: str, op: str, group: str, cost: Cost, elem_bytes: int, times: int = 1) -> None:
        if cost.messages == 0:             # a group of one rank sends nothing (and books nothing)
            return
        key = (category, op, group)
        self.ops[key] = self.ops.get(key, Cost()) + to_bytes(cost, elem_bytes, times)


def to_bytes(cost: Cost, elem_bytes: int, times: int = 1) -> Cost:
    """Elements -> bytes (messages and rounds stay counts), `times` repetitions."""
    k = times * elem_bytes
    return Cost(cost.sent * k, cost.messages * times, cost.reduced * k, cost.rounds * times, cost.round_elems * k)


def coords_of(rank: int, spec: Spec) -> tuple[int, int, int]:
    """(pp, dp, tp) index of a world rank: tp fastest, then dp, then pp (mesh.py)."""
    return rank // (spec.tp * spec.dp), (rank // spec.tp) % spec.dp, rank % spec.tp


@dataclass
class Shape:
    """Per-spec facts every rank shares: stages, tp kinds, local layer sizes, buckets."""
    bounds: list
    kinds: list          # per stage
    sizes: list          # per stage: parameters of each layer on one (tp) rank
    buckets: list        # per stage: elements per gradient bucket

    @classmethod
    def of(cls, spec: Spec) -> "Shape":
        bounds = stage_bounds(spec)
        kinds = [tp_kinds(hi - lo, spec.tp) for lo, hi in bounds]
        sizes = [[local_layer_size(spec.widths[i], spec.widths[i + 1], k, spec.tp) for i, k in zip(range(lo, hi), ks)]
                 for (lo, hi), ks in zip(bounds, kinds)]
        buckets = [dp_buckets(sz, spec.prec.grad, spec.bucket_mb) for sz in sizes]
        return cls(bounds, kinds, sizes, buckets)


def predict_rank(spec: Spec, rank: int, shape: Shape | None = None) -> dict:
    """Bytes, messages, memory and FLOPs of one rank in one step (see the module docstring)."""
    shape = shape or Shape.of(spec)
    s, d, t = coords_of(rank, spec)
    S, prec, W = spec.pp, spec.prec, spec.widths
    lo, hi = shape.bounds[s]
    kinds, sizes = shape.kinds[s], shape.sizes[s]
    book, allreduce = Book(), ALLREDUCE[spec.collectives]
    rows = micro_rows(spec, d)
    total_rows = sum(map(sum, rows))
    # Per row of a micro-batch: matmul FLOPs, and activation elements kept for backward (a layer's
    # Context holds its input x and pre-activation z; for the raw-logits layer z IS the output).
    fwd = bwd = act_row = 0
    for i, kind in zip(range(lo, hi), kinds):
        f, g = layer_flops(1, W[i], W[i + 1], i == 0)
        share = 1 if kind in ("full", "replicated") else spec.tp
        fwd, bwd = fwd + f // share, bwd + g // share
        z = 0 if i == spec.n_layers - 1 else W[i + 1]
        act_row += {"column": W[i] + W[i + 1] // spec.tp, "row": W[i] // spec.tp + z}.get(kind, W[i] + z)
    for b, times in Counter(b for step in rows for b in step).items():   # micro-batch rows -> count
        for i, kind in zip(range(lo, hi), kinds):
            if kind == "column" and i > 0:   # f: backward all-reduce of dL/dX (none at layer 0: no upstream)
                book.add("activation", "tp-f-allreduce", "tp", allreduce(b * W[i], spec.tp, t), prec.act, times)
            elif kind == "row":              # g: forward all-reduce of the partial products
                book.add("activation", "tp-g-allreduce", "tp", allreduce(b * W[i + 1], spec.tp, t), prec.act, times)
        if s < S - 1:
            book.add("activation", "pp-send-act", "pp", Cost(b * W[hi], 1, 0, 1, b * W[hi]), prec.act, times)
        if s > 0:
            book.add("activation", "pp-send-grad", "pp", Cost(b * W[lo], 1, 0, 1, b * W[lo]), prec.act, times)

    # Gradients / parameters over the data-parallel group.
    p = spec.dp
    layer_n = sizes                                   # ZeRO runs with tp = pp = 1: the full layers
    P = sum(sizes)
    opt_bpp = prec.optimizer[(spec.optimizer, bool(spec.momentum))]
    if spec.zero == 0:
        for n in shape.buckets[s]:
            book.add("model", "grad-allreduce", "dp", allreduce(n, p, d), prec.grad)
        memory = {"params": P * prec.param, "grads": P * prec.grad, "optimizer": P * opt_bpp}
    else:
        S_r = sum(chunk(n, p, d) for n in layer_n)    # this rank's chunk of every layer
        n_max = max(layer_n)
        if spec.zero == 1:
            book.add("model", "grad-reduce-scatter", "dp", ring_reduce_scatter(P, p, d), prec.grad)
            book.add("model", "param-all-gather", "dp", ring_allgather(P, p, d), prec.param)
            memory = {"params": P * prec.param, "grads": P * prec.grad, "optimizer": chunk(P, p, d) * opt_bpp}
        else:
            passes = 1 if spec.zero == 2 else spec.grad_accum
            for n in layer_n:
                book.add("model", "grad-reduce-scatter", "dp", ring_reduce_scatter(n, p, d), prec.grad, passes)
                book.add("model", "param-all-gather", "dp", ring_allgather(n, p, d), prec.param,
                         1 if spec.zero == 2 else 2 * passes)
            held = P if spec.zero == 2 and spec.grad_accum > 1 else n_max
            memory = {"params": (P if spec.zero == 2 else S_r) * prec.param, "grads": (S_r + held) * prec.grad,
                      "optimizer": S_r * opt_bpp}
    memory["activations_peak"] = act_row * peak_alive_rows(spec, s, rows) * prec.act

    if rank == 0 and spec.data_source == "root":
        _book_root_scatter(spec, book)
    sent = {c: 0 for c in CATS}
    messages = {c: 0 for c in CATS}
    for (cat, _, _), c in book.ops.items():
        sent[cat] += c.sent
        messages[cat] += c.messages
    return {"rank": rank, "coords": {"pp": s, "dp": d, "tp": t}, "sent": sent, "messages": messages,
            "ops": book.ops, "memory": memory, "flops": {"forward": fwd * total_rows, "backward": bwd * total_rows},
            "layers": (lo, hi), "params_local": P}


def peak_alive_rows(spec: Spec, s: int, rows: list[list[int]]) -> int:
    """Most rows whose activations stage s holds at once: walk its schedule (parallel/schedules.py),
    a Forward keeps a micro-batch, its Backward frees it. GPipe holds all M at the turn, 1F1B at
    most S - s, naive one. Each grad-accum micro-step starts empty."""
    if spec.pp == 1:
        return max(max(step) for step in rows)
    order = _alive_changes(spec.schedule, spec.pp, spec.microbatches)[s]
    peak = 0
    for step in rows:
        alive = 0
        for sign, mb in order:
            alive += sign * step[mb]
            peak = max(peak, alive)
    return peak


@lru_cache(maxsize=64)
def _alive_changes(schedule: str, S: int, M: int) -> list[list[tuple[int, int]]]:
    """Per stage: (+1 forward | -1 backward, micro-batch) in schedule order."""
    from .parallel.schedules import Backward, Forward, build_schedule
    return [[(1 if isinstance(x, Forward) else -1, x.mb) for x in steps if isinstance(x, (Forward, Backward))]
            for steps in build_schedule(schedule, S, M)]


def _book_root_scatter(spec: Spec, book: Book) -> None:
    """--data-source root: rank 0 sends every other rank its rows (data.BatchFeeder): x to each rank of
    the first stage, int64 labels to each rank of the last, one message per grad-accum micro-step."""
    K, n_stage = spec.grad_accum, spec.dp * spec.tp
    own_rows = sum(chunk(k_rows, spec.dp, 0) for k_rows in split(spec.batch, K))
    x_bytes = (spec.tp * spec.batch - own_rows) * spec.widths[0] * spec.prec.act
    x_msgs = (n_stage - 1) * K
    last_is_mine = spec.pp == 1
    y_bytes = (spec.tp * spec.batch - (own_rows if last_is_mine else 0)) * 8
    y_msgs = (n_stage - (1 if last_is_mine else 0)) * K
    c = Cost(x_bytes + y_bytes, x_msgs + y_msgs, 0, x_msgs + y_msgs, x_bytes + y_bytes)
    book.add("data", "scatter-batch", "world", c, 1)


# -- time (alpha-beta-gamma) and the whole prediction --------------------------------------------------

def op_time(cost: Cost, link, gamma: float) -> dict:
    """Latency + bandwidth + reduction terms of one op on the critical path (Thakur et al. 2005)."""
    return {"latency": cost.rounds * link.alpha, "bandwidth": cost.round_elems * link.beta,
            "reduction": cost.reduced * gamma}


def bubble_fraction(spec: Spec) -> float:
    """Idle fraction of the pipeline: (S-1)/(M+S-1) for GPipe and 1F1B (GPipe, Huang et al. 2019,
    sec. 2.2; the same for 1F1B, Narayanan et al. 2021), (S-1)/S when one micro-batch runs at a time."""
    S, M = spec.pp, spec.microbatches
    if S == 1:
        return 0.0
    return (S - 1) / S if spec.schedule == "naive" else (S - 1) / (M + S - 1)


def representative_ranks(spec: Spec, limit: int = 512) -> list[int]:
    """All ranks of a small world; otherwise the first and last rank of each stage (the extremes of
    the uneven chunks) -- ranks of one stage differ by a few elements at most."""
    if spec.world <= limit:
        return list(range(spec.world))
    per_stage = spec.dp * spec.tp
    return sorted({r for s in range(spec.pp) for r in (s * per_stage, (s + 1) * per_stage - 1)})


def predict(spec: Spec, hw=None, ranks: list[int] | None = None) -> dict:
    """The whole prediction for one step: per-rank bytes/messages/memory, and the step time on `hw`.

    Step time = data scatter (rank 0 feeds everyone first) + pipeline makespan + exposed gradient
    traffic. The makespan, with c_s = one micro-batch's compute + tp + pp time on stage s, is
    K * (sum_s c_s + (M-1) * max_s c_s) for GPipe/1F1B (fill, steady state, drain) and K*M*sum_s c_s
    for the naive schedule; with equal stages the first is K*(M+S-1)*c: the bubble formula.
    Gradient all-reduces of DDP overlap with the backward that produces them (all buckets but the
    last, which holds the first layers); ZeRO's collectives are blocking in simpar: fully exposed.
    The optimizer update (memory-bound, elementwise) is not modelled.
    """
    from . import hardware
    check(spec)
    hw = hw or hardware.load("local")
    shape = Shape.of(spec)
    chosen = ranks if ranks is not None else representative_ranks(spec)
    links = {g: hardware.group_link(hw, g, spec.dp, spec.tp, spec.pp) for g in ("tp", "dp", "pp", "world")}
    rate = hw.flop_rate(spec.precision)
    K, M = spec.grad_accum, spec.microbatches_used
    out, stage_busy, dp_exposed, data_s, worst = [], {}, 0.0, 0.0, {}
    for r in chosen:
        rp = predict_rank(spec, r, shape)
        by_op, group_s = {}, {g: 0.0 for g in links}
        for (cat, op, group), c in sorted(rp.pop("ops").items()):
            terms = op_time(c, links[group], hw.gamma)
            key, seconds = f"{cat}/{op}", sum(terms.values())
            by_op[key] = {"sent": c.sent, "messages": c.messages, "link": links[group].name, "time_s": terms}
            group_s[group] += seconds
            if key not in worst or seconds >= worst[key][0]:
                worst[key] = (seconds, by_op[key])      # the slowest rank's view of each op
        compute = (rp["flops"]["forward"] + rp["flops"]["backward"]) / rate
        s, d = rp["coords"]["pp"], rp["coords"]["dp"]
        stage_busy[s] = max(stage_busy.get(s, 0.0), compute + group_s["tp"] + group_s["pp"])
        exposed, buckets = group_s["dp"], shape.buckets[s]
        if spec.zero == 0 and spec.overlap and spec.dp > 1 and len(buckets) > 1:
            # DDP overlap (Li et al. 2020, sec. 3.2): every bucket but the last can travel while the
            # last micro-batch's backward is still computing earlier layers.
            last = sum(op_time(to_bytes(ALLREDUCE[spec.collectives](buckets[-1], spec.dp, d), spec.prec.grad),
                               links["dp"], hw.gamma).values())
            hidden_by = rp["flops"]["backward"] / rate / (K * M)
            exposed = max(exposed - hidden_by, last)
        dp_exposed = max(dp_exposed, exposed)
        if r == 0:
            data_s = group_s["world"]
        rp["by_op"] = by_op
        rp["time_s"] = {"compute": compute, "tp": group_s["tp"], "pp": group_s["pp"], "dp": group_s["dp"],
                        "dp_exposed": exposed, "data": group_s["world"]}
        out.append(rp)
    per_mb = [stage_busy[s] / (K * M) for s in sorted(stage_busy)]
    if spec.pp > 1 and spec.schedule == "naive":
        makespan = K * M * sum(per_mb)
    else:
        makespan = K * (sum(per_mb) + (M - 1) * max(per_mb))
    busiest = max(stage_busy.values())
    step = data_s + makespan + dp_exposed
    compute = max(r["time_s"]["compute"] for r in out)
    mem_max = {k: max(r["memory"][k] for r in out) for k in MEMORY_KINDS}
    exact = len(out) == spec.world
    return {
        "layout": layout_name(spec), "world": spec.world, "params": sum(a * b + b for a, b in zip(spec.widths[:-1], spec.widths[1:])),
        "spec": {k: v for k, v in spec.__dict__.items() if k != "widths"}, "widths": _short(spec.widths), "n_layers": spec.n_layers,
        "hardware": hw.name, "links": {g: {"name": l.name, "alpha_s": l.alpha, "bytes_per_s": l.bw} for g, l in links.items()},
        "comm": {"ranks": out, "all_ranks": exact,
                 "per_rank_max": {c: max(r["sent"][c] for r in out) for c in CATS},
                 "total_sent": {c: sum(r["sent"][c] for r in out) for c in CATS} if exact else None,
                 "by_op_slowest_rank": {k: entry for k, (_, entry) in worst.items()}},
        "memory": {"max": mem_max, "max_total": max(sum(r["memory"][k] for k in MEMORY_KINDS) for r in out)},
        "bubble": bubble_fraction(spec),
        "flops_per_step": sum(r["flops"]["forward"] + r["flops"]["backward"] for r in out) if exact else None,
        "time": {"step_s": step, "compute_s": compute, "tp_s": max(r["time_s"]["tp"] for r in out),
                 "pp_s": max(r["time_s"]["pp"] for r in out), "bubble_s": max(0.0, makespan - busiest),
                 "dp_s": max(r["time_s"]["dp"] for r in out), "dp_exposed_s": dp_exposed, "data_s": data_s,
                 "samples_per_s": spec.batch / step if step > 0 else float("inf")},
    }


def _short(widths: list) -> list:
    return widths if len(widths) <= 12 else widths[:3] + ["..."] + widths[-2:]


def layout_name(spec: Spec) -> str:
    """report.layout_name for a Spec: dp4, dp2xzero1, tp2, pp2-1f1b, dp2xtp2 ... (serial for one rank)."""
    parts = [f"dp{spec.dp}"] if spec.dp > 1 else []
    parts += [f"zero{spec.zero}"] if spec.zero else []
    parts += [f"tp{spec.tp}"] if spec.tp > 1 else []
    parts += [f"pp{spec.pp}-{spec.schedule}"] if spec.pp > 1 else []
    return "x".join(parts) or "serial"


def predict_from_config(cfg, world_size: int, steps: int | None = None, hw=None) -> dict:
    """The prediction for a RunConfig, keyed like train.py's metrics so a comparison is one lookup:

        pred["comm"]["ranks"][r]["sent"][cat]   == metrics["comm"]["ranks"][r]["sent"][cat]
        pred["memory"]["ranks"][r][kind]        == metrics["memory"]["ranks"][r][kind]
        (params, grads, optimizer exactly; activations_peak for the numpy kernels' Context sizes)

    Bytes and messages are totals over `steps` steps (every step moves the same bytes), like the
    ledger's; `per_step` holds one step's. Time is on the `local` hardware profile unless `hw` is given.
    """
    spec = Spec.from_config(cfg, world_size)
    steps = steps if steps is not None else (cfg.steps or 1)
    pred = predict(spec, hw, ranks=list(range(spec.world)))
    ranks = []
    for r in pred["comm"]["ranks"]:
        ranks.append({"rank": r["rank"], "coords": r["coords"],
                      "sent": {c: r["sent"][c] * steps for c in CATS},
                      "messages": {c: r["messages"][c] * steps for c in CATS},
                      "by_op": {k: {"sent": v["sent"] * steps, "messages": v["messages"] * steps}
                                for k, v in r["by_op"].items()}})
    return {"steps": steps, "layout": pred["layout"], "hardware": pred["hardware"],
            "comm": {"ranks": ranks, "per_step": pred["comm"]["total_sent"],
                     "per_rank_per_step_max": pred["comm"]["per_rank_max"]},
            "memory": {"ranks": [r["memory"] for r in pred["comm"]["ranks"]], "max": pred["memory"]["max"]},
            "bubble": pred["bubble"], "time": pred["time"]}


def mismatches(metrics: dict, predicted: dict) -> list[str]:
    """Where a run's ledger and memory differ from predict_from_config (empty list: exact).

    Compares, per rank, bytes sent per category and params/grads/optimizer memory -- the numbers
    the cost model must get exactly right (activation peaks too, but only for the numpy kernels'
    Context sizes, so they are reported separately by the caller if it wants them)."""
    out = []
    for m, p in zip(metrics["comm"]["ranks"], predicted["comm"]["ranks"]):
        for c in CATS:
            if m["sent"][c] != p["sent"][c]:
                out.append(f"rank {m['rank']} {c}: measured {m['sent'][c]} B, predicted {p['sent'][c]} B")
    for r, (m, p) in enumerate(zip(metrics["memory"]["ranks"], predicted["memory"]["ranks"])):
        for kind in ("params", "grads", "optimizer"):
            if m[kind] != p[kind]:
                out.append(f"rank {r} {kind}: measured {m[kind]} B, predicted {p[kind]} B")
    return out


def plan_main(argv: list[str]) -> int:
    """`python -m simpar plan ...` (the command line lives in simpar/plan.py)."""
    from .plan import plan_main as main
    return main(argv)
