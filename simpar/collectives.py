"""Collective algorithms built from the Communicator's counted point-to-point messages.

Each algorithm is a *generator*: it posts one round of non-blocking sends/receives, yields the
requests, and continues (e.g. reduces what arrived) once they complete. That one shape serves both

  * blocking use:   `allreduce(comm, buf, "model")`                 -- runs all rounds now;
  * overlapped use: `pending = start_allreduce(...)`, then `pending.progress()` between layers of
    backward and `pending.wait()` at the end -- how data parallelism hides gradient traffic.

Chunks follow `np.array_split`: with N elements and p ranks, chunk i has c_i = N//p + (i < N%p)
elements (some are empty when N < p; empty messages are still sent and counted, so message counts
never depend on N). Indices of c are taken mod p.

Volumes per rank r, in elements (multiply by the bytes per element); all ranks together in brackets:
  ring reduce-scatter   sent N - c_r,            received N - c_(r-1),    p-1 msgs   [(p-1) N]
  ring all-gather       sent N - c_(r+1),        received N - c_r,        p-1 msgs   [(p-1) N]
  ring all-reduce       both: sent 2N - c_r - c_(r+1) ~ 2(p-1)/p N,     2(p-1) msgs  [2(p-1) N]
                        (the reduce-scatter's received elements are the ones added up)
  binomial broadcast    non-roots receive N once; see binomial_broadcast_rounds      [(p-1) N]
The other all-reduce algorithms (Rabenseifner, tree, parameter server, MPI's own) are in
collectives_more.py, each docstring deriving its volume; all of them move 2(p-1) N in total.
"""
from __future__ import annotations

from contextlib import contextmanager
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


def reduce_add(dst: np.ndarray, src: np.ndarray) -> None:
    """`dst += src` with whatever kernel `set_reduce_kernel` installed (looked up at call time)."""
    _reduce_add(dst, src)


def offsets(n: int, p: int) -> list[int]:
    """Start offsets of p nearly equal chunks of n elements (the np.array_split rule), plus n.

    Plain Python ints: NumPy calls on tiny arrays cost microseconds each, which is most of the
    time of a small all-reduce.
    """
    base, extra = divmod(n, p)
    return [i * base + min(i, extra) for i in range(p + 1)]


def chunk_bounds(n: int, p: int) -> np.ndarray:
    """`offsets` as an int64 array."""
    return np.array(offsets(n, p), dtype=np.int64)


class _ScratchPool:
    """Receive buffers, reused from one call to the next.

    A collective that reduces must receive into a buffer of its own before adding. A fresh
    `np.empty` of tens of MiB costs more than it looks: the kernel hands out new pages, zeroes
    each one on first touch, and takes them back on free -- per call. So a call takes a buffer
    from this pool while it runs (two calls in flight never share one) and returns it at the end.
    """

    def __init__(self, keep: int = 4):
        self._free: list[np.ndarray] = []      # raw byte buffers, smallest first
        self._keep = keep

    @contextmanager
    def take(self, n: int, dtype: np.dtype) -> Iterator[np.ndarray]:
        nbytes = n * np.dtype(dtype).itemsize
        fits = [i for i, b in enumerate(self._free) if b.nbytes >= nbytes]
        raw = self._free.pop(fits[0]) if fits else np.empty(nbytes, dtype=np.uint8)
        try:
            yield raw[:nbytes].view(dtype)
        finally:
            self._free = sorted(self._free + [raw], key=lambda b: b.nbytes)[-self._keep:]


scratch = _ScratchPool()


class _TagCounter:
    """Gives each collective call its own MPI tag, so two in flight on one group never cross.

    All ranks of a group start collectives in the same order, so their counters agree. A call
    takes ONE tag when it starts (`Pending` runs the generator up to its first yield at once) and
    uses it for all its phases: a phase that took its own tag later, when the previous phase
    finished, would get different tags on different ranks whenever two calls in flight finish
    their phases in a different order on different ranks.
    """
    def __call__(self, comm: Communicator) -> int:
        # The count lives on the Communicator itself. (Keying a table by id(comm.mpi) breaks when
        # a freed communicator's id is reused on some ranks but not others: counters disagree,
        # tags differ, and the ring waits forever -- seen in the tour, which builds many groups.)
        tag = getattr(comm, "_next_tag", 0)
        comm._next_tag = (tag + 1) % 30000
        return 100 + tag


new_tag = _TagCounter()


