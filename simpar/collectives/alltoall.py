"""Pairwise-exchange all-to-all with pieces of any size (MPI_Alltoallv's job), on counted messages;
and `alltoall`, which runs it or Bruck's algorithm (bruck.py: fewer messages, more bytes).

Rank r of p holds one piece for every rank q (`send[q]`, any number of rows, possibly none) and
receives one piece from every rank (`recv[q]`, sized by the caller: in expert parallelism every
rank knows every size from the exchanged routing histogram, so no size messages are needed).

Pairwise exchange (Thakur, Rabenseifner & Gropp 2005, sec. 3.4, for long messages): in step
j = 1 .. p-1 rank r sends send[(r+j) % p] to rank (r+j) % p and receives recv[(r-j) % p] from rank
(r-j) % p; its own piece is copied, not sent. Every step pairs each rank with one sender and one
receiver, so no link carries two messages at once.

Cost of rank r: sum over q != r of send[q] elements, in exactly p-1 messages (an empty piece is
still sent and counted, as in every simpar collective, so message counts never depend on the data);
p-1 rounds. Balanced pieces of m elements each: (p-1) m sent per rank -- (p-1)/p of what it holds.
"""

from __future__ import annotations

import numpy as np

from ..runtime.comm import Communicator
from .base import Rounds, new_tag, run
from .bruck import bruck_alltoall_rounds


def pairwise_alltoall_rounds(
    comm: Communicator, send: list[np.ndarray], recv: list[np.ndarray], category: str, op: str
) -> Rounds:
    p, r = comm.size, comm.rank
    recv[r][...] = send[r]
    if p == 1:
        return
    tag = new_tag(comm)
    for j in range(1, p):
        to, frm = (r + j) % p, (r - j) % p
        yield [
            comm.irecv(recv[frm], frm, category, op, tag),  # receive posted first (see base.Pending)
            comm.isend(send[to], to, category, op, tag),
        ]


ALLTOALL_ALGORITHMS = ("pairwise", "bruck")  # --alltoall (config.ALLTOALLS; costmodel.collectives.ALLTOALL)


def alltoall(
    comm: Communicator,
    send: list[np.ndarray],
    rows: list[list[int]],
    category: str,
    op: str,
    algorithm: str = "pairwise",
) -> list[np.ndarray]:
    """Exchange pieces of rows: send[q] goes to rank q; rows[s][q] is how many rows rank s sends rank q,
    for the whole group (every rank passes the same matrix; Bruck's algorithm forwards other ranks'
    pieces and needs their sizes). Returns the pieces received, rows[q][rank] from rank q, each in a
    fresh buffer (never aliasing a later receive)."""
    width, dtype, r = send[0].shape[1:], send[0].dtype, comm.rank
    send = [np.ascontiguousarray(s) for s in send]
    if algorithm not in ALLTOALL_ALGORITHMS:
        raise ValueError(f"unknown all-to-all {algorithm!r}; choose from {', '.join(ALLTOALL_ALGORITHMS)}")
    if algorithm == "bruck":  # fills recv with views of its fresh receive buffers
        recv = [None] * comm.size
        rounds = bruck_alltoall_rounds(comm, send, recv, rows, category, op)
    else:
        recv = [np.empty((rows[q][r], *width), dtype) for q in range(comm.size)]
        rounds = pairwise_alltoall_rounds(comm, send, recv, category, op)
    run(rounds, comm)
    return recv
