"""Collective algorithms built from the Communicator's counted point-to-point messages.

Each algorithm is a *generator*: it posts one round of non-blocking sends/receives, yields the
requests, and continues (e.g. reduces what arrived) once they complete. That one shape serves both

  * blocking use:   `allreduce(comm, buf, "model")`                 -- runs all rounds now;
  * overlapped use: `pending = start_allreduce(...)`, then `pending.progress()` between layers of
    backward and `pending.wait()` at the end -- how data parallelism hides gradient traffic.

Chunks follow `np.array_split`: with N elements and p ranks, chunk i has N//p or N//p + 1 elements.

Volumes (elements sent per rank; all ranks together in brackets), see DESIGN.md:
  ring reduce-scatter   (p-1)/p * N          [(p-1) * N]
  ring all-gather       (p-1)/p * N          [(p-1) * N]
  ring all-reduce       2(p-1)/p * N         [2(p-1) * N]   (Patarasuk & Yuan 2009)
  binomial broadcast    root sends ceil(log2 p) messages; every non-root receives N once [(p-1) * N]
"""
from __future__ import annotations

from typing import Callable, Generator, Iterator

import numpy as np
from mpi4py import MPI

from .comm import Communicator

Rounds = Generator[list, None, None]  # a collective: yields lists of MPI requests

# The reduction inside every reducing collective (`dst += src`); kernels/ may swap in a Numba one.
_reduce_add: Callable[[np.ndarray, np.ndarray], None] = lambda dst, src: np.add(dst, src, out=dst)


def set_reduce_kernel(fn: Callable[[np.ndarray, np.ndarray], None]) -> None:
    global _reduce_add
    _reduce_add = fn


def chunk_bounds(n: int, p: int) -> np.ndarray:
    """Start offsets of p nearly equal chunks of n elements (the np.array_split rule), plus n."""
    base, extra = divmod(n, p)
    sizes = np.full(p, base, dtype=np.int64)
    sizes[:extra] += 1
    return np.concatenate(([0], np.cumsum(sizes)))


class _TagCounter:
    """Gives each collective call its own MPI tag, so two in flight on one group never cross.

    All ranks of a group start collectives in the same order, so their counters agree.
    """
    def __init__(self):
        self.next = {}

    def __call__(self, comm: Communicator) -> int:
        key = id(comm.mpi)
        tag = self.next.get(key, 0)
        self.next[key] = (tag + 1) % 30000
        return 100 + tag


new_tag = _TagCounter()


class Pending:
    """An in-flight collective: advance it with `progress()` (never blocks), finish with `wait()`."""

    def __init__(self, rounds: Rounds):
        self._rounds = rounds
        self._requests: list = []
        self.done = False
        self._advance()

    def _advance(self) -> None:
        try:
            self._requests = next(self._rounds)
        except StopIteration:
            self.done = True

    def progress(self) -> None:
        while not self.done and MPI.Request.Testall(self._requests):
            self._advance()

    def wait(self) -> None:
        while not self.done:
            MPI.Request.Waitall(self._requests)
            self._advance()


def run(rounds: Rounds) -> None:
    Pending(rounds).wait()


# -- ring algorithms ----------------------------------------------------------------------------

def ring_reduce_scatter_rounds(comm: Communicator, flat: np.ndarray, category: str,
                               op: str = "reduce-scatter") -> Rounds:
    """Sum `flat` over the group; afterwards rank r holds the total of chunk r (in place).

    Step s (0..p-2): send chunk (r-s-1) to the right neighbour, receive chunk (r-s-2) from the
    left one and add it in. Every chunk travels once around the ring collecting one term per hop,
    so it reaches its owner after p-1 hops carrying the full sum.
    """
    p, r = comm.size, comm.rank
    if p == 1:
        return
    bounds = chunk_bounds(flat.size, p)
    right, left = (r + 1) % p, (r - 1) % p
    incoming = np.empty(int(np.max(np.diff(bounds))), dtype=flat.dtype)  # owned by this call only
    tag = new_tag(comm)
    for s in range(p - 1):
        send_c, recv_c = (r - s - 1) % p, (r - s - 2) % p
        lo, hi = bounds[recv_c], bounds[recv_c + 1]
        yield [comm.isend(flat[bounds[send_c]:bounds[send_c + 1]], right, category, op, tag),
               comm.irecv(incoming[:hi - lo], left, category, op, tag)]
        _reduce_add(flat[lo:hi], incoming[:hi - lo])


