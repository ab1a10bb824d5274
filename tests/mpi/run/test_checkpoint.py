"""Checkpoints: the file format (no MPI), resuming in another layout (real MPI jobs), bad checkpoints as
one clear line, and a rank SIGKILLed mid-run followed by `--resume auto`.

The resume matrix saves with one layout and resumes from an early checkpoint with others; the
saving run is itself the uninterrupted reference (saving does not change the numbers), so each
resumed run's losses must equal the reference's from that step on (float64 1e-12, float32 1e-5).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from simpar.run import checkpoint
from simpar.run.launch import _env, mpiexec_path
from tests.conftest import train_json
from tests.mpi.test_errors import assert_one_line_error
from tests.mpiutil import run_mpi

# -- resume in another layout ----------------------------------------------------------------------

# (name, ranks and layout that save, common options, resume from this step, [(ranks, layout)], rtol)
MATRIX = [
    (
        "sgd-dp4",
        (4, ["--dp", "4", "--checkpoint-every", "4"]),
        ["--dtype", "float64", "--steps", "8"],
        4,
        [(1, []), (4, ["--dp", "2", "--tp", "2"]), (2, ["--pp", "2"]), (4, ["--zero", "3"])],
        1e-12,
    ),
    (
        "adam-tp2xpp2",
        (4, ["--tp", "2", "--pp", "2", "--checkpoint-every", "3"]),
        ["--dtype", "float64", "--optimizer", "adam", "--lr", "0.01", "--steps", "8"],
        3,
        [(2, ["--zero", "1"])],
        1e-12,
    ),
    (
        "sgd-zero2-f32",
        (2, ["--zero", "2", "--checkpoint-every", "4"]),
        ["--dtype", "float32", "--steps", "8"],
        4,
        [(2, ["--tp", "2"])],
        1e-5,
    ),
]


def _assert_continues(run: dict, ref: dict, start: int, rtol: float) -> None:
    assert run["checkpoint"]["start_step"] == start
    assert run["steps"] == len(run["losses"]) == len(ref["losses"]) - start
    np.testing.assert_allclose(run["losses"], ref["losses"][start:], rtol=rtol)
    for (W, b), (W0, b0) in zip(run["weights"], ref["weights"]):
        assert W.dtype == W0.dtype
        np.testing.assert_allclose(W, W0, rtol=rtol, atol=rtol * np.abs(W0).max())
        np.testing.assert_allclose(b, b0, rtol=rtol, atol=rtol * np.abs(b0).max())
    assert run["prediction_mismatches"] == []  # the resumed steps still move exactly the predicted bytes


@pytest.mark.parametrize("name,saver,common,start,resumers,rtol", MATRIX, ids=[m[0] for m in MATRIX])
def test_resume_in_another_layout_continues_the_same_run(
    tmp_path, name, saver, common, start, resumers, rtol
):
    ckpt = tmp_path / "ckpt"
    ref = train_json(saver[0], [*common, *saver[1], "--checkpoint-dir", str(ckpt)], tmp_path, "ref")
    assert ref["checkpoint"]["saved"][0] == str(ckpt / f"step-{start:06d}")
    for i, (n, layout) in enumerate(resumers):
        resume = ["--resume", str(ckpt / f"step-{start:06d}")]
        run = train_json(n, [*common, *layout, *resume], tmp_path, f"resumed{i}")
        _assert_continues(run, ref, start, rtol)


# -- bad checkpoints: one line, exit 2 -------------------------------------------------------------


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A real checkpoint of the default model, written by a serial run that was told `--resume auto`
    with an empty folder (so it also shows that case starts fresh and says so)."""
    root = tmp_path_factory.mktemp("saved") / "ckpt"
    res = run_mpi(0, ["train", "--steps", "2", "--quiet", "--checkpoint-dir", str(root), "--resume", "auto"])
    assert res.returncode == 0, res.stderr
    assert f"no checkpoint in {root} yet: starting from step 0" in res.stdout
    return root / "step-000002"


def _damaged(saved: Path, tmp_path: Path, how: str) -> Path:
    bad = tmp_path / "step-000002"
    shutil.copytree(saved, bad)
    if how == "flip":
        data = bytearray((bad / "params.npz").read_bytes())
        data[len(data) // 2] ^= 0xFF
        (bad / "params.npz").write_bytes(bytes(data))
    elif how == "truncate":
        data = (bad / "optimizer.npz").read_bytes()
        (bad / "optimizer.npz").write_bytes(data[: len(data) // 3])
    elif how == "no-manifest":
        (bad / "manifest.json").unlink()
    elif how == "bad-manifest":
        (bad / "manifest.json").write_text('{"format": "simpar-checkpoint", "step": ')
    elif how == "no-file":
        (bad / "optimizer.npz").unlink()
    return bad


@pytest.mark.parametrize(
    "n,how,extra,fragment",
    [
        (2, "flip", [], "params.npz is corrupt: its sha256 differs"),
        (1, "truncate", [], "optimizer.npz is truncated or corrupt"),
        (1, "no-manifest", [], "is not complete (no manifest.json)"),
        (1, "bad-manifest", [], "manifest.json is corrupt"),
        (1, "no-file", [], "optimizer.npz is missing"),
        (
            2,
            None,
            ["--layers", "64,32,10"],
            "was trained with --layers 64,128,128,128,10; this run has --layers 64,32,10",
        ),
        (1, None, ["--optimizer", "adam"], "was trained with --optimizer sgd"),
        (1, None, ["--steps", "2"], "nothing left to train"),
    ],
)
def test_a_bad_checkpoint_is_one_clear_line(saved, tmp_path, n, how, extra, fragment):
    path = _damaged(saved, tmp_path, how) if how else saved
    res = run_mpi(n, ["train", "--steps", "4", "--resume", str(path), *extra], timeout=30)
    assert_one_line_error(res, fragment)


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--resume", "/nonexistent/step-000040"], "no such checkpoint"),
        (["--resume", "auto"], "--resume auto needs --checkpoint-dir"),
        (["--checkpoint-every", "5"], "--checkpoint-every needs --checkpoint-dir"),
    ],
)
def test_missing_checkpoint_or_folder_is_one_clear_line(args, fragment):
    res = run_mpi(1, ["train", "--steps", "4", *args], timeout=30)
    assert_one_line_error(res, fragment)


def test_a_fresh_run_will_not_prune_someone_elses_checkpoints(saved):
    res = run_mpi(1, ["train", "--steps", "4", "--checkpoint-dir", str(saved.parent)], timeout=30)
    assert_one_line_error(res, "already holds checkpoints (newest step-000002)")


# -- kill one rank, then recover -------------------------------------------------------------------


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])  # field 4, after the (command name)
            out.setdefault(ppid, []).append(int(entry))
    return out


