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
stalled rank -- the rank dumps its recorder to `simpar-flight/RUNID/rank-K.json` (one folder per
job, job.py; the newest KEEP_RUNS kept) and ends with exit status 2; the first rank to get there
says why in ONE line, naming the rank the recorders agree is behind (it reads the dumps as `simpar
debug` does); MPI_Abort then ends every rank, one that cannot run its watchdog (SIGSTOP, hung in C code)
too. `simpar debug DIR` (report/debug.py) reads the dumps and names the rank that is behind, or
the ranks whose collectives differ.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from collections import deque

from .. import console, job

SIZE = 512
DEFAULT_WATCHDOG_S = 120.0
DUMP_DIR = "simpar-flight"
KEEP_RUNS = 5  # flight-recorder folders of earlier jobs kept (the newest), for `simpar debug`
IO_GRACE_S = 120.0  # a checkpoint write may take this long before the watchdog calls it a hang

# The process's latest recorder: display state for the final line only (Ctrl-C's step, whether rank
# 0's bar may hold the terminal line). No run reads it: each run's own recorder travels in its Runtime.
_last: "FlightRecorder | None" = None


def last() -> "FlightRecorder | None":
    return _last


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
        self.in_io = False  # inside a checkpoint write (io_section): waits get IO_GRACE_S
        self.firing = False  # the watchdog has decided to end the job
        self.fire_lock = threading.Lock()  # the watchdog firing vs. the run ending: one or the other
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


def start(rank: int, world_size: int, watchdog_s: float, dump_dir: str | None = None) -> FlightRecorder:
    """A run's recorder (the run's Runtime carries it), and its watchdog thread until `stop`. Dumps go
    to a folder of this job's own (simpar-flight/RUNID), so the next job keeps them."""
    global _last
    recorder = _last = FlightRecorder(rank, world_size, dump_dir or os.path.join(DUMP_DIR, job.run_id()))
    if watchdog_s > 0:
        threading.Thread(
            target=_watch, args=(recorder, watchdog_s), daemon=True, name="simpar-watchdog"
        ).start()
    return recorder


def show_progress_bar(recorder: FlightRecorder, on: bool) -> None:
    recorder.progress_bar = on


def take_desync(recorder: FlightRecorder | None) -> bool:
    """--inject desync@rank=R,step=S: True once, for this rank's first collective of step S -- which
    it then skips, as a rank whose code took another branch would. Its peers wait for it."""
    if recorder is not None and recorder.desync_at is not None and recorder.step + 1 >= recorder.desync_at:
        recorder.desync_at = None
        return True
    return False


def stop(recorder: FlightRecorder | None) -> None:
    """The run is over: its watchdog stops watching. If the watchdog already decided to end the job
    (its line may be printed), wait for it to do so: returning would let this rank exit 0 after an
    error line."""
    if recorder is None:
        return
    with recorder.fire_lock:
        recorder.running = False
    if recorder.firing:
        threading.Event().wait()  # the watchdog thread ends the process


class io_section:
    """`with flight.io_section(recorder):` around a checkpoint write: rank 0 writes while the others
    wait for it, and neither is a hang until IO_GRACE_S (a slow disk is not a stalled rank)."""

    def __init__(self, recorder: FlightRecorder | None):
        self.recorder = recorder

    def __enter__(self):
        if self.recorder is not None:
            self.recorder.in_io = True

    def __exit__(self, *exc):
        if self.recorder is not None:
            self.recorder.in_io = False


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
        allowed = max(limit, IO_GRACE_S) if recorder.in_io else limit
        if waiting is not None and now - waiting["since"] >= allowed:
            what = f"rank {recorder.rank} waited more than {allowed:g} s at step {waiting['step'] + 1} in "
            what += describe(waiting)
        elif waiting is None and since is not None and now - since >= allowed:
            what = f"rank {recorder.rank} spent more than {allowed:g} s in step {recorder.step + 1} "
            what += "without communicating (stalled?)"
        else:
            continue
        with recorder.fire_lock:  # the run may have ended meanwhile: then it is not a hang
            if not recorder.running:
                return
            recorder.firing = True
        try:
            folder = os.path.dirname(recorder.dump()) or "."
        except OSError as exc:
            folder = f"(not written: {exc.strerror})"
        # The other ranks' watchdogs fire within a poll or two: let them dump before anyone aborts.
        reporter = job.claim_report()  # the first rank here says why; the others keep quiet
        time.sleep(2 * poll + 0.5)
        if reporter:
            print_error(
                f"watchdog: {_behind(recorder)}{what}; flight recorders in {folder}/ "
                f"(`python -m simpar debug {folder}` says more)"
            )
        fatal(None)


def _behind(recorder: FlightRecorder) -> str:
    """'rank(s) K behind (the flight recorders agree); ' from every rank's dump, as `simpar debug`
    reads them: a waiting rank knows only its own peer, which may itself be waiting."""
    try:
        from .dumps import behind

        ranks = behind(recorder.dump_dir)
    except Exception:  # noqa: BLE001  a dump being rewritten: the rank's own view still helps
        return ""
    if not ranks or ranks == [recorder.rank]:  # the reporter is the one behind: its own words say so
        return ""
    who = f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
    return f"{who} behind (the flight recorders agree); "


def prune_dumps(folder: str = DUMP_DIR, keep: int = KEEP_RUNS) -> None:
    """Rank 0, before training: keep the newest `keep` jobs' dump folders (this job's is new), and
    drop dumps of the old one-folder layout, which would mislead `simpar debug`."""
    if not os.path.isdir(folder):
        return
    runs = []
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if name.startswith("rank-") or name == ".reported":
            _unlink(path)
        elif os.path.isdir(path) and name != job.run_id():
            runs.append((os.path.getmtime(path), path))
    for _, path in sorted(runs)[: max(0, len(runs) - (keep - 1))]:
        shutil.rmtree(path, ignore_errors=True)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def first_to_report() -> bool:
    """Whether this rank prints an error that every rank may have hit at once: the first of this
    job to claim the report (job.claim_report)."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized() or mpi.COMM_WORLD.Get_size() == 1:
        return True
    return job.claim_report()


def print_error(message: str) -> None:
    """The one line, starting on a line of its own even after rank 0's progress bar."""
    console.say(f"simpar: error: {message}", bar_elsewhere=_last is not None and _last.progress_bar)


def fatal(message: str | None) -> None:
    """End the whole job at once, from this rank, for failures the other ranks cannot take part in
    (a stalled peer, mismatched collectives): print ONE line (None: print nothing -- another rank
    says it), then MPI_Abort(2). MPICH's launcher then ends every rank, stalled ones too, quietly and
    with exit status 2 -- provided nothing of ours is left to print: the abort's own message to
    stdout/stderr is silenced by pointing both at /dev/null first."""
    if message is not None:
        job.claim_report()  # so that no guardian (job.py) adds a line when the others are killed
        print_error(message)
    else:
        time.sleep(0.3)  # let a reporter's line out first
    job.leave(2)
