"""Mixture of experts with expert parallelism, in closed form: parallel/expert.py's rules written again.

D data-parallel ranks, cut into groups of P consecutive ranks (expert parallelism); rank d is ep rank
j = d mod P of the group starting at d - j and holds experts j*E/P .. (j+1)*E/P - 1 of every MoE
layer (the hidden-to-hidden layers 1 .. n-2). With kept[s][e] the assignments of rank s's rows that
expert e keeps (capacity ceil(C K B / E), filled in global row order), per MoE layer and step:

  ep-dispatch       rank d sends the rows of its kept assignments to experts on other ranks of its
                    group: sum_{e not on d} kept[d][e] x d_in          (P-1 messages, pairwise all-to-all)
  ep-combine        it returns what its experts computed for the group's other ranks:
                    sum_{s in group, s != d} sum_{e on d} kept[s][e] x d_out          (P-1 messages)
  ep-combine-grad   as ep-dispatch, d_out wide;  ep-dispatch-grad: as ep-combine, d_in wide
  --alltoall bruck  the same pieces (ep rank a to b in dispatch: sum_{e on b} kept[a][e] rows; combine
                    the transpose) by Bruck's algorithm: ceil(log2 P) messages, each piece sent once
                    per set bit of its relative destination (collectives.bruck_alltoall)
  ep-histogram      (control) ring all-gather of D x E int64 counts over the dp group: (D-1) E x 8 B
  grad-allreduce    the non-expert parameters (dense layers, routers) over the D dp ranks, one call
  expert-grad-allreduce  this rank's E/P experts over its expert-data-parallel group (D/P ranks)

--grad-accum G: micro-step k routes the k-th of G slices of the batch (np.array_split: N_k =
chunk(B, G, k) global rows, rank d holding chunk(N_k, D, d) of them) with its own capacity
ceil(C K N_k / E), histogram exchange and four all-to-alls; the two gradient all-reduces happen once
per step. The run's routing then has G entries per step; activations peak in the fullest micro-step.

Balanced routing (every rank's n_d K assignments spread evenly, no drops): each of the four
all-to-alls moves (P-1)/P x n_d K rows per layer. An IMBALANCE u >= 1 (the hottest expert gets u
times the mean load, the others of its rank the mean) makes its owner return (u + E/P - 1)/(E/P)
times as much in ep-combine and ep-dispatch-grad; capacity caps u at C (an expert keeps at most C
times the mean), which is what the capacity factor buys.
Memory: (non-expert parameters + E/P experts) x bytes, for params, grads and optimizer state alike;
activations as `activation_bytes` counts them, the most of any step (exact with the run's routing).
--precision mixed-bf16: everything in 2-byte halves except the router, which computes and keeps its
probabilities in float32 (Switch's selective precision, Fedus et al. 2021, sec. 2.4): n_d x E x 4 B.
Time: compute (step_compute_s: balanced routing) plus every collective on the dp group's link, alpha
per round and beta per byte on its critical path (an all-to-all: every round's message, one after the
other), blocking (parallel/expert.py overlaps nothing);
under --clock sim the simulated step agrees within a few per cent (tests/mpi/model/test_moe.py holds it
to 10%).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

from .chunktime import op_time, ring_op
from .collectives import ALLREDUCE, ALLTOALL, Cost, chunk, ring_allgather, to_bytes
from .rank import Book, _book_root_scatter
from .spec import Spec
from .work import layer_work, loss_bytes, optimizer_bytes

OPS = ("ep-dispatch", "ep-combine", "ep-combine-grad", "ep-dispatch-grad")
CATEGORY = {
    "ep-histogram": "control",
    "grad-allreduce": "model",
    "expert-grad-allreduce": "model",
    "scatter-batch": "data",
}


def moe_layers(spec: Spec) -> list[int]:
    return list(range(1, spec.n_layers - 1))


def param_counts(spec: Spec) -> tuple[int, int]:
    """(non-expert parameters: dense layers and routers; parameters of ONE rank's E/P experts)."""
    W, moe = spec.widths, set(moe_layers(spec))
    dense = sum(
        W[i] * W[i + 1] + W[i + 1] if i not in moe else W[i] * spec.experts for i in range(spec.n_layers)
    )
    experts = sum((spec.experts // spec.ep) * (W[i] * W[i + 1] + W[i + 1]) for i in moe)
    return dense, experts


def micro_batch(spec: Spec, k: int) -> int:
    """Global rows of grad-accum micro-step k: chunk k of the batch split --grad-accum ways."""
    return chunk(spec.batch, spec.grad_accum, k)


def micro_capacity(spec: Spec, k: int) -> int:
    """Token slots per expert in micro-step k: ceil(C K N_k / E) (Fedus et al. 2021, eq. 3)."""
    return math.ceil(spec.capacity_factor * spec.top_k * micro_batch(spec, k) / spec.experts)


def balanced_kept(spec: Spec, imbalance: float = 1.0, k: int = 0) -> list[list[float]]:
    """kept[s][e] of one layer in micro-step k under balanced routing (fractional rows: an average,
    not a count); with `imbalance` u, expert 0 takes min(u, C) times its share (the worst case for ep
    rank 0)."""
    D, E, K, N = spec.dp, spec.experts, spec.top_k, micro_batch(spec, k)
    hot = min(imbalance, spec.capacity_factor)
    return [[chunk(N, D, s) * K / E * (hot if e == 0 else 1) for e in range(E)] for s in range(D)]


def kept_in_row_order(H: list[list[int]], cap: int) -> list[list[int]]:
    """Which assignments an expert keeps: H[s][e] chosen on rank s; an expert's cap slots go to the
    global batch's rows in order, rank 0's first, so rank s keeps min(H[s][e], cap - those before)."""
    kept, before = [], [0] * len(H[0])
    for row in H:
        kept.append([max(0, min(h, cap - b)) for h, b in zip(row, before)])
        before = [b + h for b, h in zip(before, row)]
    return kept


def alltoall_pieces(spec: Spec, kept: list[list[float]], d: int) -> dict:
    """The rows of every piece in rank d's ep group, per all-to-all: m[a][b] is what ep rank a sends ep
    rank b. Dispatch (and combine-grad): a's kept assignments to b's experts; combine (and
    dispatch-grad): the transpose, b's experts' outputs going back to a's rows."""
    P, per = spec.ep, spec.experts // spec.ep
    base = d - d % P
    out = [
        [sum(kept[base + a][e] for e in range(b * per, (b + 1) * per)) for b in range(P)] for a in range(P)
    ]
    back = [[out[b][a] for b in range(P)] for a in range(P)]
    return {"ep-dispatch": out, "ep-combine-grad": out, "ep-combine": back, "ep-dispatch-grad": back}


class EpAlltoalls:
    """One rank's four ep all-to-alls of a block, op -> Cost in elements (Cost(round(sent), messages, 0,
    rounds, ceil(round_elems)) of ALLTOALL[alltoall] on alltoall_pieces x width), remembered per (kept
    matrix, rank) and the group's pieces per (kept matrix, group): every rank of a group reads the same
    P x P pieces, and a balanced router hands every block and micro-step the same matrix, so a 512-rank
    plan asks for the same few costs tens of thousands of times. The numbers are exactly what the
    direct call gives: the same arithmetic, done once. The memo keeps each matrix it keys by id, so no
    other matrix can take that id while the memo lives (one memo per prediction); with a run's routing
    (every block its own matrix) it holds 2 P / E times the D x E matrices' own elements in pieces."""

    def __init__(self, experts: int, ep: int, width: int, alltoall: str):
        self.routing = SimpleNamespace(experts=experts, ep=ep)  # what alltoall_pieces reads
        self.width, self.alltoall = width, alltoall
        self.pieces: dict = {}
        self.costs: dict = {}

    def __call__(self, kept: list, d: int) -> dict[str, Cost]:
        key = (id(kept), d)
        if key not in self.costs:
            P = self.routing.ep
            group = (id(kept), d - d % P)
            if group not in self.pieces:
                pieces = alltoall_pieces(self.routing, kept, d)  # two matrices: out and its transpose
                wide = {id(m): [[x * self.width for x in line] for line in m] for m in pieces.values()}
                scaled = {op: wide[id(pieces[op])] for op in OPS}
                self.pieces[group] = (kept, scaled)
            scaled = self.pieces[group][1]
            costs = {}
            for op in OPS:
                c = ALLTOALL[self.alltoall](scaled[op], P, d % P)
                costs[op] = Cost(round(c.sent), c.messages, 0, c.rounds, math.ceil(c.round_elems))
            self.costs[key] = (kept, costs)
        return self.costs[key][1]


def activation_bytes(spec: Spec, kept_per_layer: list[list[list[float]]], d: int, k: int = 0) -> float:
    """Activation bytes rank d holds for backward at the end of micro-step k's forward (its peak:
    the backward only frees, before the next micro-step starts), with kept_per_layer[l][s][e] for MoE
    layer l; n_d = chunk(N_k, D, d) rows. Per layer, as parallel/expert.py keeps them:
      dense layer i     its input x (n_d x W_i) and, unless the layer is linear, z (n_d x W_i+1)
      MoE layer i       x (n_d x W_i), the router's probabilities (n_d x E, in float32 under mixed
                        precision, the model's type otherwise), the outputs that came
                        back for each of d's kept assignments (kept[d][e] x W_i+1), and, for each
                        expert e on d that got rows_e = sum over d's group of kept[s][e] > 0 rows,
                        that expert's layer context rows_e x (W_i + W_i+1)
    """
    D, P, E, W = spec.dp, spec.ep, spec.experts, spec.widths
    per, j = E // P, d % P
    n = chunk(micro_batch(spec, k), D, d)
    bpe = spec.prec.act
    router_bpe = 4 if spec.precision == "mixed" else bpe
    z = lambda i: 0 if i == spec.n_layers - 1 else 1  # noqa: E731  (the last layer is linear: z is y)
    total, router, moe = 0.0, 0.0, dict(zip(moe_layers(spec), kept_per_layer))
    for i in range(spec.n_layers):
        if i not in moe:
            total += n * (W[i] + z(i) * W[i + 1])
            continue
        kept = moe[i]
        total += n * W[i] + sum(kept[d]) * W[i + 1]
        router += n * E
        for e in range(j * per, (j + 1) * per):
            rows = sum(kept[s][e] for s in range(d - j, d - j + P))
            total += rows * (W[i] + W[i + 1])
    return total * bpe + router * router_bpe


def predict_moe(spec: Spec, hw, routing: dict | None = None, steps: int = 1, imbalance: float = 1.0) -> dict:
    """Per-rank bytes (totals over `steps`), memory and a step time, keyed like predict_from_config.
    `routing`: the run's metrics["moe"] (routed_by_rank per micro-step and layer) for exact bytes;
    without it, balanced routing (times `imbalance`)."""
    D, P, E, W, G = spec.dp, spec.ep, spec.experts, spec.widths, spec.grad_accum
    layers = moe_layers(spec)
    # per_step: one entry per micro-step (G per step, step-major), micro-step k = index mod G
    if routing is not None:  # the router's choices per rank; which of them fit is decided here, again
        per_step = [
            [kept_in_row_order(H, micro_capacity(spec, i % G)) for H in micro]
            for i, micro in enumerate(routing["routed_by_rank"])
        ]
        steps = len(per_step) // G
    else:
        per_step = [[balanced_kept(spec, imbalance, k)] * len(layers) for k in range(G)] * steps
    bpe = spec.prec.act
    dense, experts = param_counts(spec)
    opt = spec.prec.optimizer[(spec.optimizer, bool(spec.momentum))]
    allreduce = ALLREDUCE[spec.collectives]
    link = None
    if hw is not None:
        from .hardware import group_link

        link = group_link(hw, "dp", spec.dp, spec.tp, spec.pp)
    ranks, worst_s = [], 0.0
    for d in range(D):
        ops: dict[str, Cost] = {}

        def add(op: str, cost: Cost, elem_bytes: int, times: int = 1) -> None:
            if cost.messages:
                ops[op] = ops.get(op, Cost()) + to_bytes(cost, elem_bytes, times)

        for step in per_step:
            for layer, kept in zip(layers, step):
                pieces = alltoall_pieces(spec, kept, d)
                for op in OPS:
                    width = W[layer] if op in ("ep-dispatch", "ep-dispatch-grad") else W[layer + 1]
                    m = [[rows * width for rows in line] for line in pieces[op]]
                    c = ALLTOALL[spec.alltoall](m, P, d % P)
                    add(op, Cost(round(c.sent), c.messages, 0, c.rounds, math.ceil(c.round_elems)), bpe)
                add("ep-histogram", ring_allgather(D * E, D, d), 8)
        add("grad-allreduce", allreduce(dense, D, d), spec.prec.grad, steps)
        add("expert-grad-allreduce", allreduce(experts, D // P, d // P), spec.prec.grad, steps)
        if d == 0 and spec.data_source == "root":  # rank 0 scatters the batches, as for any dp layout
            book = Book()
            _book_root_scatter(spec, book)
            for c in book.ops.values():
                add("scatter-batch", c, 1, steps)
        cat = lambda op: CATEGORY.get(op, "activation")  # noqa: E731
        sent = {c: 0 for c in ("data", "model", "activation")}
        messages = dict(sent)
        for op, c in ops.items():
            if cat(op) in sent:
                sent[cat(op)] += c.sent
                messages[cat(op)] += c.messages
        # the gradient all-reduces as the ring runs them (on GPU profiles: NCCL's protocols, chunktime)
        comm_s = (
            0.0
            if link is None
            else sum(
                sum(op_time(c, link, 0.0, ring_op(spec, op), spec.collectives == "auto").values())
                for op, c in ops.items()
                if CATEGORY.get(op) != "control"
            )
        )
        worst_s = max(worst_s, comm_s / max(steps, 1))
        ranks.append(
            {
                "rank": d,
                "coords": {"pp": 0, "dp": d, "tp": 0},
                "sent": sent,
                "messages": messages,
                "by_op": {
                    f"{cat(op)}/{op}": {"sent": c.sent, "messages": c.messages} for op, c in ops.items()
                },
            }
        )
    memory = [
        {
            "params": (dense + experts) * spec.prec.param,
            "grads": (dense + experts) * spec.prec.grad,
            "optimizer": (dense + experts) * opt,
            "activations_peak": round(
                max(activation_bytes(spec, micro, d, i % G) for i, micro in enumerate(per_step))
            ),
        }
        for d in range(D)
    ]
    compute_s = step_compute_s(spec, hw) if hw is not None else 0.0
    step_s = compute_s + worst_s
    return {
        "steps": steps,
        "layout": f"dp{D}xep{P}" if P > 1 else (f"dp{D}" if D > 1 else "serial"),
        "hardware": getattr(hw, "name", None),
        "comm": {
            "ranks": ranks,
            "per_step": {
                c: sum(r["sent"][c] for r in ranks) / max(steps, 1) for c in ("data", "model", "activation")
            },
            "per_rank_per_step_max": {
                c: max(r["sent"][c] for r in ranks) / max(steps, 1) for c in ("data", "model", "activation")
            },
        },
        "memory": {"ranks": memory, "max": {k: max(m[k] for m in memory) for k in memory[0]}},
        "bubble": 0.0,
        "time": {
            "step_s": step_s,
            "compute_s": compute_s,
            "comm_s": worst_s,
            "samples_per_s": spec.batch / step_s if step_s > 0 else float("inf"),
        },
        "routing": "measured" if routing is not None else f"balanced x {imbalance:g}",
        "link": None if link is None else {"name": link.name, "alpha_s": link.alpha, "bytes_per_s": link.bw},
        "params": {"non_expert": dense, "experts_per_rank": experts, "experts_total": experts * P},
        "capacity": micro_capacity(spec, 0),
    }


def step_compute_s(spec: Spec, hw) -> float:
    """Compute of the fullest rank's step, balanced routing without drops: per dense layer its rows,
    per MoE layer the router on its rows and its E/P experts on (B/D) K rows in all (what a rank's
    experts receive from its group); matmul FLOPs at the FLOP rate, the memory-bound rest
    (work.layer_work, the loss, the optimizer's sweeps) at the reduction's speed, and the profile's
    overhead per layer call -- the accounting simclock charges (model.py, moe.py, optim.py)."""
    D, P, E, K, G = spec.dp, spec.ep, spec.experts, spec.top_k, spec.grad_accum
    rows, moe = max(chunk(spec.batch, D, d) for d in range(D)), set(moe_layers(spec))
    flops = elems = calls = 0
    for i in range(spec.n_layers):
        w = layer_work(spec, i, "full")
        r, n_calls = (rows * K, E // P) if i in moe else (rows, 1)
        flops += (w["fwd_flops"] + w["bwd_flops"]) * r + (6 * rows * spec.widths[i] * E if i in moe else 0)
        elems += (w["fwd_elems"] + w["bwd_elems"]) * r + w["bwd_call_elems"] * n_calls * G
        calls += n_calls * G  # every micro-step calls every layer (and expert) again
    dense, experts = param_counts(spec)
    moved = elems * spec.prec.act + loss_bytes(spec) * rows + optimizer_bytes(spec, dense + experts)
    share, stream = (
        hw.compute_share(min(D, hw.devices_per_node)),
        hw.stream_share(min(D, hw.devices_per_node)),
    )
    return (
        flops / hw.flop_rate(spec.precision) + calls * hw.layer_overhead
    ) / share + moved * hw.gamma / 3 / stream