class Pending:
    """An in-flight collective: advance it with `progress()` (never blocks), finish with `wait()`.

    A round may be an empty list (nothing to wait for); a generator may also yield nothing at all.
    Within a round, algorithms post their receives before their sends: a message that finds its
    receive already posted goes straight into place, instead of queueing as "unexpected".
    """

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
                               op: str = "reduce-scatter", tag: int | None = None) -> Rounds:
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
    with scratch.take(bounds[1], flat.dtype) as incoming:     # chunk 0 is the largest
        for s in range(p - 1):
            send_c, recv_c = (r - s - 1) % p, (r - s - 2) % p
            lo, hi = bounds[recv_c], bounds[recv_c + 1]
            yield [comm.irecv(incoming[:hi - lo], left, category, op, tag),   # receive posted first:
                   comm.isend(flat[bounds[send_c]:bounds[send_c + 1]], right, category, op, tag)]  # see Pending
            _reduce_add(flat[lo:hi], incoming[:hi - lo])


def ring_allgather_rounds(comm: Communicator, flat: np.ndarray, category: str,
                          op: str = "all-gather", tag: int | None = None) -> Rounds:
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
        yield [comm.irecv(flat[bounds[recv_c]:bounds[recv_c + 1]], left, category, op, tag),
               comm.isend(flat[bounds[send_c]:bounds[send_c + 1]], right, category, op, tag)]


def ring_allreduce_rounds(comm: Communicator, flat: np.ndarray, category: str,
                          op: str = "allreduce") -> Rounds:
    """Ring all-reduce = ring reduce-scatter, then ring all-gather (Patarasuk & Yuan 2009).

    Rank r sends 2N - c_r - c_(r+1) elements (= 2(p-1)/p N when p divides N, within 2 elements
    of it otherwise) and receives 2N - c_(r-1) - c_r, in 2(p-1) messages; exactly 2(p-1) N over
    all ranks, 2p(p-1) messages. Bandwidth-optimal: no rank can send less than 2(p-1)/p N.
    """
    if comm.size == 1:
        return
    tag = new_tag(comm)       # one tag for both phases (see _TagCounter)
    yield from ring_reduce_scatter_rounds(comm, flat, category, op, tag)
    yield from ring_allgather_rounds(comm, flat, category, op, tag)


def binomial_broadcast_rounds(comm: Communicator, buf: np.ndarray, root: int, category: str,
                              op: str = "broadcast", tag: int | None = None) -> Rounds:
    """Binomial tree: in round k every rank that already has the data sends it 2^k ranks further.

    With me = (r - root) mod p: a non-root receives N once, in the round d = 2^k with
    d <= me < 2d, from me - d; then it sends N to me + d' for every later round d' > me with
    me + d' < p. The root sends ceil(log2 p) messages; (p-1) N and p-1 messages in total.
    """
    p = comm.size
    if p == 1:
        return
    flat = _flat(buf)
    me = (comm.rank - root) % p           # position relative to the root
    tag = new_tag(comm) if tag is None else tag
    distance = 1
    while distance < p:
        if me < distance and me + distance < p:
            yield [comm.isend(flat, (me + distance + root) % p, category, op, tag)]
        elif distance <= me < 2 * distance:
            yield [comm.irecv(flat, (me - distance + root) % p, category, op, tag)]
        distance *= 2


# -- the algorithm table (collectives chosen with --collectives) --------------------------------

from .collectives_more import (mpi_allreduce_rounds, ps_allreduce_rounds,  # noqa: E402
                               rabenseifner_allreduce_rounds, tree_allreduce_rounds)

ALLREDUCE_ALGORITHMS: dict[str, Callable[..., Rounds]] = {
    "ring": ring_allreduce_rounds,
    "rabenseifner": rabenseifner_allreduce_rounds,
    "tree": tree_allreduce_rounds,
    "ps": ps_allreduce_rounds,
    "mpi": mpi_allreduce_rounds,
}


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
    bounds = offsets(flat.size, comm.size)
    return flat[bounds[comm.rank]:bounds[comm.rank + 1]]


def allgather(comm: Communicator, buf: np.ndarray, category: str, op: str = "all-gather") -> np.ndarray:
    """Every rank has written its chunk `comm.rank` of `buf`; fill in everyone else's."""
    run(ring_allgather_rounds(comm, _flat(buf), category, op))
    return buf


def broadcast(comm: Communicator, buf: np.ndarray, root: int, category: str,
              op: str = "broadcast") -> np.ndarray:
    run(binomial_broadcast_rounds(comm, buf, root, category, op))
    return buf
