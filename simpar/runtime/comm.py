"""The Communicator: the one choke point through which every byte between ranks passes.

Every strategy in simpar talks to other ranks only through a `Communicator`. It wraps an mpi4py
communicator and offers point-to-point messages (blocking and non-blocking) on NumPy arrays. Each
message is written into a `Ledger` *before* it leaves, sorted by

  category  -- what the bytes are (docs/design.md): "data" (training samples and labels), "model"
               (parameters, gradients, optimizer state), "activation" (intermediate results between
               model shards), or "control" (logging, metrics, barriers: kept apart so the three
               training categories stay exactly equal to the closed-form formulas);
  op        -- which algorithm sent it ("allreduce", "scatter-batch", "pipeline-send", ...);
  peer      -- the WORLD rank on the other end.

Because counting happens at the point-to-point level, the ledger is exact by construction: a
collective built from these sends cannot move a byte that is not counted. When a run asks for MPI's
native collectives, MPI hides what it really sends; `record_modeled` then books the bandwidth-optimal
volume and flags the op as modeled.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from . import simclock
from .context import Runtime

CATEGORIES = ("data", "model", "activation", "control")


@dataclass
class Ledger:
    """Bytes and messages this rank sent and received, by category, op and peer."""

    sent: dict = field(default_factory=lambda: defaultdict(int))  # category -> bytes
    received: dict = field(default_factory=lambda: defaultdict(int))  # category -> bytes
    messages: dict = field(default_factory=lambda: defaultdict(int))  # category -> sends
    by_op: dict = field(
        default_factory=lambda: defaultdict(lambda: [0, 0, 0])
    )  # (cat, op) -> [sent, recv, msgs]
    by_peer: dict = field(default_factory=lambda: defaultdict(lambda: [0, 0]))  # peer -> [sent, recv]
    modeled_ops: set = field(default_factory=set)

    def book_send(self, category: str, op: str, peer: int, nbytes: int) -> None:
        self.sent[category] += nbytes
        self.messages[category] += 1
        entry = self.by_op[(category, op)]
        entry[0] += nbytes
        entry[2] += 1
        self.by_peer[peer][0] += nbytes

    def book_recv(self, category: str, op: str, peer: int, nbytes: int) -> None:
        self.received[category] += nbytes
        self.by_op[(category, op)][1] += nbytes
        self.by_peer[peer][1] += nbytes

    def snapshot(self) -> dict:
        """A plain, JSON-ready copy (used for per-step deltas and for the metrics file)."""
        return {
            "sent": {c: int(self.sent.get(c, 0)) for c in CATEGORIES},
            "received": {c: int(self.received.get(c, 0)) for c in CATEGORIES},
            "messages": {c: int(self.messages.get(c, 0)) for c in CATEGORIES},
            "by_op": {
                f"{c}/{op}": {"sent": v[0], "received": v[1], "messages": v[2]}
                for (c, op), v in sorted(self.by_op.items())
            },
            "by_peer": {str(p): {"sent": v[0], "received": v[1]} for p, v in sorted(self.by_peer.items())},
            "modeled_ops": sorted(self.modeled_ops),
        }


def _check_category(category: str) -> None:
    if category not in CATEGORIES:
        raise ValueError(f"unknown traffic category {category!r}; use one of {CATEGORIES}")


class Communicator:
    """An mpi4py communicator whose every message is counted in a shared `Ledger`.

    `rank`/`size` are positions inside this (possibly split) group; the ledger keys peers by their
    WORLD rank so that a rank's traffic from all its groups adds up in one place. `runtime`: the
    run's clock, recorder, tracer and kernels (context.py), shared by every group split from it.
    """

    def __init__(self, mpi_comm: MPI.Comm, ledger: Ledger, name: str = "world", runtime=None):
        self.mpi = mpi_comm
        self.ledger = ledger
        self.name = name
        self.runtime = runtime if runtime is not None else Runtime()
        self.rank = mpi_comm.Get_rank()
        self.size = mpi_comm.Get_size()
        world = MPI.COMM_WORLD.Get_group()
        # World rank of every member of this group, so the ledger can name peers globally.
        self.world_ranks = MPI.Group.Translate_ranks(mpi_comm.Get_group(), list(range(self.size)), world)
        self._headers = mpi_comm.Dup() if self.runtime.clock is not None else None
        self._links: dict = {}  # peer -> its simclock.Link (link_to)

    def split(self, color: int, key: int, name: str) -> "Communicator":
        """A sub-group (e.g. the data-parallel ranks that share a tensor/pipeline position)."""
        return Communicator(self.mpi.Split(color, key), self.ledger, name, self.runtime)

    def _done(self, event) -> None:
        recorder = self.runtime.recorder
        if recorder is not None and event is not None:
            recorder.wait_end(event)

    def _clock_for(self, category: str):
        """The simulated clock, if one runs -- except for control traffic, which takes no simulated time."""
        return None if category == "control" else self.runtime.clock

    def link_to(self, peer: int):
        """The link a message to group rank `peer` takes under the simulated clock: from where the
        two ranks sit (network.py), or the group's fixed link when the profile gives those."""
        clock = self.runtime.clock
        if clock.profile.network is None:
            return clock.profile.links[self.name]
        if peer not in self._links:
            me, them = self.world_ranks[self.rank], self.world_ranks[peer]
            self._links[peer] = clock.profile.network.link(me, them, list(self.world_ranks))
        return self._links[peer]

    def group_link(self):
        """The group's slowest hop (a collective MPI runs, whose messages are hidden)."""
        clock = self.runtime.clock
        if clock.profile.network is None:
            return clock.profile.links[self.name]
        return clock.profile.network.group_link(self.world_ranks[self.rank], list(self.world_ranks))

    def node_span(self) -> int:
        """How many nodes the group's ranks sit on (1 with fixed links: the profile says nothing)."""
        network = self.runtime.clock.profile.network
        return 1 if network is None else network.node_span(list(self.world_ranks))

    def enable_headers(self) -> None:
        """Under the simulated clock, messages carry their arrival time in a header message on a
        duplicate communicator (collective: every rank of the group calls it, as train.py does)."""
        if self._headers is None:
            self._headers = self.mpi.Dup()

    # -- point to point ---------------------------------------------------------------------------
    # Under `--clock sim` (self.runtime.clock), each message also sends a 2-float header with its
    # simulated transfer start and arrival time; the ledger books the payload only.
    def send(self, buf: np.ndarray, dest: int, category: str, op: str, tag: int = 0) -> None:
        _check_category(category)
        buf = np.ascontiguousarray(buf)
        self.ledger.book_send(category, op, self.world_ranks[dest], buf.nbytes)
        clock = self._clock_for(category)
        if clock is not None:
            left, header = self._stamp(clock, dest, buf.nbytes)
            self._headers.Send(header, dest=dest, tag=tag)
            clock.wait_until(left, busy_from=header[0])  # a blocking send returns once sent
        event = self._record("send", op, category, dest, buf.nbytes, tag, wait=True)
        self.mpi.Send(buf, dest=dest, tag=tag)
        self._done(event)

    def recv(self, buf: np.ndarray, source: int, category: str, op: str, tag: int = 0) -> np.ndarray:
        """Receive into `buf` (which the caller owns: never a buffer another array still aliases).

        Booked from the message's real size (MPI's status), not the buffer's."""
        _check_category(category)
        status = MPI.Status()
        event = self._record("recv", op, category, source, buf.nbytes, tag, wait=True)
        clock = self._clock_for(category)
        if clock is not None:
            header = np.empty(2)
            self._headers.Recv(header, source=source, tag=tag)
        self.mpi.Recv(buf, source=source, tag=tag, status=status)
        self._done(event)
        nbytes = status.Get_count(MPI.BYTE)
        self.ledger.book_recv(category, op, self.world_ranks[source], nbytes)
        if clock is not None:
            clock.comm_busy(header[1] - header[0])
            clock.wait_until(header[1], busy_from=header[0])
        return buf

    def isend(self, buf: np.ndarray, dest: int, category: str, op: str, tag: int = 0):
        """Returns an MPI request (or, under the simulated clock, a simclock.SimRequest): finish it
        with `waitall` -- or leave that to a collective's Pending."""
        _check_category(category)
        if not buf.flags.c_contiguous:
            raise ValueError("isend needs a contiguous buffer that stays alive until the request completes")
        self.ledger.book_send(category, op, self.world_ranks[dest], buf.nbytes)
        self._record("send", op, category, dest, buf.nbytes, tag)
        clock = self._clock_for(category)
        if clock is None:
            return self.mpi.Isend(buf, dest=dest, tag=tag)
        left, header = self._stamp(clock, dest, buf.nbytes)
        reqs = [self.mpi.Isend(buf, dest=dest, tag=tag), self._headers.Isend(header, dest=dest, tag=tag)]
        return simclock.SimRequest(reqs, done_at=left, keep=[header], busy_from=float(header[0]))

    def irecv(self, buf: np.ndarray, source: int, category: str, op: str, tag: int = 0):
        _check_category(category)
        # Booked when posted, at the buffer's size: MPI errors out on a longer message, and every
        # simpar receiver knows the exact size it waits for (the tests check that all ranks'
        # received bytes add up to all ranks' sent bytes, which a shorter message would break).
        self.ledger.book_recv(category, op, self.world_ranks[source], buf.nbytes)
        self._record("recv", op, category, source, buf.nbytes, tag)
        if self._clock_for(category) is None:
            return self.mpi.Irecv(buf, source=source, tag=tag)
        header = np.empty(2)
        reqs = [
            self.mpi.Irecv(buf, source=source, tag=tag),
            self._headers.Irecv(header, source=source, tag=tag),
        ]
        return simclock.SimRequest(reqs, header=header, alpha=self.link_to(source).alpha)

    def waitall(self, requests: list) -> None:
        """Finish requests from isend/irecv (a pipeline's sends); under the simulated clock the rank
        waits until the last one completes in simulated time."""
        recorder = self.runtime.recorder
        event = None
        if recorder is not None and requests:  # a pipeline's sends: done once their receivers took them
            event = recorder.record("wait", "sends-delivered", "activation", self.name, "the receivers", 0)
            recorder.wait_begin(event)
        sims = [r for r in requests if isinstance(r, simclock.SimRequest)]
        MPI.Request.Waitall(
            [r for r in requests if not isinstance(r, simclock.SimRequest)]
            + [r for sim in sims for r in sim.requests]
        )
        for sim in sims:
            if sim.header is not None:  # a receive: its transfer counts toward the overlapped share
                self.runtime.clock.comm_busy(sim.completion() - sim.transfer_start())
            self.runtime.clock.wait_until(sim.completion(), busy_from=sim.transfer_start())
        self._done(event)

    def _record(self, kind, op, category, peer, nbytes, tag, wait=False):
        """Into the flight recorder (flight.py), if one runs; `wait`: the rank blocks on it now."""
        recorder = self.runtime.recorder
        if recorder is None:
            return None
        event = recorder.record(kind, op, category, self.name, self.world_ranks[peer], nbytes, tag)
        if wait:
            recorder.wait_begin(event)
        return event

    def _blocking(self, op: str, call):
        """A native MPI call that blocks on the whole group (control traffic): the watchdog watches it."""
        recorder = self.runtime.recorder
        event = None
        if recorder is not None:
            event = recorder.record("collective", op, "control", self.name, "its group", 0)
            recorder.wait_begin(event)
        result = call()
        self._done(event)
        return result

    def _stamp(self, clock, dest: int, nbytes: int) -> tuple[float, np.ndarray]:
        """When the message's last byte has left, and its header: [transfer start, arrival]."""
        link = self.link_to(dest)
        left, arrival = clock.send(self.name, dest, nbytes, link)
        clock.headers_sent += 1
        return left, np.array([left - nbytes / link.bandwidth, arrival])

    # -- native MPI, counted by model ------------------------------------------------------------
    def record_modeled(
        self, category: str, op: str, nbytes_sent: int, nbytes_received: int, messages: int
    ) -> None:
        """Book traffic that MPI moved inside a native collective (its real pattern is hidden)."""
        _check_category(category)
        self.ledger.sent[category] += nbytes_sent
        self.ledger.received[category] += nbytes_received
        self.ledger.messages[category] += messages
        entry = self.ledger.by_op[(category, op)]
        entry[0] += nbytes_sent
        entry[1] += nbytes_received
        entry[2] += messages
        self.ledger.modeled_ops.add(f"{category}/{op}")

    # -- control-plane helpers (counted as "control") --------------------------------------------
    def allreduce_scalar(self, value: float, op=MPI.SUM) -> float:
        """Reduce one float for logging; uses MPI's own Allreduce, booked as modeled control."""
        out = np.array(value, dtype=np.float64)
        self._blocking("allreduce-scalar", lambda: self.mpi.Allreduce(MPI.IN_PLACE, out, op=op))
        if self.size > 1:
            self.record_modeled("control", "allreduce-scalar", 2 * 8, 2 * 8, 2)
        return float(out)

    def gather_object(self, obj, root: int = 0):
        """Gather a small Python object to `root` (metrics, final weights): control traffic."""
        import pickle

        nbytes = len(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
        result = self._blocking("gather", lambda: self.mpi.gather(obj, root=root))
        if self.rank != root:
            self.record_modeled("control", "gather", nbytes, 0, 1)
        else:
            self.record_modeled("control", "gather", 0, 0, 0)
        return result

    def bcast_object(self, obj, root: int = 0):
        import pickle

        result = self._blocking("bcast", lambda: self.mpi.bcast(obj, root=root))
        if self.rank == root and self.size > 1:
            nbytes = len(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
            self.record_modeled("control", "bcast", nbytes * (self.size - 1), 0, self.size - 1)
        return result

    def barrier(self) -> None:
        self._blocking("barrier", self.mpi.Barrier)
