"""One step in time, in closed form: compute, collectives, the pipeline schedule, overlapped buckets.

Costs are the alpha-beta-gamma model (Thakur, Rabenseifner & Gropp 2005) on a hardware profile:
a collective costs rounds x alpha + bytes on its critical path x beta + bytes reduced x gamma on
its group's link; compute is matmul FLOPs / FLOP rate plus memory-bound bytes x gamma / 3 plus a
per-layer call overhead (rank.layer_work says which bytes). Ranks that share cores compute slower.

How they add up -- the rules simpar's execution follows, written down as max-plus recurrences
(the cost model never runs the code it predicts):

* A stage does its micro-batches in its schedule's order (`stage_order`: naive, GPipe, 1F1B).
  A forward of micro-batch m starts when the stage is free and m's activations have arrived; a
  backward when the stage is free and m's output gradient has arrived. Tensor-parallel f and g
  all-reduces block inside the layer that needs them.
* A message of n bytes leaves when the stage's outgoing link is free (its activations forward and
  gradients back go out one after another), stays n x beta on the wire and arrives alpha later:
  the latency of a hop is paid on the critical path, not per micro-batch. At the end of its schedule a
  stage waits for its sends to leave.
* Data parallelism (DDP): each gradient bucket's all-reduce starts as soon as backward has
  finished its layers (in the last micro-batch of the last accumulation step), on the dp group's
  stream, one bucket after another; the rank waits for the last one after backward (Li et al.
  2020, sec. 3.2). ZeRO's collectives block: they add up.
* Gradient accumulation repeats the schedule K times; then the optimizer sweeps its parameters.
  The step ends when the slowest rank has finished (the loss all-reduce synchronises the ranks).
"""

from __future__ import annotations

from .collectives import ALLREDUCE, Cost, to_bytes
from .rank import layer_work, loss_bytes, optimizer_bytes
from .spec import Spec, dp_bucket_layers, micro_rows


def op_time(cost: Cost, link, gamma: float) -> dict:
    """Latency + bandwidth + reduction terms of one op on the critical path (Thakur et al. 2005)."""
    return {
        "latency": cost.rounds * link.alpha,
        "bandwidth": cost.round_elems * link.beta,
        "reduction": cost.reduced * gamma,
    }


def seconds(cost: Cost, link, gamma: float) -> float:
    return sum(op_time(cost, link, gamma).values())


def stage_order(schedule: str, S: int, M: int, s: int) -> list[tuple[str, int]]:
    """The order of forwards ("F", m) and backwards ("B", m) on stage s.

    naive: F0 B0 F1 B1 ...; GPipe (Huang et al. 2019): all forwards, then all backwards;
    1F1B (PipeDream-Flush, Narayanan et al. 2021): min(S-s-1, M) warm-up forwards, then one forward
    and one backward (of the oldest micro-batch) in turn, then the remaining backwards."""
    if S == 1 or schedule == "naive":
        return [op for m in range(M) for op in (("F", m), ("B", m))]
    if schedule == "gpipe":
        return [("F", m) for m in range(M)] + [("B", m) for m in range(M)]
    w = min(S - s - 1, M)
    steady = [op for i in range(M - w) for op in (("F", w + i), ("B", i))]
    return [("F", m) for m in range(w)] + steady + [("B", m) for m in range(M - w, M)]


class RankCosts:
    """Seconds of one rank's work: per micro-batch forward and backward (compute + blocking tensor-
    parallel all-reduces), the backward split by layer (for the gradient buckets), the optimizer."""

    def __init__(self, spec: Spec, hw, links: dict, rank_pred: dict, kinds: list, sizes: list):
        self.spec, self.hw, self.links = spec, hw, links
        share = hw.compute_share(min(spec.world, hw.devices_per_node))
        self.rate = hw.flop_rate(spec.precision) * share
        self.stream = hw.gamma / 3 / share  # seconds per byte of memory-bound work
        self.overhead = hw.layer_overhead / share
        self.lo, self.hi = rank_pred["layers"]
        self.t = rank_pred["coords"]["tp"]
        self.kinds, self.sizes = kinds, sizes
        self.works = [layer_work(spec, i, k) for i, k in zip(range(self.lo, self.hi), kinds)]
        self.optimizer_s = optimizer_bytes(spec, rank_pred["params_updated"]) * self.stream

    def _tp(self, n: int) -> float:
        cost = ALLREDUCE[self.spec.collectives](n, self.spec.tp, self.t)
        return (
            seconds(to_bytes(cost, self.spec.prec.act), self.links["tp"], self.hw.gamma)
            if cost.messages
            else 0.0
        )

    def forward(self, r: int) -> float:
        W, bpe, out = self.spec.widths, self.spec.prec.act, 0.0
        for i, kind, w in zip(range(self.lo, self.hi), self.kinds, self.works):
            out += r * w["fwd_flops"] / self.rate + r * w["fwd_elems"] * bpe * self.stream + self.overhead
            if kind == "row":  # g: the partial products summed in forward
                out += self._tp(r * W[i + 1])
        if self.hi == self.spec.n_layers:
            out += r * loss_bytes(self.spec) * self.stream
        return out

    def backward_layers(self, r: int) -> list[tuple[float, float]]:
        """(compute, f all-reduce after it) of each layer in backward order, last layer first."""
        W, bpe, out = self.spec.widths, self.spec.prec.act, []
        for i, kind, w in reversed(list(zip(range(self.lo, self.hi), self.kinds, self.works))):
            compute = (
                r * w["bwd_flops"] / self.rate
                + (r * w["bwd_elems"] + w["bwd_call_elems"]) * bpe * self.stream
            )
            f = self._tp(r * W[i]) if kind == "column" and i > 0 else 0.0
            out.append((compute, f))
        return out

    def backward(self, r: int) -> float:
        return sum(c + f for c, f in self.backward_layers(r))

    def bucket_seconds(self, s_sizes: list, d: int) -> list[tuple[list[int], float]]:
        """DDP buckets (layer positions, all-reduce seconds) over the dp group; none without dp."""
        spec = self.spec
        if spec.dp == 1 or spec.zero:
            return []
        out = []
        for layers in dp_bucket_layers(s_sizes, spec.prec.grad, spec.bucket_mb):
            cost = ALLREDUCE[spec.collectives](sum(s_sizes[i] for i in layers), spec.dp, d)
            out.append((layers, seconds(to_bytes(cost, spec.prec.grad), self.links["dp"], self.hw.gamma)))
        return out


