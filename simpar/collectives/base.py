"""What every collective algorithm shares: the generator shape, chunking, tags, scratch buffers.

Each algorithm (ring.py, tree.py, rabenseifner.py, ps.py, native.py) is a *generator*: it posts one
round of non-blocking sends/receives through the Communicator, yields the requests, and continues
(e.g. reduces what arrived) once they complete. That one shape serves both

  * blocking use:   `run(rounds)`                 -- runs all rounds now;
  * overlapped use: `pending = Pending(rounds)`, then `pending.progress()` between layers of
    backward and `pending.wait()` at the end -- how data parallelism hides gradient traffic.

Chunks follow `np.array_split`: with N elements and p ranks, chunk i has c_i = N//p + (i < N%p)
elements (some are empty when N < p; empty messages are still sent and counted, so message counts
never depend on N). Indices of c are taken mod p.

The reduction inside every reducing collective (`dst += src`) is the run's kernel backend's
reduce-add, which the communicator's runtime carries (runtime/context.py; kernels/ never imports simpar).
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from typing import Generator, Iterator

import numpy as np
from mpi4py import MPI

from ..runtime import flight, simclock
from ..runtime.comm import Communicator

Rounds = Generator[list, None, None]  # a collective: yields lists of MPI requests


def reduce_add(comm: Communicator, dst: np.ndarray, src: np.ndarray) -> None:
    """`dst += src` with the run's kernels (comm.runtime.kernels: NumPy's, or a Numba one)."""
    comm.runtime.kernels.reduce_add(dst, src)
    clock = comm.runtime.clock
    if clock is not None:
        clock.reduce(dst.nbytes)


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
        self._free: list[np.ndarray] = []  # raw byte buffers, smallest first
        self._keep = keep

    @contextmanager
    def take(self, n: int, dtype: np.dtype) -> Iterator[np.ndarray]:
        nbytes = n * np.dtype(dtype).itemsize
        fits = [i for i, b in enumerate(self._free) if b.nbytes >= nbytes]
        raw = self._free.pop(fits[0]) if fits else np.empty(nbytes, dtype=np.uint8)
        try:
            yield raw[:nbytes].view(dtype)
        finally:
            self._free = sorted(self._free + [raw], key=lambda b: b.nbytes)[-self._keep :]


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

    Under the simulated clock (simclock.py) a collective runs on the rank's communication stream:
    it starts when the rank started it, but not before the previous collective ended; `progress()`
    does nothing and `wait()` runs the rounds (earlier collectives first), chaining their simulated
    times through the arrival of each round's messages. Deterministic: the simulated time never
    depends on when the real messages happened to arrive. On a profile with host_progress (`local`:
    MPI on CPU cores, no spare core to move the bytes) a collective starts no earlier than the
    moment its rank waits for it: started during backward, it still costs the rank its own time.
    """

    def __init__(self, rounds: Rounds, comm: Communicator | None = None, call: dict | None = None):
        """`comm`: the group it runs on (its name keys the stream; its runtime has the clock and
        recorder); None: a collective with nothing to do (a skipped one, --inject desync)."""
        runtime = comm.runtime if comm is not None else None
        group = comm.name if comm is not None else "world"
        self._recorder = runtime.recorder if runtime is not None else None
        self._rounds = rounds
        self._requests: list = []
        self._round_recvs: list = []
        self.done = False
        self.event = None
        recorder = self._recorder
        if recorder is not None and call is not None:  # the flight recorder's view of this call
            self.event = recorder.record(
                "collective",
                call["op"],
                call["category"],
                group,
                "its group",
                call["nbytes"],
                members=call["comm"].world_ranks,
            )
            if recorder.check_collectives:
                check_same_call(call["comm"], self.event, call["dtype"])
        self._clock = runtime.clock if runtime is not None else None
        if self._clock is None:
            self._advance()
        else:
            self.group, self.started_at = group, self._clock.issue_time()
            self.timing = self._clock.collective_timing(group, call)  # GPU profiles: NCCL's protocol
            self._clock.in_flight.setdefault(group, []).append(self)

    def _advance(self) -> None:
        recorder = self._recorder
        if recorder is not None:
            recorder.round_recvs = []
        try:
            self._requests = next(self._rounds)
        except StopIteration:
            self.done = True
        if recorder is not None:  # the receives this round waits for: whom the watchdog names
            self._round_recvs, recorder.round_recvs = recorder.round_recvs, []

    def progress(self) -> None:
        while self._clock is None and not self.done and MPI.Request.Testall(self._requests):
            self._round_done()
            self._advance()

    def wait(self) -> None:
        recorder = self._recorder
        if self._clock is not None:
            self._clock.wait_until(self._run_on_stream(), busy_from=self.started_at)
        while not self.done:
            if recorder is not None:
                recorder.wait_begin(self._round_recvs[0] if self._round_recvs else self.event or {})
            MPI.Request.Waitall(self._requests)
            self._round_done()
            self._advance()
        if recorder is not None:
            recorder.wait_end(self.event)

    def _round_done(self) -> None:
        now = time.time()
        for event in self._round_recvs:
            event["completed"] = now

    def _run_on_stream(self) -> float:
        """Run this collective (and every one started before it) on the simulated stream; its end."""
        clock, queue = self._clock, self._clock.in_flight[self.group]
        # host_progress: nothing moved before the rank waited, so the stream starts no earlier than now
        waited_at = clock.issue_time() if clock.profile.host_progress else 0.0
        while queue and not self.done:
            first = queue.pop(0)
            t = max(first.started_at, clock.stream_free.get(self.group, 0.0), waited_at)
            start = t
            if first.timing is not None:  # its protocol: base latency once, then its steps' link
                t += first.timing.base
                clock.override[self.group] = simclock.Link(first.timing.hop, first.timing.bw)
            outer, clock.cursor = clock.cursor, t
            try:
                while True:
                    clock.cursor = t
                    try:
                        requests = next(first._rounds)
                    except StopIteration:
                        t = clock.cursor  # the reduction after the last round
                        break
                    t = clock.cursor  # the reductions since the last round ran on the stream
                    MPI.Request.Waitall([r for sim in requests for r in sim.requests])
                    receives = [sim for sim in requests if sim.header is not None]
                    sends = [sim.completion() for sim in requests if sim.header is None]
                    t = max([t] + sends + ([clock.receive_round(self.group, receives)] if receives else []))
            finally:
                clock.cursor = outer
                clock.override.pop(self.group, None)
            first.done, first.ended_at = True, t
            clock.stream_free[self.group] = t
            clock.comm_busy(t - start)
        return self.ended_at


