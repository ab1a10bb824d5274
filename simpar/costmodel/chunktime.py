"""What one rank's work on one model chunk costs in seconds: per micro-batch forward and backward,
the backward by layer and in its B and W halves, recomputation, the gradient buckets' all-reduces,
the optimizer (RankCosts); steptime.py puts these pieces in a schedule's order.

Costs are the alpha-beta-gamma model (Thakur, Rabenseifner & Gropp 2005) on a hardware profile:
a collective costs rounds x alpha + bytes on its critical path x beta + bytes reduced x gamma on
its group's link; on GPU profiles a ring collective is priced as NCCL runs it (op_time: protocols,
NVLink SHARP under --collectives auto, the reduction inside the copy: nccl.py); compute is matmul
FLOPs / FLOP rate plus memory-bound bytes x gamma / 3 plus a per-layer call overhead
(work.layer_work says which bytes). Ranks that share cores compute slower, and memory-bound work
slows when every core streams at once (Hardware.stream_share).
"""

from __future__ import annotations

from .collectives import ALLREDUCE, Cost, to_bytes
from .resblocks import block_collectives, sp_grad_allreduces
from .spec import Spec, dp_bucket_layers
from .work import layer_work, loss_bytes, optimizer_bytes


def op_time(cost: Cost, link, gamma: float, ring: bool = False, nvls: bool = False) -> dict:
    """Latency + bandwidth + reduction terms of one op on the critical path (Thakur et al. 2005).

    `ring`: the op is a ring collective as NCCL runs it (--collectives ring or auto, ZeRO's and --sp's
    halves): on a profile with a protocol table (GPUs, nccl.py) each call pays the chosen protocol's
    base latency, each step its per-step latency, and the bytes its bandwidth -- the protocol picked
    by the bytes per step, as the simulated clock picks it (collectives/base.py); `nvls` (--collectives
    auto) lets an all-reduce on one NVSwitch node take NVLink SHARP. Other algorithms: alpha, beta."""
    tuning = getattr(link, "tuning", None)
    if ring and cost.rounds and tuning is not None and tuning.proto:
        latency = bandwidth = 0.0
        calls = cost.calls or ((cost.rounds, cost.round_elems, cost.reduced, 1),)
        for rounds, round_bytes, reduced, count in calls:  # each call by its own size
            t = tuning.choose(ring_kind(reduced, round_bytes), round_bytes / rounds, nvls=nvls)
            latency += count * (t.base + rounds * t.hop)
            bandwidth += count * round_bytes / t.bw
        return {"latency": latency, "bandwidth": bandwidth, "reduction": cost.reduced * gamma}
    return {
        "latency": cost.rounds * link.alpha,
        "bandwidth": cost.round_elems * link.beta,
        "reduction": cost.reduced * gamma,
    }


def ring_kind(reduced: float, round_elems: float) -> str:
    """Which ring collective one call is: all-gather reduces nothing, reduce-scatter reduces every
    chunk it passes on, all-reduce passes each chunk twice and reduces it once."""
    if reduced == 0:
        return "all-gather"
    return "reduce-scatter" if reduced == round_elems else "all-reduce"


def collective_gamma(hw) -> float:
    """Seconds per byte a collective's reduction adds: none on GPUs, where it runs inside the copy
    kernel (Hardware.reduce_in_transfer); gamma on the CPU, where the same core does both."""
    return 0.0 if hw.reduce_in_transfer else hw.gamma


def seconds(cost: Cost, link, gamma: float, ring: bool = False, nvls: bool = False) -> float:
    return sum(op_time(cost, link, gamma, ring, nvls).values())


def ring_algorithm(spec) -> bool:
    """--collectives ring or auto: the all-reduces are NCCL's ring (auto: or NVLink SHARP)."""
    return spec.collectives in ("ring", "auto")


RING_HALVES = ("grad-reduce-scatter", "param-all-gather", "sp-gather", "sp-scatter")  # always the ring
ALLREDUCE_OPS = (
    "grad-allreduce",
    "tp-f-allreduce",
    "tp-g-allreduce",
    "sp-grad-allreduce",
    "expert-grad-allreduce",
)


