"""Rabenseifner's all-reduce: recursive-halving reduce-scatter + recursive-doubling all-gather, any p.

How it compares with the others (alpha-beta view, Thakur, Rabenseifner & Gropp 2005, "Optimization
of Collective Communication Operations in MPICH", IJHPCA 19(1)); all move 2(p-1) N in total:

  algorithm       rounds          busiest rank sends     spread
  ring            2(p-1)          2(p-1)/p N             even: every rank the same (+-2 elements)
  rabenseifner    2 log2 p        2(p-1)/p N             even, for p a power of two
  tree            2 ceil(log2 p)  ceil(log2 p) N (root)  the root and its near ranks carry the most
  ps              2               (p-1) N (rank 0)       all on the server: it is the bottleneck
  mpi             (hidden)        booked as the ring     MPI_Allreduce; ledger marks it "modeled"
"""

from __future__ import annotations

import numpy as np

from ..runtime.comm import Communicator
from .base import Rounds, new_tag, offsets, reduce_add, scratch


def rabenseifner_allreduce_rounds(
    comm: Communicator, flat: np.ndarray, category: str, op: str = "allreduce"
) -> Rounds:
    """Recursive-halving reduce-scatter, then recursive-doubling all-gather.

    Rabenseifner 2004 ("Optimization of collective reduction operations", ICCS); Thakur,
    Rabenseifner & Gropp 2005, sec. 4.4. Let q = the largest power of two <= p, e = p - q,
    L = log2 q, and cut N into q blocks b_0..b_(q-1) (np.array_split(N, q)).

    1. Fold (only if p is not a power of two): among ranks 0..2e-1, each odd rank sends all N to
       the even rank below it, which adds it in. Now q ranks remain -- the evens below 2e and every
       rank >= 2e -- renumbered m = r/2 and m = r - e.
    2. Reduce-scatter by recursive halving: for d = q/2, q/4, ..., 1, rank m exchanges with m XOR d.
       Both hold the same range of blocks; the one with bit d clear keeps the lower half and sends
       the upper, the other the reverse; each adds what it receives to the half it keeps. After L
       steps rank m holds the full sum of block b_m.
    3. All-gather by recursive doubling: for d = 1, 2, ..., q/2, exchange the range held (2^k blocks
       at step k) with m XOR d; the ranges double until everyone holds all q blocks.
    4. Unfold: each even rank below 2e sends the result (all N) to the odd rank above it.

    Cost of a rank m of step 2-3, with R_k(m) = the 2^k blocks starting at (m >> k) << k (the
    range it keeps after the halving step with d = 2^k, and holds before the doubling step d = 2^k):
      sent = received = (N - b_m) + sum_{k=0..L-1} |R_k(m)|       (= 2(q-1)/q N when q divides N)
      messages 2L; it adds up sum_k |R_k(m)| elements (what it receives while halving).
    Folding ranks: even r < 2e: +N sent, +N received, +1 message, +N added up;
      odd r < 2e: only N sent, N received, 1 message, nothing added.
    All ranks together: 2(q-1) N + 2e N = 2(p-1) N elements, 2Lq + 2e messages.
    """
    p, r, n = comm.size, comm.rank, flat.size
    if p == 1:
        return
    tag = new_tag(comm)
    q = 1 << (p.bit_length() - 1)
    e = p - q
    if r < 2 * e and r % 2:  # an odd folding rank: hand over the data, wait for the sum
        yield [comm.isend(flat, r - 1, category, op, tag)]
        yield [comm.irecv(flat, r - 1, category, op, tag)]
        return
    bounds = offsets(n, q)
    if r < 2 * e:  # an even folding rank: take in the odd neighbour's data
        m = r // 2
        with scratch.take(n, flat.dtype) as incoming:
            yield [comm.irecv(incoming, r + 1, category, op, tag)]
            reduce_add(comm, flat, incoming)
    else:
        m = r - e

    def rank_of(v: int) -> int:  # renumbered rank -> rank in the group
        return 2 * v if v < e else v + e

    lo, hi = 0, q  # the range of blocks this rank is responsible for
    d = q // 2
    with scratch.take(bounds[q // 2], flat.dtype) as incoming:  # the largest half received
        while d >= 1:  # reduce-scatter: halve the range, d = q/2 .. 1
            mid = (lo + hi) // 2
            keep, give = ((lo, mid), (mid, hi)) if m & d == 0 else ((mid, hi), (lo, mid))
            a, b = bounds[keep[0]], bounds[keep[1]]
            yield [
                comm.irecv(incoming[: b - a], rank_of(m ^ d), category, op, tag),
                comm.isend(flat[bounds[give[0]] : bounds[give[1]]], rank_of(m ^ d), category, op, tag),
            ]
            reduce_add(comm, flat[a:b], incoming[: b - a])
            lo, hi = keep
            d //= 2
    d = 1
    while d < q:  # all-gather: double the range, d = 1 .. q/2
        width = hi - lo
        other = lo + width if m & d == 0 else lo - width  # the partner holds the sibling range
        yield [
            comm.irecv(flat[bounds[other] : bounds[other + width]], rank_of(m ^ d), category, op, tag),
            comm.isend(flat[bounds[lo] : bounds[hi]], rank_of(m ^ d), category, op, tag),
        ]
        lo, hi = min(lo, other), max(hi, other + width)
        d *= 2
    if r < 2 * e:  # unfold: give the odd neighbour the result
        yield [comm.isend(flat, r + 1, category, op, tag)]
