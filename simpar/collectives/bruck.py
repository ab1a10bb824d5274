"""Bruck's all-to-all with pieces of any size, on counted messages: the latency-optimal choice.

Bruck, Ho, Kipnis, Upfal & Weathersby 1997, "Efficient algorithms for all-to-all communications in
multiport message-passing systems", IEEE TPDS 8(11): the index algorithm, radix 2, one port.

Rank r of p holds one piece for every rank q (`send[q]`, any number of rows, possibly none). Number a
piece by its RELATIVE destination j = (q - r) mod p. The algorithm has three phases:

  1. rotation: rank r lines its pieces up by j, position j holding send[(r + j) % p] (here a list of
     references: nothing is copied);
  2. ceil(log2 p) rounds: in round k rank r sends, in ONE message to rank (r + 2^k) mod p, every
     piece at a position j whose bit k is set, and receives the same positions from rank
     (r - 2^k) mod p, which replace its own;
  3. inverse rotation: position j now holds the piece from rank (r - j) mod p; it becomes recv[(r - j)
     % p] as it is, a view of the fresh buffer its last round received it in (only rank r's own piece,
     which never moves, is copied).

Why bit k: a piece never changes position, and in round k it moves 2^k ranks on exactly when bit k of
its j is set. After all rounds it has moved sum of its bits = j ranks, from r to (r + j) mod p: its
destination. The piece at position j of rank r before round k left its source s = (r - (j mod 2^k))
mod p (it has made the moves of j's lower bits), bound for (s + j) mod p -- which is how every rank
knows the size of every piece it forwards or receives from `rows` alone.

Sizes: rows[s][q], the rows rank s sends rank q, for every s and q of the group. In expert parallelism
every rank already has them: the routing histograms it exchanged before the all-to-all
(`control/ep-histogram`, counted there) give every rank's kept assignments to every expert. So the
messages carry rows only, no size headers, and the byte count stays comparable with the pairwise
exchange (collectives/alltoall.py), which needs only the sizes of its own receives.

Cost of rank r, with m[s][q] = rows[s][q] x row elements:
  messages   ceil(log2 p)   (pairwise: p - 1) -- latency alpha log2 p instead of alpha (p - 1)
  sent       sum over rounds k, over j in 1..p-1 with bit k set, of m[s][(s + j) % p],
             s = (r - (j mod 2^k)) mod p
Equal pieces of m elements: popcount(1) + ... + popcount(p-1) pieces of m, which is (p/2) log2 p m for
p a power of two (pairwise: (p-1) m): each piece travels popcount(j) hops instead of one, the
bandwidth paid for the fewer messages. Round k's message is never empty of positions (2^k < p), but
may be of rows; it is still sent and counted, so message counts never depend on the data.
"""

from __future__ import annotations

import numpy as np

from ..runtime.comm import Communicator
from .base import Rounds, new_tag


def bruck_rounds(p: int) -> int:
    """ceil(log2 p): the rounds (and messages per rank) of Bruck's all-to-all."""
    return (p - 1).bit_length()


def bruck_alltoall_rounds(
    comm: Communicator,
    send: list[np.ndarray],
    recv: list,
    rows: list[list[int]],
    category: str,
    op: str,
) -> Rounds:
    """Set recv[q] (a list of p slots) to what rank q sent this rank (module doc)."""
    p, r = comm.size, comm.rank
    held = [send[(r + j) % p] for j in range(p)]  # phase 1: position j -> destination (r + j) % p
    tag = new_tag(comm)
    row_shape, dtype = send[0].shape[1:], send[0].dtype
    for k in range(bruck_rounds(p)):  # phase 2
        hop = 1 << k
        moving = [j for j in range(1, p) if j & hop]
        to, frm = (r + hop) % p, (r - hop) % p
        # the pieces arriving from frm: its position j left source (frm - j mod 2^k) bound for source + j
        sources = [(frm - j % hop) % p for j in moving]
        arriving = [rows[s][(s + j) % p] for s, j in zip(sources, moving)]
        inbox = np.empty((sum(arriving), *row_shape), dtype)  # fresh: never aliases a later round
        # one message: the pieces side by side (a single piece goes as it is: it is contiguous already)
        outgoing = held[moving[0]] if len(moving) == 1 else np.concatenate([held[j] for j in moving])
        yield [
            comm.irecv(inbox, frm, category, op, tag),  # receive posted first (see base.Pending)
            comm.isend(outgoing, to, category, op, tag),
        ]
        start = 0  # cut the inbox into its pieces (plain slices: np.split costs microseconds a call)
        for j, n in zip(moving, arriving):
            held[j], start = inbox[start : start + n], start + n
    recv[r] = send[r].copy()  # phase 3: position j holds the piece from rank (r - j) % p
    for j in range(1, p):
        recv[(r - j) % p] = held[j]
