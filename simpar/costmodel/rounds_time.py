"""Every rank of a data-parallel group through every round of its gradient buckets' all-reduces.

steptime.dp_end prices one rank's buckets with that rank's own critical path (collectives.ALLREDUCE).
That is exact while the ranks are alike; it is not when p does not divide a bucket (np.array_split's
chunks differ by an element, so a ring round waits on the neighbour's bigger chunk), when the ranks'
backward passes end at different times (uneven rows), or when the algorithm's rounds are not the same
for every rank (a binomial tree on p = 3: the root takes in two messages through its one port in the
same round; the parameter server: ps_time.py). Then the closed form follows every rank, as
gpt_zero_time.py does for ZeRO's rings, with the simulated clock's rules written down again (nothing
imported from runtime/ or collectives/):

  * a collective starts on a rank when it was started there and the previous one on the group's
    stream has ended; each round's sends leave one after another through the rank's one outgoing
    port (bytes / bw each) and arrive alpha later; the messages a round receives come in one after
    another through its one incoming port, in the order they left (simclock.receive_round);
  * a round ends when its own sends have left and its receives have arrived; then what it received
    is added in (bytes x gamma; 0 on GPUs, where the copy reduces).

One all-reduce of any algorithm, every rank from its own start, is allreduce_ends.py's (its
tree_program and rabenseifner_program say which rank sends what to whom; the ring goes through
moe_rounds.ring_allreduce_ends, NCCL's protocol for the call on GPU profiles; the parameter server
through ps_time.ps_bucket_ends); this file strings a dp group's buckets one after another.
"""

from __future__ import annotations

import numpy as np

from .allreduce_ends import allreduce_ends


def bucket_ends(algorithm: str, starts: list, bucket_elems: list, bpe: int, link, gamma: float) -> list:
    """Each rank's end of its last bucket's all-reduce: `starts[r][k]` when rank r may start bucket k
    (its layers' gradients are ready), one bucket after another on the dp stream (a bucket starts on a
    rank when the last one ended there: ps_time.py's rule too); `bucket_elems[k]`: its elements."""
    ends = [float("-inf")] * len(starts)
    for k, n in enumerate(bucket_elems):
        ends = allreduce_ends(algorithm, n, bpe, [max(s[k], e) for s, e in zip(starts, ends)], link, gamma)
    return ends


def ddp_steps(spec, hw, links: dict, stages_of: dict, timed: dict, starts: list) -> dict:
    """The MLP's step (steptime.step_time per dp index d: `timed[d]`, from `stages_of[d]`, data ready at
    `starts`) again, each stage's DDP buckets followed on every dp rank of the stage together
    (bucket_ends) instead of on each rank's own critical path. No ZeRO (its collectives block)."""
    from .chunktime import collective_gamma
    from .steptime import step_time

    streams = {d: [0.0] * spec.pp for d in timed}
    for s in range(spec.pp):
        elems = timed[0]["dp_elems"][s]
        if not elems:
            continue
        ready = [timed[d]["dp_ready"][s] for d in range(spec.dp)]
        algo, rest = spec.collectives, (elems, spec.prec.grad, links["dp"], collective_gamma(hw))
        if isinstance(ready[0][0], np.ndarray):
            # a stage whose chunks followed every tp rank (costs.tp_group): its buckets' starts are per
            # tp rank, and tp index j's dp group is the ranks (d, j): each group followed on its own
            per_j = [bucket_ends(algo, [[at[j] for at in r] for r in ready], *rest) for j in range(spec.tp)]
            ends = [np.array(e) for e in zip(*per_j)]
        else:
            ends = bucket_ends(algo, ready, *rest)
        for d in timed:
            streams[d][s] = ends[d]
    return {d: step_time(spec, hw, links, stages_of[d], 0.0, starts, streams[d]) for d in timed}
