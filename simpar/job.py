"""What the ranks of one job share from their first line on: a run id, the one report, a guardian.

Run id. Rank 0 names the job (time and its process id) and every rank learns the name in the first
exchange of every subcommand (agree.same_command), before anything else. Two jobs started in one
working directory therefore never share a marker or a flight-recorder folder (flight.py).

The one report. Several ranks can hit the same failure at once (a stalled peer, a Ctrl-C that
reaches every rank, an MPI error); exactly one of them prints the line. `claim_report` decides: the
first rank to create `simpar-RUNID/reported` in the temporary folder says it, the others keep quiet.

The guardian. A rank killed with SIGKILL (the kernel's out-of-memory killer, `kill -9`, a node that
dies) runs no code of its own, and MPICH's mpiexec then SIGKILLs the others too, so nobody would say
which rank died. Each rank of a multi-rank job therefore starts a tiny watcher process that holds the
read end of a pipe; the rank writes "ok" to it whenever it leaves on purpose (a normal end, an error
line, an abort it chose). End of file without "ok" means the rank died without a word: the guardian
claims the report and prints `simpar: error: rank K died ...`. The rank that died first must be the
one named, though mpiexec kills the others right after it, and on a busy machine (more ranks than
cores) a later victim's guardian can run before the first one's. Two things keep the order: a rank
waits until its guardian is listening before it goes on (so no guardian is still starting up when
its rank dies), and each guardian that sees a silent death notes the time in `simpar-RUNID/died-K`,
waits a moment (DEATH_WINDOW_S) for the others' notes, and only the earliest claims the report.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import tempfile
import time

_run_id: str | None = None
_guardian_fd: int | None = None
DEATH_WINDOW_S = 0.3  # how long a guardian waits for earlier deaths' notes (mpiexec's kills take ms)
GUARDIAN_START_S = 10.0  # the most a rank waits for its guardian to listen (it takes ~20 ms)
_last_checkpoint: str | None = None


def new_run_id() -> str:
    """Rank 0 names the job; markers of jobs over a day old are swept away on the way."""
    _sweep_markers(time.time() - 86400)
    return time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"


def _sweep_markers(before: float) -> None:
    base = tempfile.gettempdir()
    for name in os.listdir(base) if os.path.isdir(base) else []:
        folder = os.path.join(base, name)
        try:
            if name.startswith("simpar-2") and os.path.getmtime(folder) < before:
                for note in os.listdir(folder):  # "reported" and the guardians' "died-K"
                    if note == "reported" or note.startswith("died-"):
                        os.unlink(os.path.join(folder, note))
                os.rmdir(folder)
        except OSError:
            pass


def set_run_id(run_id: str) -> None:
    global _run_id
    _run_id = run_id


def run_id() -> str:
    """This job's id (a process started without the command line gets one of its own)."""
    if _run_id is None:
        set_run_id(new_run_id())
    return _run_id


def _marker_dir(run: str) -> str:
    return os.path.join(tempfile.gettempdir(), f"simpar-{run}")