def ring_op(spec, op: str) -> bool:
    """Whether the ledger op `op` runs as a ring collective (priced by op_time's NCCL branch)."""
    return op in RING_HALVES or (op in ALLREDUCE_OPS and ring_algorithm(spec))


class RankCosts:
    """Seconds of one rank's work on one model chunk (layers lo..hi-1): per micro-batch forward and
    backward (compute + blocking tensor-parallel all-reduces), the backward split by layer (for the
    gradient buckets) and into its B and W halves (zb-h1), the optimizer (of the whole rank)."""

    def __init__(self, spec: Spec, hw, links: dict, rank_pred: dict, kinds: list, sizes: list, bounds=None):
        self.spec, self.hw, self.links = spec, hw, links
        share = hw.compute_share(min(spec.world, hw.devices_per_node))
        self.rate = hw.flop_rate(spec.precision) * share
        # seconds per byte of memory-bound work, slowed as the node's cores share its memory bus
        self.stream = hw.gamma / 3 / hw.stream_share(min(spec.world, hw.devices_per_node))
        self.overhead = hw.layer_overhead / share
        self.lo, self.hi = bounds or rank_pred["layers"]
        self.t = rank_pred["coords"]["tp"]
        self.kinds, self.sizes = kinds, sizes
        self.works = [layer_work(spec, i, k) for i, k in zip(range(self.lo, self.hi), kinds)]
        self.optimizer_s = optimizer_bytes(spec, rank_pred["params_updated"]) * self.stream
        # --sp's gradient all-reduces over tp, one per unit of this chunk (in unit order): once per
        # step, blocking, each after its unit's part of the chunk's final backward (or W pass)
        self.sp_sync = [
            self._seconds(c, spec.prec.grad)
            for c in sp_grad_allreduces(spec, self.t, range(self.lo, self.hi))
        ]
        self._memo: dict = {}  # (what, rows) -> seconds: micro-batches come in a few sizes only

    def _cached(self, what: str, r: int, fn):
        key = (what, r)
        if key not in self._memo:
            self._memo[key] = fn(r)
        return self._memo[key]

    def _tp(self, n: int) -> float:
        return self._seconds(ALLREDUCE[self.spec.collectives](n, self.spec.tp, self.t), self.spec.prec.act)

    def _seconds(self, cost: Cost, elem_bytes: int, ring: bool | None = None, group: str = "tp") -> float:
        """Seconds of one of this rank's collectives (`ring`: default, --collectives ring or auto)."""
        if not cost.messages:
            return 0.0
        ring = ring_algorithm(self.spec) if ring is None else ring
        nvls = self.spec.collectives == "auto"
        return seconds(to_bytes(cost, elem_bytes), self.links[group], collective_gamma(self.hw), ring, nvls)

    def _block(self, r: int, i: int, phase: str) -> float:
        """resmlp under --tp: a block's g (forward) or f (backward), or --sp's gather + scatter."""
        return sum(
            self._seconds(c, self.spec.prec.act, ring_algorithm(self.spec) or op.startswith("sp-"))
            for op, c in block_collectives(self.spec, r, i, self.t, phase)
        )

    def forward_tp(self, r: int) -> float:
        """The tensor-parallel collectives inside forward(r): the g all-reduces, resmlp's block g
        (or --sp's gather + scatter). They block, so they are part of the forward's seconds."""
        return self._cached("Ftp", r, self._forward_tp)

    def _forward_tp(self, r: int) -> float:
        W, out = self.spec.widths, 0.0
        for i, kind in zip(range(self.lo, self.hi), self.kinds):
            if kind == "row":
                out += self._tp(r * W[i + 1])
            elif kind == "block":
                out += self._block(r, i, "forward")
        return out

    def backward_tp(self, r: int) -> float:
        """The tensor-parallel collectives inside backward(r) (also backward_input(r): the W half has
        none): the f all-reduces, and the forward's again under --recompute full."""
        redo = self.forward_tp(r) if self.spec.recompute == "full" else 0.0
        return self._cached("Btp", r, lambda r: redo + sum(f for _, f in self.backward_layers(r)))

    def forward(self, r: int, loss: bool = True) -> float:
        return self._cached(("F", loss), r, lambda r: self._forward(r, loss))

    def _forward(self, r: int, loss: bool = True) -> float:
        W, out = self.spec.widths, 0.0
        for i, kind, compute in zip(range(self.lo, self.hi), self.kinds, self.forward_layers(r)):
            out += compute
            if kind == "row":  # g: the partial products summed in forward
                out += self._tp(r * W[i + 1])
            elif kind == "block":
                out += self._block(r, i, "forward")
        return out + (self.loss(r) if loss else 0.0)

    def forward_layers(self, r: int) -> list[float]:
        """The compute of each layer's forward of r rows, first layer first (its matmuls, memory-bound
        bytes and call overhead; no collectives): ZeRO puts its gathers between them (zero_time.py)."""
        bpe = self.spec.prec.act
        return [
            r * w["fwd_flops"] / self.rate + r * w["fwd_elems"] * bpe * self.stream + self.overhead
            for w in self.works
        ]

    def loss(self, r: int) -> float:
        """The softmax cross-entropy of r rows, after the last layer's forward (0 on other chunks)."""
        return r * loss_bytes(self.spec) * self.stream if self.hi == self.spec.n_layers else 0.0

    def recompute(self, r: int) -> float:
        """What the backward redoes first (recompute.py): full, the forward without the loss;
        selective, y = act(z) of every layer; none, nothing."""
        if self.spec.recompute == "full":
            return self.forward(r, loss=False)
        if self.spec.recompute == "selective":
            return sum(r * w["act_elems"] for w in self.works) * self.spec.prec.act * self.stream
        return 0.0

    def backward_layers(self, r: int, first: bool = False) -> list[tuple[float, float]]:
        """(compute, f all-reduce after it) of each layer in backward order, last layer first;
        `first`: the step's first backward, which may write the gradients instead of adding
        (work.first_grads)."""
        return self._cached(("layers", first), r, lambda r: self._backward_layers(r, first))

    def _backward_layers(self, r: int, first: bool) -> list[tuple[float, float]]:
        W, bpe, out = self.spec.widths, self.spec.prec.act, []
        for i, kind, w in reversed(list(zip(range(self.lo, self.hi), self.kinds, self.works))):
            call = w.get("first_call_elems", w["bwd_call_elems"]) if first else w["bwd_call_elems"]
            compute = r * w["bwd_flops"] / self.rate + (r * w["bwd_elems"] + call) * bpe * self.stream
            f = self._tp(r * W[i]) if kind == "column" and i > 0 else 0.0
            f = self._block(r, i, "backward") if kind == "block" else f
            out.append((compute, f))
        return out

    def backward(self, r: int, first: bool = False) -> float:
        return self._cached(
            ("B", first),
            r,
            lambda r: self.recompute(r) + sum(c + f for c, f in self.backward_layers(r, first)),
        )

    def weight_layers(self, r: int) -> list[float]:
        """The W half of each layer, last layer first: dW = x^T dz (2 r a b FLOPs), db's row sum and
        the accumulation of dW, db (model.backward_weight)."""
        bpe, out = self.spec.prec.act, []
        for w in reversed(self.works):
            out.append(
                r * w["fwd_flops"] / self.rate + (r * w["w_elems"] + w["bwd_call_elems"]) * bpe * self.stream
            )
        return out

    def weight(self, r: int) -> float:
        return sum(self.weight_layers(r))

    def backward_input(self, r: int) -> float:
        """The B half: the backward less its W half (dx = dz W^T, the activation's derivative, f)."""
        return self.backward(r) - self.weight(r)

    def bucket_seconds(self, s_sizes: list, d: int) -> list[tuple[list[int], float]]:
        """DDP buckets (layer positions, all-reduce seconds) over the dp group; none without dp."""
        spec = self.spec
        if spec.dp == 1 or spec.zero:
            return []
        out = []
        for layers in dp_bucket_layers(s_sizes, spec.prec.grad, spec.bucket_mb):
            cost = ALLREDUCE[spec.collectives](sum(s_sizes[i] for i in layers), spec.dp, d)
            out.append((layers, self._seconds(cost, spec.prec.grad, group="dp")))
        return out
