"""MPI's own MPI_Allreduce: the peer simpar's algorithms are measured against; its bytes are modeled."""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..comm import Communicator
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
    yield []  # one round with nothing left to wait for
