"""Issue 25: what a hostile or careless user still found. Each case runs the real launcher (real MPI
ranks, real signals, real files) and must end with ONE line and the right exit status, nothing
overwritten: `simpar: error: ...` and 2 (a watchdog, a refusal), 130 for Ctrl-C, and for a rank
killed with SIGKILL a line naming it. The numbers are the issue's.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from simpar.run.launch import _env, mpiexec_path
from tests.paths import MPI_SCRIPTS

DISK_FAULTS = MPI_SCRIPTS / "disk_faults.py"
BAR = re.compile(r"^train:\s+\d+%\|")


def command(n: int, args: list[str], script: Path | None = None) -> list[str]:
    """`[mpiexec -n n] python -m mpi4py -m simpar ARGS` (n=0: no mpiexec); `script` instead of -m simpar."""
    main = [str(script)] if script else ["-m", "simpar"]
    cmd = [sys.executable, "-m", "mpi4py", *main, *args]
    return [mpiexec_path(), "-n", str(n), *cmd] if n else cmd


def env(**extra) -> dict:
    return {**_env(), **extra}


def simpar(n, args, cwd, timeout=60, script=None, **extra) -> subprocess.CompletedProcess:
    return subprocess.run(
        command(n, args, script), capture_output=True, text=True, timeout=timeout, env=env(**extra), cwd=cwd
    )


def start(n, args, cwd, **extra) -> subprocess.Popen:
    """In a session of its own: a signal sent to it never reaches pytest."""
    return subprocess.Popen(
        command(n, args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(**extra),
        cwd=cwd,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen, timeout=60) -> subprocess.CompletedProcess:
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def the_line(res, code=2, prefix="simpar: error: ") -> str:
    """The run's one final line; it must stand on a line of its own (not glued to the progress bar)."""
    pieces = [p for p in re.split(r"[\r\n]", res.stderr) if p.strip() and not BAR.match(p)]
    said = [p for p in pieces if "simpar: error" in p or "simpar: interrupted" in p]
    assert res.returncode == code, f"exit {res.returncode}\n{res.stdout[-1500:]}\n{res.stderr[-1500:]}"
    assert len(said) == 1, res.stderr
    assert said[0].startswith(prefix), repr(said[0])
    assert "Traceback" not in res.stdout + res.stderr
    return said[0]


def wait_for(path: Path, proc: subprocess.Popen, timeout=60) -> None:
    """Until `path` exists (the run got that far); a hang guard, not a timed assertion."""
    end = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, finish(proc).stderr
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.05)


def wait_for_step(ck: Path, step: int, proc: subprocess.Popen, timeout=60) -> None:
    """Until --checkpoint-dir `ck` holds a checkpoint at `step` or later (older ones are pruned as the
    run goes on, possibly between two looks)."""
    from simpar.run import checkpoint

    end = time.monotonic() + timeout
    while not any(s >= step for s, _ in checkpoint.complete(str(ck))):
        assert proc.poll() is None, finish(proc).stderr
        assert time.monotonic() < end, f"no checkpoint at step {step} or later in {ck}"
        time.sleep(0.02)


def rank_pid(cwd: Path, rank: int) -> int:
    """The process of MPI rank `rank` of the job running in `cwd` (its environment says PMI_RANK)."""
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or os.readlink(entry / "cwd") != str(cwd):
                continue
            environ = (entry / "environ").read_bytes().split(b"\0")
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if f"PMI_RANK={rank}".encode() in environ and b"mpi4py" in cmdline:
            return int(entry.name)
    raise AssertionError(f"no rank {rank} running in {cwd}")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- 1 and 11: two jobs in one working directory ------------------------------------------------------