def claim_report(run: str | None = None) -> bool:
    """True for the first rank (or guardian) of this job to ask; False for every later one."""
    folder = _marker_dir(run or run_id())
    try:
        os.makedirs(folder, exist_ok=True)
        os.close(os.open(os.path.join(folder, "reported"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False
    except OSError:  # no temporary folder to share: better two lines than none
        return True


def note_checkpoint(path: str | None) -> None:
    """The newest complete checkpoint this job can be resumed from (saved or resumed), for Ctrl-C."""
    global _last_checkpoint
    if path:
        _last_checkpoint = path


def last_checkpoint() -> str | None:
    return _last_checkpoint


_checkpoint_root: str | None = None


def note_checkpoint_root(root: str | None) -> None:
    """The --checkpoint-dir of this job: Ctrl-C names the newest complete checkpoint there, which may
    be newer than this rank's last note (rank 0 renamed it into place while this rank still waited)."""
    global _checkpoint_root
    _checkpoint_root = root


def checkpoint_root() -> str | None:
    return _checkpoint_root


# -- the guardian ----------------------------------------------------------------------------------


def start_guardian(rank: int, size: int = 1) -> None:
    """Start this rank's guardian (a lone process gets one too: its shell would only say "Killed")."""
    global _guardian_fd
    if _guardian_fd is not None:
        return
    read_fd, write_fd = os.pipe()
    ready_fd, listening_fd = os.pipe()  # the guardian closes its end once it is listening
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = f"import sys; sys.path.insert(0, {root!r}); from simpar.job import guard; guard()"
    argv = [str(rank), str(size), run_id(), str(read_fd), str(listening_fd)]
    try:
        subprocess.Popen(
            [sys.executable, "-S", "-c", code, *argv],
            pass_fds=(read_fd, listening_fd),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # stderr is kept: the rank's own, where its line belongs
            start_new_session=True,  # a Ctrl-C or mpiexec's cleanup of the rank's group spares it
        )
    except OSError:
        os.close(write_fd)
        return
    finally:
        os.close(read_fd)
        os.close(listening_fd)
    _guardian_fd = write_fd
    atexit.register(release_guardian)
    _wait_until_listening(ready_fd)


def _wait_until_listening(ready_fd: int) -> None:
    """Block until the guardian has closed its end of the ready pipe (end of file), at most
    GUARDIAN_START_S: a rank killed while its guardian still starts would be noticed late."""
    import select

    try:
        select.select([ready_fd], [], [], GUARDIAN_START_S)
    finally:
        os.close(ready_fd)


def release_guardian() -> None:
    """Tell the guardian this rank leaves on purpose (call before os._exit or MPI_Abort too)."""
    global _guardian_fd
    if _guardian_fd is None:
        return
    try:
        os.write(_guardian_fd, b"ok")
        os.close(_guardian_fd)
    except OSError:
        pass
    _guardian_fd = None


def leave(status: int) -> None:
    """Leave now with `status`, ending every rank (MPI_Abort), with nothing more printed: this rank
    tells its guardian it leaves on purpose, then points stdout/stderr at /dev/null (MPICH's abort
    message would be a second line)."""
    release_guardian()
    sys.stdout.flush()
    sys.stderr.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.COMM_WORLD.Abort(status)
    os._exit(status)


def guard() -> None:
    """The guardian process: wait for the rank to go; if it went without "ok", say so, once."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    rank, size, run, fd, listening_fd = sys.argv[1], int(sys.argv[2]), sys.argv[3], *map(int, sys.argv[4:6])
    os.close(listening_fd)  # the rank may go on: its death will be heard from here
    said = b""
    while True:
        try:
            chunk = os.read(fd, 64)
        except OSError:
            chunk = b""
        if not chunk:
            break
        said += chunk
    if b"ok" in said or not _first_to_die(run, rank) or not claim_report(run):
        return
    others = "; mpiexec ended the other ranks" if size > 1 else ""
    print(
        f"simpar: error: rank {rank} died without a word (killed by a signal, e.g. kill -9 or the "
        f"out-of-memory killer, or crashed in C code){others}",
        file=sys.stderr,
        flush=True,
    )


def _first_to_die(run: str, rank: str) -> bool:
    """Note this rank's death with the time this guardian heard of it, wait DEATH_WINDOW_S for the
    notes of others that died about now, and say whether this one was heard first (then lowest rank)."""
    folder = _marker_dir(run)
    mine = (time.monotonic(), int(rank))  # CLOCK_MONOTONIC: one clock for every process of a node
    try:
        os.makedirs(folder, exist_ok=True)
        _write_note(os.path.join(folder, f"died-{rank}"), f"{mine[0]!r}")
        time.sleep(DEATH_WINDOW_S)
        notes = []
        for name in os.listdir(folder):
            if name.startswith("died-") and not name.endswith(".tmp"):
                with open(os.path.join(folder, name)) as note:
                    notes.append((float(note.read()), int(name[len("died-") :])))
    except (OSError, ValueError):  # no shared folder or a torn note: claim_report alone decides
        return True
    return min(notes, default=mine) >= mine


def _write_note(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as note:
        note.write(text)
    os.replace(path + ".tmp", path)
