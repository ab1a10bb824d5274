"""The step time of `simpar train --zero 1|2|3` (mlp and resmlp) in closed form, every data-parallel rank
followed through every ring round, as the simulated clock charges the real run. ZeRO's collectives are
written again here from the algorithm (parallel/zero.py is never called): blocking ring reduce-scatters
of the gradients and all-gathers of the parameters on the dp group (Rajbhandari et al. 2020, sec. 7),
each where the algorithm runs it; what a unit's compute costs is chunktime.RankCosts'.

  stage 1  the K micro-steps compute as plain data parallelism without traffic (forward, loss,
           backward); then one reduce-scatter of the whole flat gradient (P elements), the optimizer
           on this rank's chunk of P, one all-gather of the whole flat parameter vector
  stage 2  each unit's backward in the LAST micro-step is followed by the reduce-scatter of that
           unit's gradient; the optimizer on this rank's chunks of every unit (S_r elements); then
           one all-gather per unit, in unit order
  stage 3  every micro-step gathers each unit before its forward and again before its backward, and
           reduce-scatters its gradient right after that backward; the optimizer on S_r, no gather back

Why every rank: a unit of n elements splits np.array_split-wise over p ranks (the last resmlp/mlp layer's
1,290 parameters: 323/323/322/322 over 4), so in each ring round a rank waits for its left neighbour's
chunk, which may be the longer one, and ranks with longer chunks reach the next collective later. One
rank's own costs summed (what steptime.py does for the other layouts) is then a max of sums where the
clock takes a sum of maxes; ring_time.ring_ends follows all p ranks round by round. The step ends with
the slowest rank (the loss all-reduce synchronises them).
"""

from __future__ import annotations

from .chunktime import collective_gamma
from .ring_time import ring_ends
from .spec import Spec, micro_rows
from .steptime import TIMELINE_PARTS


def zero_steps(spec: Spec, hw, links: dict, rank_costs: dict, sizes: list[int], starts: list[float]) -> dict:
    """{d: {makespan, dp_exposed, critical_stage, parts}} of a --zero step, for each dp rank d (in
    steptime.step_time's shape). `rank_costs[d]`: rank d's chunktime.RankCosts (here tp = pp = 1: one
    chunk, the whole model; ZeRO-1 with --tp/--pp is zero_mesh_time.py's); `sizes`: the units' element
    counts; `starts[0]`: when the ranks have their data (predict.data_ready)."""
    p, stage, K = spec.dp, spec.zero, spec.grad_accum
    costs = [rank_costs[d] for d in range(p)]
    link, gamma, prec = links["dp"], collective_gamma(hw), spec.prec
    clock, link_free, compute = [starts[0]] * p, [0.0] * p, [0.0] * p

    def work(seconds: list[float]) -> None:  # each rank's own compute, no waiting
        for d in range(p):
            clock[d] += seconds[d]
            compute[d] += seconds[d]

    def ring(kind: str, n: int) -> None:  # blocking: every rank leaves it at its own end
        if p > 1:
            bpe = prec.grad if kind == "reduce-scatter" else prec.param
            clock[:] = ring_ends(kind, n, bpe, clock, link_free, link, gamma)

    rows = [micro_rows(spec, d) for d in range(p)]
    for k in range(K):
        r = [sum(rows[d][k]) for d in range(p)]  # one micro-batch per micro-step (no pipeline)
        first = k == 0  # the step's first backward writes its gradients (work.first_grads)
        if stage == 1:
            work([c.forward(r[d]) + c.backward(r[d], first) for d, c in enumerate(costs)])
            continue
        forward = [c.forward_layers(r[d]) for d, c in enumerate(costs)]
        backward = [c.backward_layers(r[d], first) for d, c in enumerate(costs)]  # last unit first
        for i, n in enumerate(sizes):
            if stage == 3:  # gathered before its forward
                ring("all-gather", n)
            work([f[i] for f in forward])
        work([c.loss(r[d]) for d, c in enumerate(costs)])
        work([c.recompute(r[d]) for d, c in enumerate(costs)])  # none: --recompute needs --pp
        for j, i in enumerate(reversed(range(len(sizes)))):
            if stage == 3:  # gathered again for its backward
                ring("all-gather", sizes[i])
            work([b[j][0] + b[j][1] for b in backward])  # (compute, tp all-reduce: none here)
            if stage == 3 or k == K - 1:  # its gradient, as its backward ends
                ring("reduce-scatter", sizes[i])
    optimizer = [c.optimizer_s for c in costs]  # its own chunk: of P (stage 1) or of every unit (S_r)
    if stage == 1:
        ring("reduce-scatter", sum(sizes))
        work(optimizer)
        ring("all-gather", sum(sizes))
    else:
        work(optimizer)
        for n in sizes if stage == 2 else ():
            ring("all-gather", n)
    waited = [clock[d] - starts[0] - compute[d] for d in range(p)]  # in a collective or for a neighbour
    out = {}
    for d in range(p):
        parts = dict.fromkeys(TIMELINE_PARTS, 0.0)
        parts.update(compute=compute[d], dp=waited[d], data=starts[0])
        out[d] = {"makespan": clock[d], "dp_exposed": max(waited), "critical_stage": 0, "parts": parts}
    return out