def test_two_stalled_jobs_in_one_folder_each_say_why_and_keep_their_dumps(tmp_path):
    """The report marker was shared by every job in a folder: the second stalled job failed silently,
    and each job deleted the last one's flight-recorder dumps."""
    args = [
        "train",
        "--steps",
        "10",
        "--watchdog",
        "3",
        "--quiet",
        "--inject",
        "stall@rank=0,step=2,seconds=20",
    ]
    first = start(0, args, tmp_path)
    second = start(0, args, tmp_path)  # both stall at once: the first to report silenced the other
    for res in (finish(first), finish(second)):
        assert "watchdog: rank 0 spent more than 3 s in step 2" in the_line(res)
    runs = sorted(p for p in (tmp_path / "simpar-flight").iterdir())
    assert len(runs) == 2 and all((run / "rank-0.json").exists() for run in runs)
    # A third run keeps them (only jobs beyond flight.KEEP_RUNS are pruned, oldest first).
    assert simpar(0, ["train", "--steps", "2", "--quiet"], tmp_path).returncode == 0
    assert sorted(p for p in (tmp_path / "simpar-flight").iterdir() if p.is_dir()) == runs


def test_only_old_jobs_dumps_are_pruned(tmp_path, monkeypatch):
    from simpar import job
    from simpar.runtime import flight

    monkeypatch.chdir(tmp_path)
    old = []
    for i in range(flight.KEEP_RUNS + 2):
        run = tmp_path / flight.DUMP_DIR / f"run-{i}"
        run.mkdir(parents=True)
        (run / "rank-0.json").write_text("{}")
        os.utime(run, (1000 + i, 1000 + i))
        old.append(run)
    job.set_run_id("this-run")
    flight.prune_dumps()
    kept = sorted(p for p in (tmp_path / flight.DUMP_DIR).iterdir())
    assert kept == old[-(flight.KEEP_RUNS - 1) :]  # room for this job's own folder


# -- 2: ranks running different subcommands -----------------------------------------------------------


@pytest.mark.parametrize("other", [["tour", "--quick"], ["plan"], ["bench", "allreduce"]])
def test_ranks_running_different_commands_fail_together(tmp_path, other):
    cmd = [mpiexec_path(), "-n", "2", *command(0, ["train", "--steps", "3"])]
    cmd += [":", "-n", "2", *command(0, other)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env(), cwd=tmp_path)
    line = the_line(res)
    assert "ranks run different commands" in line and f"ranks 2, 3 run `simpar {' '.join(other)}`" in line


# -- 3: the watchdog -------------------------------------------------------------------------------------


def test_a_tiny_watchdog_is_refused_before_training(tmp_path):
    res = simpar(0, ["train", "--steps", "3", "--watchdog", "1e-9", "--metrics-out", "wd.json"], tmp_path)
    assert "--watchdog 1e-09: give at least 1 s" in the_line(res)
    assert not (tmp_path / "wd.json").exists()


def test_a_slow_checkpoint_write_is_not_a_hang(tmp_path):
    """Rank 0 writes for 2.5 s while the other rank waits for it, under --watchdog 1."""
    args = ["train", "--dp", "2", "--steps", "4", "--watchdog", "1", "--quiet", "--checkpoint-dir", "ck"]
    res = simpar(
        2, [*args, "--metrics-out", "m.json"], tmp_path, script=DISK_FAULTS, SIMPAR_DISK_FAULT="slow"
    )
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "m.json").read_text())["checkpoint"]["saved"] == ["ck/step-000004"]


WATCHDOG_AT_THE_END = """
import sys, time
from simpar.runtime import flight
recorder = flight.start(0, 1, 1.0, sys.argv[1])
recorder.step_since = time.monotonic() - 60  # a step that has 'run' for a minute
while not list(__import__("pathlib").Path(sys.argv[1]).glob("rank-*.json")):
    time.sleep(0.01)  # the watchdog has fired (it dumps first) but not yet ended the process
flight.stop(recorder)  # the run ends normally right then
sys.exit(0)
"""


def test_a_run_that_ends_while_the_watchdog_fires_does_not_exit_0(tmp_path):
    res = subprocess.run(
        [sys.executable, "-c", WATCHDOG_AT_THE_END, str(tmp_path / "dumps")],
        capture_output=True,
        text=True,
        timeout=30,
        env=env(),
    )
    assert "spent more than 1 s" in the_line(res)


