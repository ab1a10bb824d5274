"""MPI's own MPI_Allreduce: the peer simpar's algorithms are measured against; its bytes are modeled."""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..runtime.comm import Communicator
from .base import Rounds, offsets


def mpi_allreduce_rounds(
    comm: Communicator, flat: np.ndarray, category: str, op: str = "allreduce"
) -> Rounds:
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
    comm.record_modeled(
        category,
        op,
        int(2 * n - c[r] - c[(r + 1) % p]) * bpe,
        int(2 * n - c[(r - 1) % p] - c[r]) * bpe,
        2 * (p - 1),
    )
    clock = comm.runtime.clock
    if clock is not None:  # its messages are hidden: the closed-form time on the stream instead
        gamma = clock.profile.gamma if clock.profile.reduce_gamma is None else clock.profile.reduce_gamma
        clock.cursor += closed_form_seconds(n, p, bpe, comm.group_link(), gamma)
    yield []  # one round with nothing left to wait for


def closed_form_seconds(n: int, p: int, bpe: int, link, gamma: float) -> float:
    """Simulated time of MPI_Allreduce of n elements over p ranks: the ring's alpha-beta-gamma time
    (2(p-1) rounds of ceil(n/p) elements, (p-1) of them reduced), or Rabenseifner's (2 log2 q rounds
    over q = 2^floor(log2 p) ranks, plus folding the other p - q in and out with whole buffers)
    when that needs fewer rounds without moving more per link -- the choice MPICH makes by size."""
    block = -(-n // p) * bpe
    ring = (2 * (p - 1), 2 * (p - 1) * block, (p - 1) * block)  # rounds, bytes on the path, reduced
    q = 1 << (p.bit_length() - 1)
    e, L, qblock = p - q, q.bit_length() - 1, -(-n // q) * bpe
    fold = 2 if e else 0
    rab = (2 * L + fold, 2 * (q - 1) * qblock + fold * n * bpe, (q - 1) * qblock + fold // 2 * n * bpe)
    rounds, path, reduced = rab if rab[0] < ring[0] and rab[1] <= ring[1] else ring
    return rounds * link.alpha + path / link.bandwidth + reduced * gamma
