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

  tree   binomial reduce to rank 0 (level d = 2^(ceil(log2 p)-1) .. 1: ranks d..2d-1 send to r - d,
         which waits for the message, then adds n bytes x gamma), binomial broadcast from rank 0
         (distance 1, 2, 4, ..: ranks r < distance send to r + distance). Sends take W, arrivals W + alpha.
  ps     ps_time.ps_bucket_ends with one bucket.
  ring   --sp's and the loss's all-gathers and reduce-scatters: ring_time.ring_ends (the rings ZeRO's
         step times follow round by round; on a GPU profile NCCL's protocol for the call).
"""

from __future__ import annotations

from .ps_time import ps_bucket_ends
from .ring_time import ring_ends


def tree_ends(starts: list[float], nbytes: float, link, gamma: float) -> list[float]:
    """Each rank's end of a binomial-tree all-reduce of `nbytes` (module docstring), from its start."""
    p, t = len(starts), list(starts)
    wire = nbytes / link.bw
    d = 1 << ((p - 1).bit_length() - 1)
    while d >= 1:  # the reduce: senders d..2d-1 are done with it once their message has left
        for me in range(min(d, p - d)):
            arrival = t[me + d] + wire + link.alpha
            t[me + d] += wire
            t[me] = max(t[me], arrival) + nbytes * gamma
        d //= 2
    d = 1
    while d < p:  # the broadcast: ranks < d hold the sum, each sends it d further
        for me in range(min(d, p - d)):
            t[me + d] = max(t[me + d], t[me] + wire + link.alpha)
            t[me] += wire
        d *= 2
    return t


def ps_ends(starts: list[float], nbytes: float, link, gamma: float) -> list[float]:
    """Each rank's end of a parameter-server all-reduce (rank 0 the server): ps_time's one bucket."""
    return ps_bucket_ends([[s] for s in starts], [nbytes], link, gamma)


def group_ends(op: tuple, starts: list[float], algorithm: str, link, gamma: float) -> list[float]:
    """Each tp rank's end of one blocking tp collective `op` = (kind, elements, bytes per element),
    kind "all-reduce" (by `algorithm`: tree or ps), "all-gather" or "reduce-scatter" (the ring)."""
    kind, n, elem_bytes = op
    if kind != "all-reduce":
        return ring_ends(kind, n, elem_bytes, starts, [0.0] * len(starts), link, gamma)
    return {"tree": tree_ends, "ps": ps_ends}[algorithm](starts, n * elem_bytes, link, gamma)
