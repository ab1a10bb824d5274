"""The p ranks of one blocking ring reduce-scatter or all-gather, followed round by round: when each
rank ends it. Shared by the ZeRO step times (zero_time.py for mlp/resmlp, gpt_zero_time.py for gpt).

Chunks are np.array_split's (collectives.chunk): when p does not divide n, the first ranks' chunks are
one element longer, so a ring's rounds wait on their neighbours' larger messages and the ranks' clocks
drift apart; summing one rank's own costs (max of sums) misses that (sum of maxes). So every rank is
followed, each round as collectives/ring.py runs it and the simulated clock times it (simclock.py): in
round k rank r sends a chunk to r+1 when its outgoing link is free (bytes / bandwidth on the wire,
alpha later there), the round ends when its own send has left and its left neighbour's has arrived,
then the received chunk is added in (reduce-scatter only: bytes x gamma; free on a GPU, where the
reduction runs inside the copy). On a GPU profile the ring runs as NCCL's tuner picks for ceil(n/p)
elements a step (its base latency once, its per-step latency and bandwidth: nccl.py). Every message
takes the group's link (hardware.group_link): exact while each node holds as many of the group's ranks
as the others (a rank alone on a part-filled node gets more of its NICs).
"""

from __future__ import annotations

from .collectives import chunk


def ring_ends(kind: str, n: int, bpe: int, starts: list[float], link_free: list[float], link, gamma) -> list:
    """When each of p ranks ends a blocking ring reduce-scatter or all-gather ("reduce-scatter" or
    "all-gather") of n elements of bpe bytes that rank r starts at starts[r] (module docstring);
    link_free[r]: when r's outgoing link is free (updated in place)."""
    p = len(starts)
    sizes = [chunk(n, p, i) * bpe for i in range(p)]
    alpha, bw, cursor = link.alpha, link.bw, list(starts)
    tuning = getattr(link, "tuning", None)
    if tuning is not None and tuning.proto:  # NCCL's protocol for this call (simclock.collective_timing)
        timing = tuning.choose(kind, -(-n // p) * bpe, nvls=False)
        alpha, bw, cursor = timing.hop, timing.bw, [t + timing.base for t in starts]
    scatter = kind == "reduce-scatter"
    for k in range(p - 1):
        # the chunk r sends in round k (ring.py): reduce-scatter passes partial sums of chunk r-k-1,
        # all-gather passes on the finished chunk r-k
        sent = [(r - k - 1) % p if scatter else (r - k) % p for r in range(p)]
        arrive = []
        for r in range(p):
            link_free[r] = max(cursor[r], link_free[r]) + sizes[sent[r]] / bw
            arrive.append(link_free[r] + alpha)
        for r in range(p):
            cursor[r] = max(cursor[r], link_free[r], arrive[(r - 1) % p])
            if scatter:  # the chunk received (the left neighbour's) is added in
                cursor[r] += sizes[sent[(r - 1) % p]] * gamma
    return cursor
