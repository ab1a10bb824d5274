"""More all-reduce algorithms, to compare with the ring (collectives.py): `--collectives NAME`.

Every one sums a flat array over the group in place and has the ring's signature
`(comm, flat, category, op)`; every one moves 2(p-1) N elements over all ranks in total -- what
differs is how the traffic is spread over ranks and rounds (alpha-beta view, Thakur, Rabenseifner
& Gropp 2005, "Optimization of Collective Communication Operations in MPICH", IJHPCA 19(1)):

  algorithm       rounds          busiest rank sends     spread
  ring            2(p-1)          2(p-1)/p N             even: every rank the same (+-2 elements)
  rabenseifner    2 log2 p        2(p-1)/p N             even, for p a power of two
  tree            2 ceil(log2 p)  ceil(log2 p) N (root)  the root and its near ranks carry the most
  ps              2               (p-1) N (rank 0)       all on the server: it is the bottleneck
  mpi             (hidden)        booked as the ring     MPI_Allreduce; ledger marks it "modeled"

Notation as in collectives.py: N elements, p ranks, c_i = size of chunk i of np.array_split(N, p).
Empty messages (N < p) are sent and counted like any other, so message counts never depend on N.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .comm import Communicator


def rabenseifner_allreduce_rounds(comm: Communicator, flat: np.ndarray, category: str,
                                  op: str = "allreduce") -> Rounds:
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
    if r < 2 * e and r % 2:             # an odd folding rank: hand over the data, wait for the sum
        yield [comm.isend(flat, r - 1, category, op, tag)]
        yield [comm.irecv(flat, r - 1, category, op, tag)]
        return
    bounds = offsets(n, q)
    if r < 2 * e:                       # an even folding rank: take in the odd neighbour's data
        m = r // 2
        with scratch.take(n, flat.dtype) as incoming:
            yield [comm.irecv(incoming, r + 1, category, op, tag)]
            reduce_add(flat, incoming)
    else:
        m = r - e

    def rank_of(v: int) -> int:         # renumbered rank -> rank in the group
        return 2 * v if v < e else v + e

    lo, hi = 0, q                       # the range of blocks this rank is responsible for
    d = q // 2
    with scratch.take(bounds[q // 2], flat.dtype) as incoming:     # the largest half received
        while d >= 1:                   # reduce-scatter: halve the range, d = q/2 .. 1
            mid = (lo + hi) // 2
            keep, give = ((lo, mid), (mid, hi)) if m & d == 0 else ((mid, hi), (lo, mid))
            a, b = bounds[keep[0]], bounds[keep[1]]
            yield [comm.irecv(incoming[:b - a], rank_of(m ^ d), category, op, tag),
                   comm.isend(flat[bounds[give[0]]:bounds[give[1]]], rank_of(m ^ d), category, op, tag)]
            reduce_add(flat[a:b], incoming[:b - a])
            lo, hi = keep
            d //= 2
    d = 1
    while d < q:                        # all-gather: double the range, d = 1 .. q/2
        width = hi - lo
        other = lo + width if m & d == 0 else lo - width    # the partner holds the sibling range
        yield [comm.irecv(flat[bounds[other]:bounds[other + width]], rank_of(m ^ d), category, op, tag),
               comm.isend(flat[bounds[lo]:bounds[hi]], rank_of(m ^ d), category, op, tag)]
        lo, hi = min(lo, other), max(hi, other + width)
        d *= 2
    if r < 2 * e:                       # unfold: give the odd neighbour the result
        yield [comm.isend(flat, r + 1, category, op, tag)]


def tree_allreduce_rounds(comm: Communicator, flat: np.ndarray, category: str,
                          op: str = "allreduce") -> Rounds:
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
    tag = new_tag(comm)                 # both phases; their messages go opposite ways, never cross
    d = 1 << ((p - 1).bit_length() - 1)  # the largest power of two < p: the broadcast's last round
    has_children = me + (1 << me.bit_length()) < p     # c(me) > 0: the smallest 2^k > me fits
    with scratch.take(flat.size if has_children else 0, flat.dtype) as incoming:
        while d >= 1:
            if me < d and me + d < p:   # a child me + d sends its subtree's sum
                yield [comm.irecv(incoming, me + d, category, op, tag)]
                reduce_add(flat, incoming)
            elif d <= me < 2 * d:       # my subtree is complete: pass it to my parent
                yield [comm.isend(flat, me - d, category, op, tag)]
            d //= 2
    yield from binomial_broadcast_rounds(comm, flat, 0, category, op, tag)


def ps_allreduce_rounds(comm: Communicator, flat: np.ndarray, category: str,
                        op: str = "allreduce") -> Rounds:
    """Parameter server (Li et al. 2014, OSDI): every rank pushes to rank 0, which sums and sends back.

    Cost: a worker r != 0 sends N and receives N, in 1 message; the server (rank 0) receives
    (p-1) N, adds it all up, and sends (p-1) N, in p-1 messages. All ranks together: 2(p-1) N in 2(p-1) messages --
    the same total as the ring, but all of it through one rank, whose link then takes (p-1) times
    longer than anyone's in the ring: the reason sharded servers and all-reduce replaced it.
    """
    p, r = comm.size, comm.rank
    if p == 1:
        return
    tag = new_tag(comm)
    if r != 0:
        yield [comm.isend(flat, 0, category, op, tag)]
        yield [comm.irecv(flat, 0, category, op, tag)]   # after the send: never receive into a busy buffer
        return
    # Post every receive at once so no worker waits for another; sum in rank order (deterministic).
    with scratch.take((p - 1) * flat.size, flat.dtype) as incoming:
        incoming = incoming.reshape(p - 1, flat.size)
        yield [comm.irecv(incoming[i - 1], i, category, op, tag) for i in range(1, p)]
        for row in incoming:
            reduce_add(flat, row)
    yield [comm.isend(flat, i, category, op, tag) for i in range(1, p)]


def mpi_allreduce_rounds(comm: Communicator, flat: np.ndarray, category: str,
                         op: str = "allreduce") -> Rounds:
    """MPI's own MPI_Allreduce (in place). It blocks, so it runs when the collective starts.

    MPI does not say how it moves the data: MPICH picks by message size, group size and placement
    (between nodes: recursive doubling or Rabenseifner; inside one node, after a few calls, a
    reduce-then-broadcast through small shared-memory cells, "release_gather"). So the ledger
    books what the bandwidth-optimal ring would send -- sent 2N - c_r - c_(r+1), received
    2N - c_(r-1) - c_r, 2(p-1) messages; exactly 2(p-1) N over all ranks -- and marks the op
    "modeled".
    """
    p, r, n = comm.size, comm.rank, flat.size
    if p == 1:
        return
    comm.mpi.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
    c = np.diff(offsets(n, p))
    bpe = flat.itemsize
    comm.record_modeled(category, op, int(2 * n - c[r] - c[(r + 1) % p]) * bpe,
                        int(2 * n - c[(r - 1) % p] - c[r]) * bpe, 2 * (p - 1))
    yield []                            # one round with nothing left to wait for


# collectives.py imports this module to fill its algorithm table, and this module needs collectives'
# helpers: importing them last (they are only looked up when an algorithm runs) makes either module
# importable first.
from .collectives import Rounds, binomial_broadcast_rounds, new_tag, offsets, reduce_add, scratch  # noqa: E402