def dp_end(costs: RankCosts, buckets: list, backward_start: float, r: int) -> float:
    """When the last gradient bucket's all-reduce ends, buckets starting as backward (of r rows,
    starting at backward_start) finishes their layers, one after another on the dp stream."""
    n_local = costs.hi - costs.lo
    ready_at, t = {}, backward_start
    for pos, (compute, f) in zip(reversed(range(n_local)), costs.backward_layers(r)):
        t += compute
        ready_at[pos] = t  # the hook fires before the layer's f all-reduce
        t += f
    if not costs.spec.overlap:  # --no-overlap: every bucket starts once backward is done
        ready_at = dict.fromkeys(ready_at, t)
    end = backward_start
    for layers, secs in buckets:
        end = max(end, max(ready_at[i] for i in layers)) + secs
    return end


def step_time(spec: Spec, hw, links: dict, stage_costs: dict, zero_dp_s: float, starts: list) -> dict:
    """Run the recurrences for one step. `stage_costs[s]` = (RankCosts, dp index, layer sizes) of the
    slowest rank of stage s; `zero_dp_s` the blocking ZeRO collectives of a rank (0 without ZeRO);
    `starts[s]` when stage s has its data (predict.data_ready)."""
    S, K, M = spec.pp, spec.grad_accum, spec.microbatches_used
    W, bpe, pp = spec.widths, spec.prec.act, links["pp"]
    clock = list(starts)
    busy = [0.0] * S
    dp_exposed = 0.0
    for k in range(K):
        last_k = k == K - 1
        rows = [micro_rows(spec, stage_costs[s][1])[k] for s in range(S)]
        order = [stage_order(spec.schedule, S, M, s) for s in range(S)]
        pos = [0] * S
        act_at, grad_at = {}, {}  # (stage, m) -> arrival of its input / output gradient
        link, left = [0.0] * S, [0.0] * S  # each stage's outgoing link, and when its last send left
        last_b_start = [0.0] * S
        progress = True
        while progress:
            progress = False
            for s in range(S):
                costs = stage_costs[s][0]
                lo, hi = costs.lo, costs.hi
                while pos[s] < len(order[s]):
                    kind, m = order[s][pos[s]]
                    r = rows[s][m]
                    need = act_at if kind == "F" else grad_at
                    waits = (kind == "F" and s > 0) or (kind == "B" and s < S - 1)
                    if waits and (s, m) not in need:
                        break  # its input has not been sent yet: let the other stages move
                    start = max(clock[s], need[(s, m)]) if waits else clock[s]
                    work = costs.forward(r) if kind == "F" else costs.backward(r)
                    clock[s], busy[s] = start + work, busy[s] + work
                    if kind == "B":
                        last_b_start[s] = start
                    if kind == "F" and s < S - 1:  # send the activations on to stage s+1
                        wire = r * W[hi] * bpe * pp.beta
                        depart = max(clock[s], link[s])
                        link[s] = left_s = depart + wire
                        act_at[(s + 1, m)] = left_s + pp.alpha
                        left[s] = max(left[s], left_s)
                    if kind == "B" and s > 0:  # send the input gradient back to stage s-1
                        wire = r * W[lo] * bpe * pp.beta
                        depart = max(clock[s], link[s])
                        link[s] = left_s = depart + wire
                        grad_at[(s - 1, m)] = left_s + pp.alpha
                        left[s] = max(left[s], left_s)
                    pos[s] += 1
                    progress = True
        for s in range(S):
            costs, d, sizes = stage_costs[s]
            if last_k:  # the buckets of the last backward of the last accumulation step
                buckets = costs.bucket_seconds(sizes, d)
                if buckets:
                    last_m = [m for kind, m in order[s] if kind == "B"][-1]
                    end = dp_end(costs, buckets, last_b_start[s], rows[s][last_m])
                    dp_exposed = max(dp_exposed, end - clock[s])
                    clock[s] = max(clock[s], end)
            clock[s] = max(clock[s], left[s])
    ends = [clock[s] + zero_dp_s + stage_costs[s][0].optimizer_s for s in range(S)]
    return {"makespan": max(ends), "busiest": max(busy), "dp_exposed": max(0.0, dp_exposed) + zero_dp_s}
