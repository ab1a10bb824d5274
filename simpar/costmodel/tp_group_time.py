"""tp's blocking collectives rank by rank: where --collectives tree or ps leave a group's ranks apart.

collectives.tree_allreduce and ps_allreduce price ONE all-reduce on its critical path, as if every
rank of the group started it together and left it together. They do not leave together: the tree's
root (rank 0) is done alpha before the ranks its broadcast reaches last, the parameter server
(rank 0) replies to worker w after w-1 others, so worker 1 leaves (p-2) W before worker p-1 (W: one
message's bytes on the wire). tp's collectives block and follow one another closely, so the next one
starts from these uneven clocks -- the late ranks' messages find the early ones waiting, and a ring
all-gather after a tree (--sp, the loss's maximum) lets a late rank's left neighbour send early.
Summing the critical path per collective then overstates the step (gpt tp2 tree on dgx-h100: +2.7e-3;
tp4 ps on nodes of two devices: +4.7e-2).

So this module carries each rank's clock through each collective, with the simulated clock's rules
written down again (runtime/simclock.py: a message posted at t leaves when the rank's outgoing link is
free, is on the wire bytes / bw, arrives alpha later; a receive completes at max(when the rank gets to
it, the arrival); the sum after a receive costs its bytes x gamma; collectives/tree.py's and ps.py's
rounds). Nothing here imports them. Every function maps the ranks' start times to their end times; it
is shift-equivariant (all starts + x: all ends + x), so compute that every rank of the group does
alike may be added before or after a collective.

  tree, ps   allreduce_ends.allreduce_ends, as dp's and MoE's all-reduces are followed rank by rank:
             collectives/tree.py's rounds (binomial reduce to rank 0, binomial broadcast back); the
             server through ps_time.ps_bucket_ends with one bucket.
  ring       --sp's and the loss's all-gathers and reduce-scatters: ring_time.ring_ends (the rings
             ZeRO's step times follow round by round; on a GPU profile NCCL's protocol for the call).
Used by gpt_time.py, gpt_tp_group_pipeline.py, chunk_tp_group.py and MoE's moe_tp_rounds.py.
"""

from __future__ import annotations

from .ring_time import ring_ends


def group_ends(op: tuple, starts: list[float], algorithm: str, link, gamma: float) -> list[float]:
    """Each tp rank's end of one blocking tp collective `op` = (kind, elements, bytes per element),
    kind "all-reduce" (by `algorithm`: tree or ps), "all-gather" or "reduce-scatter" (the ring)."""
    kind, n, elem_bytes = op
    if kind != "all-reduce":
        return ring_ends(kind, n, elem_bytes, starts, [0.0] * len(starts), link, gamma)
    from .allreduce_ends import allreduce_ends  # here: it imports chunktime, which imports this module

    return allreduce_ends(algorithm, n, elem_bytes, starts, link, gamma)
