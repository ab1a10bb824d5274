"""Binomial trees: the broadcast, and the tree all-reduce (binomial reduce + broadcast).

binomial broadcast    non-roots receive N once; see binomial_broadcast_rounds      [(p-1) N]
tree all-reduce       rank r sends ([r != 0] + c(r)) N; the root ceil(log2 p) N    [2(p-1) N]
"""

from __future__ import annotations

import numpy as np

from ..runtime.comm import Communicator
from .base import Rounds, _flat, new_tag, reduce_add, scratch


def binomial_broadcast_rounds(
    comm: Communicator,
    buf: np.ndarray,
    root: int,
    category: str,
    op: str = "broadcast",
    tag: int | None = None,
) -> Rounds:
    """Binomial tree: in round k every rank that already has the data sends it 2^k ranks further.

    With me = (r - root) mod p: a non-root receives N once, in the round d = 2^k with
    d <= me < 2d, from me - d; then it sends N to me + d' for every later round d' > me with
    me + d' < p. The root sends ceil(log2 p) messages; (p-1) N and p-1 messages in total.
    """
    p = comm.size
    if p == 1:
        return
    flat = _flat(buf)
    me = (comm.rank - root) % p  # position relative to the root
    tag = new_tag(comm) if tag is None else tag
    distance = 1
    while distance < p:
        if me < distance and me + distance < p:
            yield [comm.isend(flat, (me + distance + root) % p, category, op, tag)]
        elif distance <= me < 2 * distance:
            yield [comm.irecv(flat, (me - distance + root) % p, category, op, tag)]
        distance *= 2


def tree_allreduce_rounds(
    comm: Communicator, flat: np.ndarray, category: str, op: str = "allreduce"
) -> Rounds:
    """Binomial-tree reduce to rank 0, then binomial broadcast from rank 0 (Thakur et al. 2005, sec. 4).

    The reduce is the broadcast (collectives.binomial_broadcast_rounds) run backwards: for
    d = 2^(ceil(log2 p)-1), ..., 2, 1, ranks d..2d-1 send their partial sums to rank r - d, which
    adds them in. A rank has already collected its whole subtree (ranks r + d' for every larger
    d' > r) before it sends, so rank 0 ends with the total. Then the broadcast sends it back down.

    Cost of rank r, with c(r) = #{k >= 0 : 2^k > r and r + 2^k < p} (its children in the tree):
      sent = received = ([r != 0] + c(r)) N elements, in [r != 0] + c(r) messages; adds c(r) N.
    Rank 0 has c(0) = ceil(log2 p) children: it sends and receives ceil(log2 p) N. The whole
    buffer moves in every message, so no rank sends less than N (vs 2(p-1)/p N for the ring), but
    there are only 2 ceil(log2 p) rounds: the tree wins for small, latency-bound messages.
    All ranks together: 2(p-1) N elements in 2(p-1) messages (p-1 edges, each used twice).
    """
    p, me = comm.size, comm.rank
    if p == 1:
        return
    tag = new_tag(comm)  # both phases; their messages go opposite ways, never cross
    d = 1 << ((p - 1).bit_length() - 1)  # the largest power of two < p: the broadcast's last round
    has_children = me + (1 << me.bit_length()) < p  # c(me) > 0: the smallest 2^k > me fits
    with scratch.take(flat.size if has_children else 0, flat.dtype) as incoming:
        while d >= 1:
            if me < d and me + d < p:  # a child me + d sends its subtree's sum
                yield [comm.irecv(incoming, me + d, category, op, tag)]
                reduce_add(comm, flat, incoming)
            elif d <= me < 2 * d:  # my subtree is complete: pass it to my parent
                yield [comm.isend(flat, me - d, category, op, tag)]
            d //= 2
    yield from binomial_broadcast_rounds(comm, flat, 0, category, op, tag)
