"""Fault injection, the watchdog, the flight recorder, `simpar debug` and --check-collectives.

Each fault is injected into a real 4-rank job, run as a user runs it (no --quiet), and the job must
end with exit status 2 and ONE line `simpar: error: ...` on stderr -- no hang, no traceback.
"""

from __future__ import annotations

import json
import subprocess
import sys

from simpar.run.launch import _env, mpiexec_path

COMMON = ["--steps", "6", "--watchdog", "3"]


def simpar(n: int, args: list[str], cwd, timeout: float = 60) -> subprocess.CompletedProcess:
    cmd = [mpiexec_path(), "-n", str(n), sys.executable, "-m", "mpi4py", "-m", "simpar", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env(), cwd=cwd)


def one_error_line(res) -> str:
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2, f"exit {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}"
    errors = [line for line in lines if "simpar: error:" in line]
    assert len(errors) == 1 and lines[-1] == errors[0], res.stderr
    assert errors[0].startswith("simpar: error:"), "the error line must start on a line of its own"
    assert "Traceback" not in res.stderr and "BAD TERMINATION" not in res.stdout
    return errors[0]


def debug(cwd) -> str:
    res = subprocess.run(
        [sys.executable, "-m", "simpar", "debug", "simpar-flight"],
        capture_output=True,
        text=True,
        timeout=30,
        env=_env(),
        cwd=cwd,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_a_stalled_rank_is_named_by_the_watchdog_and_the_flight_recorder(tmp_path):
    res = simpar(4, ["train", "--dp", "4", *COMMON, "--inject", "stall@rank=2,step=3,seconds=40"], tmp_path)
    # exit 2 and the watchdog's line, not a timed assertion: without the watchdog the stall ends, exit 0
    line = one_error_line(res)
    assert "watchdog: rank" in line and "simpar debug" in line
    dumps = sorted((tmp_path / "simpar-flight").glob("*/rank-*.json"))  # one folder per job
    assert len(dumps) >= 2
    dump = json.loads(dumps[0].read_text())
    assert dump["events"] and {"seq", "step", "op", "category", "group", "peer", "bytes", "posted"} <= set(
        dump["events"][0]
    )
    report = debug(tmp_path)
    assert "behind: rank(s)" in report and "2" in report.split("behind: rank(s)")[1].split("(")[0]


def test_a_skipped_collective_is_caught_by_check_collectives(tmp_path):
    res = simpar(
        4,
        [
            "train",
            "--dp",
            "2",
            "--tp",
            "2",
            *COMMON,
            "--check-collectives",
            "--inject",
            "desync@rank=1,step=2",
        ],
        tmp_path,
    )
    line = one_error_line(res)
    assert "--check-collectives: group tp disagrees" in line and "rank 1 called #" in line


def test_without_the_check_the_flight_recorder_shows_the_different_collectives(tmp_path):
    res = simpar(
        4, ["train", "--dp", "2", "--tp", "2", *COMMON, "--inject", "desync@rank=1,step=2"], tmp_path
    )
    assert "watchdog" in one_error_line(res)
    report = debug(tmp_path)
    assert "disagrees at its collective" in report and "(skipped)" in report


def test_an_injected_nan_is_reported_with_its_step_and_layer(tmp_path):
    res = simpar(2, ["train", "--dp", "2", "--steps", "6", "--inject", "nan@rank=1,step=4"], tmp_path)
    line = one_error_line(res)
    assert "at step 4" in line and "layer 0" in line
    # the fault was put there on purpose: name it, rather than blame the learning rate
    assert "--inject nan@rank=1,step=4 put NaN into rank 1's input rows at step 4" in line
    assert "--lr" not in line


def test_a_killed_rank_ends_the_job_quickly(tmp_path):
    """Quickly: simpar()'s timeout (60 s) is the hang guard, not a timed assertion."""
    res = simpar(
        4,
        [
            "train",
            "--dp",
            "4",
            "--steps",
            "200",
            "--quiet",
            "--inject",
            "kill@rank=1,step=3",
            "--metrics-out",
            str(tmp_path / "m.json"),
        ],
        tmp_path,
    )
    assert res.returncode != 0
    assert list(tmp_path.glob("*.json")) == [] and list(tmp_path.glob(".*tmp")) == []  # nothing half-written


def test_bad_injections_are_one_line(tmp_path):
    res = simpar(2, ["train", "--dp", "2", "--inject", "explode@rank=1"], tmp_path)
    assert "--inject KIND@rank=R,step=S" in one_error_line(res)
    res = simpar(2, ["train", "--dp", "2", "--inject", "kill@rank=5,step=1"], tmp_path)
    assert "no such rank" in one_error_line(res)