def run(rounds: Rounds, comm: Communicator | None = None, call: dict | None = None) -> None:
    Pending(rounds, comm, call).wait()


def check_same_call(comm, event: dict, dtype) -> None:
    """--check-collectives: before a collective, its group compares what each rank is about to call
    (the group's call number, op, category, bytes, dtype) -- TORCH_DISTRIBUTED_DEBUG=DETAIL's
    fingerprint check. A difference ends the job with one line naming both calls and their ranks.
    The comparison is MPI's own all-gather, booked as control traffic."""
    mine = (event["group_seq"], event["op"], event["category"], event["bytes"], str(dtype))
    rows = comm.mpi.allgather(mine)
    comm.record_modeled(
        "control", "check-collectives", 64 * (comm.size - 1), 64 * (comm.size - 1), comm.size - 1
    )
    odd = next((i for i, row in enumerate(rows) if row != rows[0]), None)
    if odd is None:
        return
    what = lambda row: f"#{row[0]} {row[1]} ({row[2]}, {row[3]} B, {row[4]})"
    if comm.rank == 0:
        flight.fatal(
            f"--check-collectives: group {comm.name} disagrees: rank {comm.world_ranks[0]} called "
            f"{what(rows[0])}, rank {comm.world_ranks[odd]} called {what(rows[odd])}"
        )
    time.sleep(30)  # the group's first rank says it and ends the job; wait for that, silently
    os._exit(2)


def _flat(buf: np.ndarray) -> np.ndarray:
    if not buf.flags.c_contiguous:
        raise ValueError("collectives work in place on contiguous arrays")
    return buf.reshape(-1)