def ring_allgather_rounds(comm: Communicator, flat: np.ndarray, category: str,
                          op: str = "all-gather") -> Rounds:
    """Rank r contributes chunk r of `flat`; afterwards every rank holds all chunks (in place).

    Step s: pass on the chunk received in the previous step (at s=0, one's own), receive the next.
    """
    p, r = comm.size, comm.rank
    if p == 1:
        return
    bounds = chunk_bounds(flat.size, p)
    right, left = (r + 1) % p, (r - 1) % p
    tag = new_tag(comm)
    for s in range(p - 1):
        send_c, recv_c = (r - s) % p, (r - s - 1) % p
        yield [comm.isend(flat[bounds[send_c]:bounds[send_c + 1]], right, category, op, tag),
               comm.irecv(flat[bounds[recv_c]:bounds[recv_c + 1]], left, category, op, tag)]


def ring_allreduce_rounds(comm: Communicator, flat: np.ndarray, category: str,
                          op: str = "allreduce") -> Rounds:
    """Ring all-reduce = ring reduce-scatter, then ring all-gather: 2(p-1)/p * N sent per rank."""
    yield from ring_reduce_scatter_rounds(comm, flat, category, op)
    yield from ring_allgather_rounds(comm, flat, category, op)


def binomial_broadcast_rounds(comm: Communicator, buf: np.ndarray, root: int, category: str,
                              op: str = "broadcast") -> Rounds:
    """Binomial tree: in round k every rank that already has the data sends it 2^k ranks further."""
    p = comm.size
    if p == 1:
        return
    flat = buf.reshape(-1)
    me = (comm.rank - root) % p           # position relative to the root
    tag = new_tag(comm)
    distance = 1
    while distance < p:
        if me < distance and me + distance < p:
            yield [comm.isend(flat, (me + distance + root) % p, category, op, tag)]
        elif distance <= me < 2 * distance:
            yield [comm.irecv(flat, (me - distance + root) % p, category, op, tag)]
        distance *= 2


# -- the algorithm table (collectives chosen with --collectives) --------------------------------

ALLREDUCE_ALGORITHMS: dict[str, Callable[..., Rounds]] = {"ring": ring_allreduce_rounds}


def _flat(buf: np.ndarray) -> np.ndarray:
    if not buf.flags.c_contiguous:
        raise ValueError("collectives work in place on contiguous arrays")
    return buf.reshape(-1)


def start_allreduce(comm: Communicator, buf: np.ndarray, category: str, op: str = "allreduce",
                    algorithm: str = "ring") -> Pending:
    """Begin summing `buf` over the group, in place; returns the in-flight collective."""
    return Pending(ALLREDUCE_ALGORITHMS[algorithm](comm, _flat(buf), category, op))


def allreduce(comm: Communicator, buf: np.ndarray, category: str, op: str = "allreduce",
              algorithm: str = "ring") -> np.ndarray:
    start_allreduce(comm, buf, category, op, algorithm).wait()
    return buf


def reduce_scatter(comm: Communicator, buf: np.ndarray, category: str,
                   op: str = "reduce-scatter") -> np.ndarray:
    """Sum over the group; returns a view of this rank's chunk (chunk `comm.rank`) of `buf`."""
    flat = _flat(buf)
    run(ring_reduce_scatter_rounds(comm, flat, category, op))
    bounds = chunk_bounds(flat.size, comm.size)
    return flat[bounds[comm.rank]:bounds[comm.rank + 1]]


def allgather(comm: Communicator, buf: np.ndarray, category: str, op: str = "all-gather") -> np.ndarray:
    """Every rank has written its chunk `comm.rank` of `buf`; fill in everyone else's."""
    run(ring_allgather_rounds(comm, _flat(buf), category, op))
    return buf


def broadcast(comm: Communicator, buf: np.ndarray, root: int, category: str,
              op: str = "broadcast") -> np.ndarray:
    run(binomial_broadcast_rounds(comm, buf, root, category, op))
    return buf


def scatter_rows(comm: Communicator, rows_by_rank: list | None, out: np.ndarray, root: int,
                 category: str, op: str = "scatter") -> np.ndarray:
    """Root sends rank i the array rows_by_rank[i] (shapes agreed beforehand); others receive into out."""
    if comm.rank == root:
        for dest, rows in enumerate(rows_by_rank):
            if dest == root:
                out[...] = rows
            else:
                comm.send(np.ascontiguousarray(rows, dtype=out.dtype), dest, category, op)
    else:
        comm.recv(out, root, category, op)
    return out


def iter_chunks(n: int, p: int) -> Iterator[slice]:
    bounds = chunk_bounds(n, p)
    for i in range(p):
        yield slice(int(bounds[i]), int(bounds[i + 1]))
