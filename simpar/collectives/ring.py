"""Ring reduce-scatter, all-gather and all-reduce (Patarasuk & Yuan 2009).

Volumes per rank r, in elements (multiply by the bytes per element); all ranks together in brackets
(c_i: chunk i of np.array_split(N, p), indices mod p):
  ring reduce-scatter   sent N - c_r,            received N - c_(r-1),    p-1 msgs   [(p-1) N]
  ring all-gather       sent N - c_(r+1),        received N - c_r,        p-1 msgs   [(p-1) N]
  ring all-reduce       both: sent 2N - c_r - c_(r+1) ~ 2(p-1)/p N,     2(p-1) msgs  [2(p-1) N]
                        (the reduce-scatter's received elements are the ones added up)
"""

from __future__ import annotations

import numpy as np

from ..runtime.comm import Communicator
from .base import Rounds, new_tag, offsets, reduce_add, scratch


def ring_reduce_scatter_rounds(
    comm: Communicator, flat: np.ndarray, category: str, op: str = "reduce-scatter", tag: int | None = None
) -> Rounds:
    """Sum `flat` over the group; afterwards rank r holds the total of chunk r (in place).

    Step s (0..p-2): send chunk (r-s-1) to the right neighbour, receive chunk (r-s-2) from the
    left one and add it in. Every chunk travels once around the ring collecting one term per hop,
    so it reaches its owner after p-1 hops carrying the full sum.
    Cost: rank r sends every chunk but its own (N - c_r) and receives every chunk but c_(r-1),
    in p-1 messages, adding up all it receives (N - c_(r-1) elements); (p-1) N over all ranks.
    """
    p, r = comm.size, comm.rank
    if p == 1:
        return
    tag = new_tag(comm) if tag is None else tag
    bounds = offsets(flat.size, p)
    right, left = (r + 1) % p, (r - 1) % p
    with scratch.take(bounds[1], flat.dtype) as incoming:  # chunk 0 is the largest
        for s in range(p - 1):
            send_c, recv_c = (r - s - 1) % p, (r - s - 2) % p
            lo, hi = bounds[recv_c], bounds[recv_c + 1]
            yield [
                comm.irecv(incoming[: hi - lo], left, category, op, tag),  # receive posted first:
                comm.isend(flat[bounds[send_c] : bounds[send_c + 1]], right, category, op, tag),
            ]  # see Pending
            reduce_add(comm, flat[lo:hi], incoming[: hi - lo])


def ring_allgather_rounds(
    comm: Communicator, flat: np.ndarray, category: str, op: str = "all-gather", tag: int | None = None
) -> Rounds:
    """Rank r contributes chunk r of `flat`; afterwards every rank holds all chunks (in place).

    Step s: pass on the chunk received in the previous step (at s=0, one's own), receive the next.
    Cost: rank r sends every chunk but c_(r+1) (the last one it receives, which it never passes
    on) and receives every chunk but its own, in p-1 messages; (p-1) N over all ranks.
    """
    p, r = comm.size, comm.rank
    if p == 1:
        return
    tag = new_tag(comm) if tag is None else tag
    bounds = offsets(flat.size, p)
    right, left = (r + 1) % p, (r - 1) % p
    for s in range(p - 1):
        send_c, recv_c = (r - s) % p, (r - s - 1) % p
        yield [
            comm.irecv(flat[bounds[recv_c] : bounds[recv_c + 1]], left, category, op, tag),
            comm.isend(flat[bounds[send_c] : bounds[send_c + 1]], right, category, op, tag),
        ]


def ring_allreduce_rounds(
    comm: Communicator, flat: np.ndarray, category: str, op: str = "allreduce"
) -> Rounds:
    """Ring all-reduce = ring reduce-scatter, then ring all-gather (Patarasuk & Yuan 2009).

    Rank r sends 2N - c_r - c_(r+1) elements (= 2(p-1)/p N when p divides N, within 2 elements
    of it otherwise) and receives 2N - c_(r-1) - c_r, in 2(p-1) messages; exactly 2(p-1) N over
    all ranks, 2p(p-1) messages. Bandwidth-optimal: no rank can send less than 2(p-1)/p N.
    """
    if comm.size == 1:
        return
    tag = new_tag(comm)  # one tag for both phases (see _TagCounter)
    yield from ring_reduce_scatter_rounds(comm, flat, category, op, tag)
    yield from ring_allgather_rounds(comm, flat, category, op, tag)
