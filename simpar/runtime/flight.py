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
person's patience; 0 turns it off) -- or a step runs that long without any communication, as on a
stalled rank -- the rank dumps its recorder to `simpar-flight/rank-K.json` and ends with exit
status 2; the first rank to get there says why in ONE line (the operation, and the peer it waits
for); MPI_Abort then ends every rank, one that cannot run its watchdog (SIGSTOP, hung in C code)
too. `simpar debug DIR` (report/debug.py) reads the dumps and names the rank that is behind, or
the ranks whose collectives differ.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from collections import deque

SIZE = 512
DEFAULT_WATCHDOG_S = 120.0
DUMP_DIR = "simpar-flight"

# Whether a progress bar may hold the terminal's current line: print_error starts on a fresh line
# then. Display state only (set while a recorder with progress_bar runs); no run reads it.
_bar_showing = False


class FlightRecorder:
    """This rank's last SIZE communication events, and what it is waiting for right now."""

    def __init__(self, rank: int, world_size: int, dump_dir: str = DUMP_DIR):
        self.rank, self.world_size, self.dump_dir = rank, world_size, dump_dir
        self.events: deque = deque(maxlen=SIZE)
        self.seq = 0
        self.step = 0
        self.collective_seq: dict = {}  # group -> collectives called so far
        self.waiting: dict | None = None  # the event this rank blocks on, with "since"
        self.step_since: float | None = None  # when the current training step began (monotonic)
        self.progress_bar = False  # rank 0 shows one: an error line must start on a fresh line
        self.round_recvs: list = []  # receives posted since a collective last looked (collectives/base.py)
        self.check_collectives = False  # --check-collectives
        self.desync_at: int | None = None  # --inject desync: skip the first collective of this step
        self.running = True  # the watchdog watches while this holds (stop() ends it)
        self._lock = threading.Lock()

    def record(
        self, kind: str, op: str, category: str, group: str, peer, nbytes: int, tag=None, members=None
    ) -> dict:
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
                event["members"] = list(members) if members is not None else None
                group = f"{group}:{','.join(map(str, members))}" if members is not None else group
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


def start(rank: int, world_size: int, watchdog_s: float, dump_dir: str = DUMP_DIR) -> FlightRecorder:
    """A run's recorder (the run's Runtime carries it), and its watchdog thread until `stop`."""
    recorder = FlightRecorder(rank, world_size, dump_dir)
    if watchdog_s > 0:
        threading.Thread(
            target=_watch, args=(recorder, watchdog_s), daemon=True, name="simpar-watchdog"
        ).start()
    return recorder


def show_progress_bar(recorder: FlightRecorder, on: bool) -> None:
    global _bar_showing
    recorder.progress_bar = _bar_showing = on


def take_desync(recorder: FlightRecorder | None) -> bool:
    """--inject desync@rank=R,step=S: True once, for this rank's first collective of step S -- which
    it then skips, as a rank whose code took another branch would. Its peers wait for it."""
    if recorder is not None and recorder.desync_at is not None and recorder.step + 1 >= recorder.desync_at:
        recorder.desync_at = None
        return True
    return False


def stop(recorder: FlightRecorder | None) -> None:
    """The run is over: its watchdog stops watching."""
    global _bar_showing
    if recorder is not None:
        recorder.running = False
        if recorder.progress_bar:
            _bar_showing = False


def describe(event: dict) -> str:
    peer = event.get("peer")
    whom = f"rank {peer}" if isinstance(peer, int) else (peer or "its group")
    return f"{event['op']} ({event['category']}, group {event['group']}) for {whom}"


def _watch(recorder: FlightRecorder, limit: float) -> None:
    """The watchdog thread. Past the limit -- one wait, or one step spent without communicating (a
    stalled rank) -- it dumps the recorder and ends the job with exit status 2. Exactly one rank
    says why: the first to claim the report (a file created exclusively in the dump folder)."""
    poll = min(1.0, limit / 4)
    while recorder.running:
        time.sleep(poll)
        waiting, now, since = recorder.waiting, time.monotonic(), recorder.step_since
        if waiting is not None and now - waiting["since"] >= limit:
            what = f"waited more than {limit:g} s at step {waiting['step'] + 1} in {describe(waiting)}"
        elif waiting is None and since is not None and now - since >= limit:
            what = f"spent more than {limit:g} s in step {recorder.step + 1} without communicating (stalled?)"
        else:
            continue
        try:
            folder = os.path.dirname(recorder.dump()) or "."
        except OSError as exc:
            folder = f"(not written: {exc.strerror})"
        if _claim_report(recorder.dump_dir):  # the first rank here says why; the others keep quiet
            print_error(
                f"watchdog: rank {recorder.rank} {what}; flight recorders in {folder}/ "
                f"(`python -m simpar debug {folder}` says who is behind)"
            )
        # The other ranks' watchdogs fire within a poll or two: let them dump before anyone aborts.
        time.sleep(2 * poll + 0.5)
        fatal(None)


def _claim_report(folder: str) -> bool:
    try:
        os.close(os.open(os.path.join(folder, ".reported"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False
    except OSError:
        return True


def clear_dumps(folder: str = DUMP_DIR) -> None:
    """Rank 0, before training: old dumps would mislead `simpar debug`."""
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        if name.startswith("rank-") or name == ".reported":
            try:
                os.unlink(os.path.join(folder, name))
            except OSError:
                pass


def first_to_report() -> bool:
    """Whether this rank prints an error that every rank may have hit at once: under mpiexec, the
    first rank of this machine to create a marker named after the launcher's proxy (the ranks' common
    parent) says it; a marker over a minute old is a previous job's, with a recycled process id."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized() or mpi.COMM_WORLD.Get_size() == 1:
        return True
    path = os.path.join(tempfile.gettempdir(), f"simpar-error-{os.getppid()}")
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        if time.time() - os.path.getmtime(path) > 60:
            os.utime(path)
            return True
        return False
    except OSError:
        return True


def print_error(message: str) -> None:
    """The one line, starting on a line of its own even after rank 0's progress bar."""
    start = "\n" if _bar_showing else ""
    print(f"{start}simpar: error: {message}", file=sys.stderr, flush=True)


def fatal(message: str | None) -> None:
    """End the whole job at once, from this rank, for failures the other ranks cannot take part in
    (a stalled peer, mismatched collectives): print ONE line (None: print nothing -- another rank
    says it), then MPI_Abort(2). MPICH's launcher then ends every rank, stalled ones too, quietly and
    with exit status 2 -- provided nothing of ours is left to print: the abort's own message to
    stdout/stderr is silenced by pointing both at /dev/null first."""
    if message is not None:
        print_error(message)
    else:
        time.sleep(0.3)  # let a reporter's line out first
    sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.COMM_WORLD.Abort(2)
    os._exit(2)
