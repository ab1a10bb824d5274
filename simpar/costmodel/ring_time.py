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
takes the group's link (hardware.group_link): exact, since --clock sim refuses a placement whose
groups' messages would not all take one link (run/setup.check_placement).
"""

from __future__ import annotations

import numpy as np

from .collectives import chunk


def ring_ends(kind: str, n: int, bpe: int, starts: list[float], link_free: list[float], link, gamma) -> list:
    """When each of p ranks ends a blocking ring reduce-scatter or all-gather ("reduce-scatter" or
    "all-gather") of n elements of bpe bytes that rank r starts at starts[r] (module docstring);
    link_free[r]: when r's outgoing link is free (updated in place). The p ranks of a round are one
    NumPy array each (element r: rank r), so a plan of hundreds of ranks stays quick."""
    p = len(starts)
    sizes = np.array([chunk(n, p, i) * bpe for i in range(p)], dtype=float)
    alpha, bw, cursor = link.alpha, link.bw, np.array(starts, dtype=float)
    tuning = getattr(link, "tuning", None)
    if tuning is not None and tuning.proto:  # NCCL's protocol for this call (simclock.collective_timing)
        timing = tuning.choose(kind, -(-n // p) * bpe, nvls=False)
        alpha, bw, cursor = timing.hop, timing.bw, cursor + timing.base
    scatter = kind == "reduce-scatter"
    ranks, free = np.arange(p), np.array(link_free, dtype=float)
    for k in range(p - 1):
        # the chunk rank r sends in round k (ring.py): reduce-scatter passes partial sums of chunk
        # r-k-1, all-gather passes on the finished chunk r-k
        sent = (ranks - k - 1) % p if scatter else (ranks - k) % p
        free = np.maximum(cursor, free) + sizes[sent] / bw  # its send has left
        arrive = free + alpha
        # the round ends when its own send has left and its left neighbour's (rank r-1) has arrived
        cursor = np.maximum(np.maximum(cursor, free), np.roll(arrive, 1))
        if scatter:  # the chunk received (the left neighbour's) is added in
            cursor = cursor + sizes[np.roll(sent, 1)] * gamma
    link_free[:] = free.tolist()
    return cursor.tolist()