def _rank_pid(mpiexec_pid: int, rank: int) -> int | None:
    """The pid of MPI rank `rank` of this mpiexec: a descendant whose environment says PMI_RANK."""
    children, todo = _children(), [mpiexec_pid]
    while todo:
        for pid in children.get(todo.pop(), []):
            todo.append(pid)
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"PMI_RANK={rank}".encode() in env:
                return pid
    return None


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="finds the rank's pid in /proc (Linux)")
def test_sigkill_one_rank_then_resume_auto_reaches_the_same_weights(tmp_path):
    ckpt = tmp_path / "ckpt"
    common = ["--dp", "4", "--dtype", "float64", "--steps", "60", "--checkpoint-every", "5"]
    args = ["train", *common, "--quiet", "--checkpoint-dir", str(ckpt), "--resume", "auto"]
    cmd = [mpiexec_path(), "-n", "4", sys.executable, "-m", "mpi4py", "-m", "simpar", *args]
    with open(tmp_path / "out.txt", "w") as out:
        job = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=_env())
        try:
            victim, deadline = None, time.time() + 60
            while time.time() < deadline and job.poll() is None:
                victim = victim or _rank_pid(job.pid, 2)
                if victim and (ckpt / "step-000010" / "manifest.json").exists():
                    break
                time.sleep(0.002)
            assert job.poll() is None and victim, "the run ended (or never started) before step 10"
            # Killed right after a checkpoint: rank 0 cannot save the next one (every step needs
            # rank 2's gradients), so this is a kill mid-training, not mid-write.
            os.kill(victim, signal.SIGKILL)
            job.wait(timeout=30)  # the hang guard: survivors must not wait forever on the dead rank
        finally:
            if job.poll() is None:
                job.kill()
    assert job.returncode != 0
    # Nothing half-written, no temporary folder: only complete checkpoints that verify.
    names = sorted(set(os.listdir(ckpt)) - {".lock"})  # the lock of the job that held the folder
    assert names and all(n.startswith("step-") for n in names), names
    for _, path in checkpoint.complete(str(ckpt)):
        checkpoint.load(path)
    newest = checkpoint.complete(str(ckpt))[-1][0]
    assert newest >= 10

    # Had rank 0 been killed while writing, its temporary folder would be here: the relaunch clears it.
    (ckpt / f".tmp-step-{newest + 5:06d}-99999").mkdir()
    resumed = train_json(4, [*common, "--checkpoint-dir", str(ckpt), "--resume", "auto"], tmp_path, "resumed")
    assert not [n for n in os.listdir(ckpt) if n.startswith(".") and n != ".lock"]
    assert resumed["checkpoint"]["start_step"] == newest
    assert resumed["checkpoint"]["resumed_from"] == str(ckpt / f"step-{newest:06d}")
    whole = train_json(4, common[:-2], tmp_path, "whole")
    for (W, b), (W0, b0) in zip(resumed["weights"], whole["weights"]):
        np.testing.assert_array_equal(W, W0)  # the same layout, the same operations: bit for bit
        np.testing.assert_array_equal(b, b0)
    np.testing.assert_array_equal(resumed["losses"], whole["losses"][newest:])
    assert json.loads((ckpt / "step-000060" / "manifest.json").read_text())["step"] == 60


def test_resume_auto_after_the_final_step_is_done_not_an_error(tmp_path):
    """`--resume auto` means "rerun the same command": a job that already saved its final step (it may
    have died after that) has nothing to train, which is success (exit 0, one line saying so, no
    outputs written); an explicit --resume of that checkpoint stays an error (test above)."""
    folder, metrics = tmp_path / "ck", tmp_path / "m.json"
    args = ["train", "--steps", "4", "--checkpoint-dir", str(folder), "--checkpoint-every", "2"]
    first = run_mpi(2, [*args, "--dp", "2", "--resume", "auto", "--quiet"], timeout=60)
    assert first.returncode == 0, first.stderr
    again = run_mpi(2, [*args, "--dp", "2", "--resume", "auto", "--metrics-out", str(metrics)], timeout=60)
    assert again.returncode == 0 and "Traceback" not in again.stderr, again.stderr
    assert "is at the final step 4: this job already finished" in again.stdout, again.stdout
    assert not metrics.exists()
