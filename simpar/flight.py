"""The flight recorder and the watchdog: when a job hangs, say which rank waits for whom, and why.

    mpiexec -n 4 python -m mpi4py -m simpar train --watchdog 30 --inject stall@rank=1,step=3,seconds=60
    python -m simpar debug simpar-flight/

Every rank keeps a ring buffer of its last `SIZE` communication events (PyTorch's NCCL flight
recorder does the same for collectives): sequence number, step, op, category, group, peer (world
rank), bytes, tag, and when it was posted and completed. The Communicator records each message; a
collective records itself once per call (`collective`), with its group's own sequence number, so
that ranks that called different collectives can be told apart afterwards.

The watchdog is a thread that looks at what the rank is waiting for. If one wait lasts longer
than `--watchdog SECONDS` (default 120 s: longer than any step simpar runs here, shorter than a
person's patience; 0 turns it off), every waiting rank dumps its recorder to
`simpar-flight/rank-K.json`, and the lowest-numbered one ends the job with ONE line naming itself,
the operation and the peer it waits for. (The others wait half a second per rank before they would
say the same: by then the job is gone. A rank ending with os._exit makes MPICH's launcher end the
rest quietly: no traceback, no banner, exit status 2.) `simpar debug DIR` (debug.py) reads the
dumps and names the rank that is behind, or the ranks whose collectives differ.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import deque

SIZE = 512
DEFAULT_WATCHDOG_S = 120.0
DUMP_DIR = "simpar-flight"

_active: "FlightRecorder | None" = None


def active() -> "FlightRecorder | None":
    return _active


class FlightRecorder:
    """This rank's last SIZE communication events, and what it is waiting for right now."""

    def __init__(self, rank: int, world_size: int, dump_dir: str = DUMP_DIR):
        self.rank, self.world_size, self.dump_dir = rank, world_size, dump_dir
        self.events: deque = deque(maxlen=SIZE)
        self.seq = 0
        self.step = 0
        self.collective_seq: dict = {}  # group -> collectives called so far
        self.waiting: dict | None = None  # the event this rank blocks on, with "since"
        self.round_recvs: list = []  # receives posted since a collective last looked (collectives/base.py)
        self.check_collectives = False  # --check-collectives
        self.desync_at: int | None = None  # --inject desync: skip the first collective of this step
        self._lock = threading.Lock()

    def record(self, kind: str, op: str, category: str, group: str, peer, nbytes: int, tag=None) -> dict:
        """A message ("send" | "recv") or a collective call; returns the event to complete later."""
        with self._lock:
            self.seq += 1
            event = {
                "seq": self.seq,
                "step": self.step,
                "kind": kind,
                "op": op,
                "category": category,
                "group": group,
                "peer": peer,
                "bytes": int(nbytes),
                "tag": tag,
                "posted": time.time(),
                "completed": None,
            }
            if kind == "collective":
                event["group_seq"] = self.collective_seq[group] = self.collective_seq.get(group, 0) + 1
            elif kind == "recv":
                self.round_recvs.append(event)
            self.events.append(event)
        return event

    def wait_begin(self, event: dict) -> None:
        self.waiting = {**event, "since": time.monotonic()}

    def wait_end(self, event: dict | None = None) -> None:
        self.waiting = None
        if event is not None:
            event["completed"] = time.time()

    def dump(self) -> str:
        """Write rank-K.json (atomically: a temporary name, then rename); returns its path."""
        os.makedirs(self.dump_dir, exist_ok=True)
        path = os.path.join(self.dump_dir, f"rank-{self.rank}.json")
        with self._lock:
            doc = {
                "rank": self.rank,
                "world_size": self.world_size,
                "step": self.step,
                "waiting": {k: v for k, v in (self.waiting or {}).items() if k != "since"} or None,
                "events": list(self.events),
            }
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, path)
        return path


def install(rank: int, world_size: int, watchdog_s: float, dump_dir: str = DUMP_DIR) -> FlightRecorder:
    global _active
    _active = FlightRecorder(rank, world_size, dump_dir)
    if watchdog_s > 0:
        threading.Thread(
            target=_watch, args=(_active, watchdog_s), daemon=True, name="simpar-watchdog"
        ).start()
    return _active


def take_desync() -> bool:
    """--inject desync@rank=R,step=S: True once, for this rank's first collective of step S -- which
    it then skips, as a rank whose code took another branch would. Its peers wait for it."""
    recorder = _active
    if recorder is not None and recorder.desync_at is not None and recorder.step + 1 >= recorder.desync_at:
        recorder.desync_at = None
        return True
    return False


def uninstall() -> None:
    global _active
    _active = None


def describe(event: dict) -> str:
    peer = event.get("peer")
    whom = f"rank {peer}" if isinstance(peer, int) else (peer or "its group")
    return f"{event['op']} ({event['category']}, group {event['group']}) for {whom}"


def _watch(recorder: FlightRecorder, limit: float) -> None:
    """The watchdog thread: poll what the rank waits for; past the limit, dump and end the job."""
    while _active is recorder:
        time.sleep(min(1.0, limit / 4))
        waiting = recorder.waiting
        if waiting is None or time.monotonic() - waiting["since"] < limit:
            continue
        try:
            path = recorder.dump()
        except OSError as exc:
            path = f"(could not write the flight recorder: {exc.strerror})"
        time.sleep(0.5 * recorder.rank)  # the lowest waiting rank speaks; the job ends with it
        fatal(
            f"watchdog: rank {recorder.rank} waited more than {limit:g} s at step {waiting['step'] + 1} in "
            f"{describe(waiting)}; flight recorders in {os.path.dirname(path) or '.'}/ "
            f"(`python -m simpar debug {os.path.dirname(path) or '.'}` says who is behind)"
        )


def fatal(message: str) -> None:
    """End this rank -- and with it the job -- at once, with ONE line: for failures the other ranks
    cannot take part in (a stalled peer, mismatched collectives). MPICH's launcher then stops every
    other rank quietly and the job's exit status is 2."""
    print(f"simpar: error: {message}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(2)
