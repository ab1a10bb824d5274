"""The fault contract, checked on random runs: whatever goes wrong, and wherever, a run ends with

    exactly one line `simpar: error: ...` or `simpar: interrupted ...`, a nonzero exit status,
    no traceback, no partial output file, every complete checkpoint still loadable,

and rerunning the same command with `--resume auto` reaches the weights of the run that was never
interrupted, bit for bit. Hypothesis draws the layout, optimizer, length, checkpoint interval and
one real fault: a rank SIGKILLed, SIGSTOPped or stalled (the watchdog ends the job), a NaN in the
input, the disk filling up at a checkpoint, or Ctrl-C (SIGINT to mpiexec, which forwards it).

In CI: one example of each fault kind (@example) and five drawn with a fixed seed, about 35 s on
2 cores; more by hand:
    SIMPAR_FAULT_EXAMPLES=40 python -m pytest tests/mpi/test_fault_contract.py -q
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from tests.mpi.test_hostile import DISK_FAULTS, command, env, rank_pid, wait_for

LAYOUTS = {1: [[]], 2: [["--dp", "2"], ["--tp", "2"], ["--dp", "2", "--zero", "1"], ["--pp", "2"]]}
FAULTS = ("kill", "stop", "stall", "nan", "full", "sigint")
EXAMPLES = int(os.environ.get("SIMPAR_FAULT_EXAMPLES", "5"))  # drawn ones, after the four below
_reference: dict = {}  # the uninterrupted run's weights, per (ranks, options)


@st.composite
def scenarios(draw):
    n = draw(st.sampled_from([2, 1]))
    fault = draw(st.sampled_from(FAULTS if n > 1 else tuple(f for f in FAULTS if f != "stop")))
    steps = draw(st.integers(5, 9))
    options = [
        *draw(st.sampled_from(LAYOUTS[n])),
        "--optimizer",
        draw(st.sampled_from(["sgd", "adam"])),
        "--steps",
        str(steps),
        "--checkpoint-every",
        str(draw(st.integers(1, 3))),
    ]
    at = draw(st.integers(2, steps))  # the step the fault strikes
    rank = 0 if fault in ("nan", "full") else draw(st.integers(0, n - 1))  # nan: rank 0 has input rows
    delay = draw(st.sampled_from([0.0, 0.3, 1.0]))  # SIGINT/SIGSTOP: how long after the run started
    return n, options, fault, at, rank, delay


def run(n, args, cwd, script=None, **extra) -> subprocess.CompletedProcess:
    cmd = command(n, args, script)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env(**extra), cwd=cwd)


def weights(path: Path) -> list:
    with np.load(path) as z:
        return [z[k] for k in sorted(z.files)]


def reference(n, options) -> list:
    key = (n, tuple(options))
    if key not in _reference:
        with tempfile.TemporaryDirectory() as tmp:
            args = ["train", *COMMON, *options, "--checkpoint-dir", "ck", "--weights-out", "w.npz"]
            res = run(n, args, tmp)
            assert res.returncode == 0, res.stderr
            _reference[key] = weights(Path(tmp) / "w.npz")
    return _reference[key]


COMMON = ["--quiet", "--kernels", "numpy", "--watchdog", "3"]


def faulted(n, options, fault, at, rank, delay, cwd: Path) -> subprocess.CompletedProcess:
    args = ["train", *COMMON, *options, "--checkpoint-dir", "ck", "--metrics-out", "m.json"]
    if fault in ("kill", "nan"):
        return run(n, [*args, "--inject", f"{fault}@rank={rank},step={at}"], cwd)
    if fault == "full":
        return run(n, args, cwd, script=DISK_FAULTS, SIMPAR_DISK_FAULT=f"full@{at}")
    # stall, stop, sigint: the rank sleeps at step `at` (the watchdog off for Ctrl-C: it is the fault)
    stall = ["--inject", f"stall@rank={rank},step={at},seconds=60"]
    if fault == "stall":
        return run(n, [*args, *stall], cwd)
    if fault == "sigint":
        args[args.index("--watchdog") + 1] = "0"
    proc = subprocess.Popen(
        command(n, [*args, *stall]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env(),
        cwd=cwd,
        start_new_session=True,
    )
    wait_for(cwd / "ck" / ".lock", proc)  # the run is inside simpar (the lock is taken before step 1)
    time.sleep(delay)
    if fault == "sigint":
        os.kill(proc.pid, signal.SIGINT)
    else:
        os.kill(rank_pid(cwd, rank), signal.SIGSTOP)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@settings(
    max_examples=EXAMPLES,
    derandomize=True,  # a fixed seed: CI runs the same examples every time
    phases=[Phase.explicit, Phase.generate],  # no shrinking: each example is a real job of seconds
    report_multiple_bugs=False,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(scenarios())
# Every kind of fault runs in CI: the first drawn examples are kills, a NaN and a serial Ctrl-C.
@example(
    (2, ["--pp", "2", "--optimizer", "adam", "--steps", "7", "--checkpoint-every", "2"], "stop", 4, 1, 0.3)
)
@example(
    (2, ["--tp", "2", "--optimizer", "sgd", "--steps", "6", "--checkpoint-every", "1"], "stall", 3, 1, 0.0)
)
@example(
    (
        2,
        ["--dp", "2", "--zero", "1", "--optimizer", "adam", "--steps", "6", "--checkpoint-every", "2"],
        "full",
        3,
        0,
        0.0,
    )
)
@example(
    (2, ["--dp", "2", "--optimizer", "sgd", "--steps", "8", "--checkpoint-every", "1"], "sigint", 5, 0, 0.3)
)
def test_every_fault_ends_in_one_line_and_resumes_to_the_same_weights(scenario):
    from simpar.run import checkpoint

    n, options, fault, at, rank, delay = scenario
    with tempfile.TemporaryDirectory(prefix="simpar-contract-") as tmp:
        cwd = Path(tmp)
        res = faulted(n, options, fault, at, rank, delay, cwd)
        where = f"{scenario}\nstdout:\n{res.stdout[-1500:]}\nstderr:\n{res.stderr[-1500:]}"
        said = [
            p for p in re.split(r"[\r\n]", res.stderr) if "simpar: error" in p or "simpar: interrupted" in p
        ]
        assert res.returncode != 0, where
        assert len(said) == 1 and re.match(r"simpar: (error|interrupted)", said[0]), where
        assert "Traceback" not in res.stdout + res.stderr, where
        # No partial output: no metrics (the run failed), no temporary file, complete checkpoints only.
        assert not (cwd / "m.json").exists() and not list(cwd.glob(".*.tmp")), where
        for _, path in checkpoint.complete(str(cwd / "ck")):
            checkpoint.load(path)  # verifies sizes and sha256 of every file
        # The same command again, without the fault, picks up where the last checkpoint left off.
        again = run(
            n,
            [
                "train",
                *COMMON,
                *options,
                "--checkpoint-dir",
                "ck",
                "--resume",
                "auto",
                "--weights-out",
                "w.npz",
            ],
            cwd,
        )
        assert again.returncode == 0, f"{where}\nresume:\n{again.stderr[-1500:]}"
        assert not list((cwd / "ck").glob(".tmp-*")), where  # what a killed writer left is cleaned
        expected = reference(n, options)
        got = weights(cwd / "w.npz")
        assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True)), where
