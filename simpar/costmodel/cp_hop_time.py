"""One block's cp attention when the C ranks of a cp group reach it at different times: every rank
followed hop by hop, as ring_time.py follows ZeRO's rings round by round.

cp_time.ring_seconds and ulysses_seconds price a block for ranks that start it together. Under
--cp --zero 2|3 they do not: when p = dp C does not divide a unit, ZeRO's rings end a few elements'
time apart on different ranks (ring_time.py), and a hop that waits for its left neighbour's message
waits on a late neighbour. The same messages and the same simulated clock as cp_time.py's docstring
(parallel/context_attention.py posts them; simclock.py times them: a send leaves when its rank posts
it, its link being free by then, and arrives alpha after its last byte has left), with c_r the
clock of rank r and c_{r-1} its left neighbour's, f, g, w_kv, w_dkv as cp_time.ring_parts:

  ring forward, hop t < C-1   c_r <- max(c_r + k_t f, c_{r-1} + w_kv + alpha)         (own send:
                                                                    c_r + w_kv, never the latest)
               last hop       c_r <- c_r + k_{C-1} f
  ring backward, hop 0        c_r <- max(c_r + 3 g, c_{r-1} + w_kv + alpha)
               0 < t < C-1    d_r = max(c_r + 2 g, c_r + w_kv) + w_dkv  (its dK/dV send leaves)
                              c_r <- max(d_r, c_{r-1} + w_kv + alpha, d_{r-1} + alpha)
               t = C-1        d_r = c_r + 2 g + w_dkv;   c_r <- max(d_r, d_{r-1} + alpha)
  Ulysses: each all-to-all's round j = 1..C-1 (collectives/alltoall.py: rank r sends to r+j and
  receives from r-j), blocking:  c_r <- max(c_r + w, c_{r-j} + w + alpha), w one piece's time;
  the core (a/C heads over all s tokens) takes the same time on every rank of the group, so where it
  sits between the four all-to-alls does not change when a rank ends (every step above is a max of
  the clocks plus constants).

With equal starts each of these is cp_time's sum (tests/unit/costmodel/test_cp_hop_time.py).
"""

from __future__ import annotations

import numpy as np

from .cp_time import RING_BLOCKS_FIRST, RING_BLOCKS_OTHER, ring_parts, ulysses_parts


def attention_ends(
    algo: str, starts, b: int, n: int, h: int, a: int, bpe: int, rate: float, stream: float, link, backward
) -> list:
    """When each rank of one cp group (C = len(starts) ranks, rank r starting at starts[r]) ends one
    block's attention, forward or backward (module docstring); b n h: its rows and width, a heads."""
    C, c = len(starts), np.array(starts, dtype=float)
    left = lambda x, j=1: np.roll(x, j)  # element r: rank r - j's
    if algo != "ring":
        piece, core_f, core_b = ulysses_parts(b, n, h, a, C, bpe, rate, stream, link)
        for _ in range(4):  # four all-to-alls each way (cp_time.py's docstring)
            for j in range(1, C):
                c = np.maximum(c + piece, left(c, j) + piece + link.alpha)
        return (c + (core_b if backward else core_f)).tolist()
    f, g, w_kv, w_dkv = ring_parts(b, n, h, a, bpe, rate, stream, link)
    blocks = [RING_BLOCKS_FIRST] + [RING_BLOCKS_OTHER] * (C - 1)
    if not backward:
        for k in blocks[:-1]:
            c = np.maximum(c + k * f, left(c) + w_kv + link.alpha)
        return (c + blocks[-1] * f).tolist()
    if C > 1:
        c = np.maximum(c + blocks[0] * g, left(c) + w_kv + link.alpha)
    for k in blocks[1:-1]:
        sent = np.maximum(c + k * g, c + w_kv) + w_dkv  # the dK/dV send waits for the K/V send
        c = np.maximum(np.maximum(sent, left(c) + w_kv + link.alpha), left(sent) + link.alpha)
    sent = c + blocks[-1] * g + w_dkv  # the partial sums go home
    return np.maximum(sent, left(sent) + link.alpha).tolist()
