"""The guardian names the rank that died first (job.py), even when a later victim's guardian runs first.

Real guardian processes (this tier starts processes), no MPI: each holds the read end of a pipe as it
would for a rank; closing the write end without "ok" is a silent death. On a busy machine the first
victim's guardian can be slower to claim than mpiexec's later victims', which is what the death notes
and their short window are for.
"""

import os
import select
import subprocess
import sys
import time

from simpar import job

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def start(rank: int, run: str) -> tuple[subprocess.Popen, int]:
    read_fd, write_fd = os.pipe()
    ready_fd, listening_fd = os.pipe()
    code = f"import sys; sys.path.insert(0, {ROOT!r}); from simpar.job import guard; guard()"
    args = [str(rank), "4", run, str(read_fd), str(listening_fd)]
    proc = subprocess.Popen(
        [sys.executable, "-S", "-c", code, *args],
        pass_fds=(read_fd, listening_fd),
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(read_fd)
    os.close(listening_fd)
    assert select.select([ready_fd], [], [], 20)[0], "the guardian never said it listens"
    assert os.read(ready_fd, 1) == b""  # end of file: it listens
    os.close(ready_fd)
    return proc, write_fd


def test_the_first_death_is_named_though_its_guardian_claims_last(tmp_path, monkeypatch):
    run = f"{job.new_run_id()}-{time.time_ns()}"  # a name the sweep recognises
    first, later = start(1, run), start(0, run)
    os.close(first[1])  # rank 1 dies first ...
    time.sleep(0.05)
    os.close(later[1])  # ... then mpiexec's kill of rank 0
    lines = [proc.communicate(timeout=20)[1] for proc, _ in (first, later)]
    assert "rank 1 died without a word" in lines[0] and lines[1] == "", lines
    folder = os.path.join(job.tempfile.gettempdir(), f"simpar-{run}")
    assert sorted(os.listdir(folder)) == ["died-0", "died-1", "reported"]
    monkeypatch.setattr(job.os.path, "getmtime", lambda path: 0.0 if path == folder else time.time())
    job._sweep_markers(1.0)  # a day later, the folder and its notes go
    assert not os.path.exists(folder)


def test_a_guardian_that_heard_later_defers_to_an_earlier_note():
    """As if rank 1's guardian had heard first and was still on its way to claim: rank 0's keeps quiet."""
    run = f"{job.new_run_id()}-{time.time_ns()}"
    folder = os.path.join(job.tempfile.gettempdir(), f"simpar-{run}")
    os.makedirs(folder)
    with open(os.path.join(folder, "died-1"), "w") as note:
        note.write(repr(time.monotonic()))
    proc, write_fd = start(0, run)
    os.close(write_fd)
    assert proc.communicate(timeout=20)[1] == ""
    assert sorted(os.listdir(folder)) == ["died-0", "died-1"]  # nobody claimed: rank 1's was to say it
    for name in os.listdir(folder):
        os.unlink(os.path.join(folder, name))
    os.rmdir(folder)


def test_a_rank_that_leaves_on_purpose_is_not_reported():
    run = f"{job.new_run_id()}-{time.time_ns()}"  # a name the sweep recognises
    proc, write_fd = start(2, run)
    os.write(write_fd, b"ok")
    os.close(write_fd)
    assert proc.communicate(timeout=20)[1] == ""
    assert not os.path.exists(os.path.join(job.tempfile.gettempdir(), f"simpar-{run}"))