# -- 4: Ctrl-C ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 4])
def test_ctrl_c_is_one_line_and_exit_130(tmp_path, n):
    args = ["train", "--steps", "100000", "--checkpoint-dir", "ck", "--checkpoint-every", "3"]
    proc = start(n, args + (["--dp", "4"] if n else []), tmp_path)
    wait_for_step(tmp_path / "ck", 6, proc)
    os.kill(proc.pid, signal.SIGINT)  # mpiexec forwards it to every rank, as a Ctrl-C in a terminal
    line = the_line(finish(proc), code=130, prefix="simpar: interrupted at step ")
    assert re.fullmatch(r"simpar: interrupted at step \d+ \(last checkpoint: ck/step-\d{6}\)", line), line
    step, saved = map(int, re.findall(r"\d+", line))
    assert 6 <= saved < step and (tmp_path / "ck" / f"step-{saved:06d}" / "manifest.json").exists()
    assert not list((tmp_path / "ck").glob(".tmp-*"))


# -- 5 and 8: an output that is an input ------------------------------------------------------------------


def _profile(tmp_path):
    from simpar.costmodel.hardware import PRESETS

    (tmp_path / "h.json").write_text(json.dumps(PRESETS["dgx-h100"].to_dict()))
    return tmp_path / "h.json"


def _metrics(tmp_path):
    assert (
        simpar(0, ["train", "--steps", "2", "--quiet", "--metrics-out", "m.json"], tmp_path).returncode == 0
    )
    return tmp_path / "m.json"


def _checkpoint(tmp_path):
    args = ["train", "--steps", "2", "--quiet", "--checkpoint-dir", "ck"]
    assert simpar(0, args, tmp_path).returncode == 0
    return tmp_path / "ck" / "step-000002" / "params.npz"


@pytest.mark.parametrize(
    "make,args,fragment",
    [
        (_profile, ["train", "--hardware", "h.json", "--metrics-out", "h.json"], "is the --hardware profile"),
        (_metrics, ["plot", "m.json", "-o", "m.json"], "is the metrics file m.json"),
        (
            _checkpoint,
            ["train", "--resume", "ck/step-000002", "--weights-out", "ck/step-000002/params.npz"],
            "is inside the --resume checkpoint",
        ),
        (
            _checkpoint,
            ["train", "--checkpoint-dir", "ck", "--resume", "auto", "--metrics-out", "ck"],
            "is the --checkpoint-dir",
        ),
        (None, ["train", "--checkpoint-dir", "new-ck", "--metrics-out", "new-ck"], "is the --checkpoint-dir"),
    ],
)
def test_an_output_that_is_an_input_is_refused_before_step_1(tmp_path, make, args, fragment):
    kept = make(tmp_path) if make else None
    before = digest(kept) if kept else None
    res = simpar(0, [*args, "--steps", "4"] if args[0] == "train" else args, tmp_path)
    assert fragment in the_line(res)
    assert "train:" not in res.stderr  # refused before the first step, not after the last
    if kept:
        assert digest(kept) == before


def test_weights_out_onto_the_data_file_is_refused(tmp_path):
    from simpar.run import data

    digits = Path(data.__file__).parents[1] / "digits.npz"  # simpar/digits.npz
    kept = digits.read_bytes()
    try:
        res = simpar(0, ["train", "--steps", "2", "--weights-out", str(digits)], tmp_path)
        assert "is the data file" in the_line(res) and digits.read_bytes() == kept
    finally:  # a regression must not cost the checkout its data
        if digits.read_bytes() != kept:
            digits.write_bytes(kept)


# -- 6: an error in the middle of training, with the progress bar drawn ------------------------------


def test_an_error_mid_training_starts_a_line_of_its_own(tmp_path):
    """The disk fills up at the second checkpoint, while rank 0's bar is on screen (no --quiet)."""
    args = ["train", "--dp", "2", "--steps", "8", "--checkpoint-dir", "ck", "--checkpoint-every", "2"]
    res = simpar(2, args, tmp_path, script=DISK_FAULTS, SIMPAR_DISK_FAULT="full@4")
    assert "train:" in res.stderr  # the bar was drawn
    assert "cannot write checkpoint" in the_line(res)
    assert [p.name for p in (tmp_path / "ck").iterdir() if p.name != ".lock"] == ["step-000002"]


