"""The parameter server (Li et al. 2014, OSDI): every rank pushes to rank 0, which sums and sends back."""

from __future__ import annotations

import numpy as np

from ..runtime.comm import Communicator
from .base import Rounds, new_tag, reduce_add, scratch


def ps_allreduce_rounds(comm: Communicator, flat: np.ndarray, category: str, op: str = "allreduce") -> Rounds:
    """Parameter server (Li et al. 2014, OSDI): every rank pushes to rank 0, which sums and sends back.

    Cost: a worker r != 0 sends N and receives N, in 1 message; the server (rank 0) receives
    (p-1) N, adds it all up, and sends (p-1) N, in p-1 messages. All ranks together: 2(p-1) N in
    2(p-1) messages -- the same total as the ring, but all of it through one rank, whose link then
    takes (p-1) times longer than anyone's in the ring: the reason sharded servers and all-reduce
    replaced it.
    """
    p, r = comm.size, comm.rank
    if p == 1:
        return
    tag = new_tag(comm)
    if r != 0:
        yield [comm.isend(flat, 0, category, op, tag)]
        yield [comm.irecv(flat, 0, category, op, tag)]  # after the send: never receive into a busy buffer
        return
    # Post every receive at once so no worker waits for another; sum in rank order (deterministic).
    with scratch.take((p - 1) * flat.size, flat.dtype) as incoming:
        incoming = incoming.reshape(p - 1, flat.size)
        yield [comm.irecv(incoming[i - 1], i, category, op, tag) for i in range(1, p)]
        for row in incoming:
            reduce_add(comm, flat, row)
    yield [comm.isend(flat, i, category, op, tag) for i in range(1, p)]