# -- 7: the hardware profile ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change,fragment",
    [
        ({"flops": {"fp32": -5}}, "flops['fp32'] must be a finite number > 0, got -5"),
        ({"intra_bw": 0}, "intra_bw must be > 0, got 0"),
        ({"gamma": "fast"}, "gamma must be a finite float, got 'fast'"),
        ({"nic_bw": -1}, "nic_bw must be >= 0"),
        ({"inter_alpha": -1e-6}, "inter_alpha must be >= 0"),
        ({"devices_per_node": -8}, "devices_per_node must be > 0"),
        ({"devices_per_node": 2.5}, "devices_per_node must be a finite int"),
        ({"host_progress": "yes"}, "host_progress must be true or false"),
    ],
)
@pytest.mark.parametrize("clock", ["wall", "sim"])
def test_a_bad_hardware_profile_is_refused_when_read(tmp_path, change, fragment, clock):
    from simpar.costmodel.hardware import PRESETS

    (tmp_path / "h.json").write_text(json.dumps({**PRESETS["dgx-h100"].to_dict(), **change}))
    res = simpar(0, ["train", "--steps", "3", "--clock", clock, "--hardware", "h.json"], tmp_path)
    assert fragment in the_line(res)
    assert "train:" not in res.stderr  # before the first step


# -- 9 and 10: a rank stopped, a rank killed -------------------------------------------------------------


def test_a_stopped_rank_is_the_one_named(tmp_path):
    """kill -STOP of rank 1: its ring neighbour waits for it, but the line names rank 1."""
    args = ["train", "--dp", "4", "--steps", "100000", "--quiet", "--watchdog", "3", "--checkpoint-dir", "ck"]
    proc = start(4, [*args, "--checkpoint-every", "3"], tmp_path)
    wait_for_step(tmp_path / "ck", 3, proc)
    os.kill(rank_pid(tmp_path, 1), signal.SIGSTOP)
    line = the_line(finish(proc))
    assert "watchdog: rank 1 behind (the flight recorders agree)" in line


def test_a_killed_rank_is_named_in_one_line(tmp_path):
    """A real SIGKILL (--inject kill sends it to itself): MPICH's banner, and one line naming rank 1."""
    res = simpar(
        4, ["train", "--dp", "4", "--steps", "200", "--quiet", "--inject", "kill@rank=1,step=3"], tmp_path
    )
    line = the_line(res, code=res.returncode)
    assert res.returncode != 0
    assert line.startswith("simpar: error: rank 1 died without a word"), line


# -- 12: smaller ones ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "inject,fragment",
    [
        ("stall@rank=0,step=2,seconds=-5", "seconds must be a number >= 0"),
        ("stall@rank=0,step=2,seconds=nan", "seconds must be a number >= 0"),
        ("kill@rank=0,step=9", "step 9 is past --steps 5"),
    ],
)
def test_impossible_injections_are_refused_up_front(tmp_path, inject, fragment):
    res = simpar(0, ["train", "--steps", "5", "--inject", inject], tmp_path)
    assert fragment in the_line(res) and "train:" not in res.stderr


def test_a_non_ascii_checkpoint_path_on_an_ascii_terminal(tmp_path):
    args = [
        "train",
        "--steps",
        "4",
        "--quiet",
        "--checkpoint-dir",
        "ck-\u00e9t\u00e9",
        "--checkpoint-every",
        "2",
    ]
    assert simpar(0, args, tmp_path).returncode == 0
    res = simpar(0, [*args[:2], "6", *args[3:], "--resume", "auto"], tmp_path, PYTHONIOENCODING="ascii")
    assert res.returncode == 0, res.stderr
    assert "resuming from ck-\\xe9t\\xe9/step-000004" in res.stdout


def test_a_second_job_on_one_checkpoint_folder_is_refused(tmp_path):
    first = start(
        0,
        ["train", "--steps", "100000", "--quiet", "--checkpoint-dir", "ck", "--checkpoint-every", "50"],
        tmp_path,
    )
    wait_for_step(tmp_path / "ck", 50, first)
    res = simpar(
        0, ["train", "--steps", "100000", "--quiet", "--checkpoint-dir", "ck", "--resume", "auto"], tmp_path
    )
    assert f"--checkpoint-dir ck is in use by another simpar job (process {first.pid})" in the_line(res)
    os.kill(first.pid, signal.SIGINT)
    the_line(finish(first), code=130, prefix="simpar: interrupted")
