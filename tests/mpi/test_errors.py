"""Bad input: every rank ends, exit status 2, ONE line `simpar: error: ...` on stderr, quickly.

And a rank that crashes mid-training takes the whole job down (non-zero) instead of hanging it.
"""

import os
import re
import subprocess
import sys

import pytest

from tests.mpiutil import env, mpiexec, run_mpi, run_script
from tests.paths import MPI_SCRIPTS

FAULT_SCRIPT = MPI_SCRIPTS / "fault_rank.py"
FULL_DISK_SCRIPT = MPI_SCRIPTS / "full_disk.py"


def assert_one_line_error(res, fragment, after_training=False):
    """No timing here: the hang guard is the launch's timeout (run_mpi(timeout=...)).

    after_training: the run got as far as the tqdm progress bar (rank 0's stderr), whose lines
    are not error output; every error found before training must come before any bar."""
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    if after_training:
        lines = [line for line in lines if not re.match(r"train:\s+\d+%\|", line)]
    assert res.returncode == 2, f"exit {res.returncode}; stderr:\n{res.stderr}"
    assert len(lines) == 1, f"expected one line, got:\n{res.stderr}"
    assert lines[0].startswith("simpar: error: "), lines[0]
    assert fragment in lines[0], lines[0]
    assert "Traceback" not in res.stdout + res.stderr


@pytest.mark.parametrize(
    "n,args,fragment",
    [
        (3, ["train", "--tp", "2"], "not divisible by tp*pp"),
        (4, ["train", "--dp", "3"], "does not factor into dp*tp*pp"),
        (2, ["train", "--optimizer", "lion"], "invalid choice: 'lion'"),
        (2, ["train", "--dataset", "imagenet"], "invalid choice: 'imagenet'"),
        (2, ["train", "--bogus-flag"], "unrecognized arguments"),
        (2, ["train", "--steps", "many"], "invalid int value"),
        (4, ["train", "--batch", "2"], "smaller than dp"),
        (2, ["train", "--dataset", "mnist", "--data-dir", "/nonexistent/mnist"], "has no train-images"),
        (2, ["train", "--tp", "2", "--layers", "64,99,30,10"], "[99] are not divisible by --tp 2"),
        (2, ["train", "--pp", "2", "--layers", "64,10"], "more pipeline stages than the model has layers"),
        (2, ["train", "--metrics-out", "/nonexistent/dir/m.json"], "not a writable file path"),
        (2, ["train", "--metrics-out", "."], "not a writable file path"),
        (2, ["train", "--layers", "64,200000,200000,10"], "needs about"),
        (
            2,
            ["train", "--dataset", "synthetic", "--layers", "64,10", "--samples", "100000000000"],
            "--samples",
        ),
        (
            2,
            ["train", "--dataset", "synthetic", "--layers", "64,10", "--samples", "1e11"],
            "invalid int value",
        ),
        (2, ["train", "--metrics-out", "/nonexistent-dir/new/"], "it names a folder"),
        (2, ["train", "--weights-out", "/dev/null"], "it is a device, not a regular file"),
        (2, ["train", "--metrics-out", "/proc/self/comm"], "cannot create a file in /proc/self"),
        (1, ["plot", "--timeline", "t.json", "-o", "/missing/t.png"], "folder /missing does not exist"),
        (2, ["train", "--seed", "-1"], "--seed must be a non-negative integer"),
        (2, ["train", "--momentum", "1.5"], "--momentum must be in"),
        (2, ["tour", "--quick", "--layers", "32,10"], "inputs have 64 features"),
        (2, ["train", "--layers", "32,10"], "inputs have 64 features"),
        (1, ["plot-everything"], "unknown command"),
        (1, ["train", "--layers", "64,,10"], "expected comma-separated integers, got '64,,10'"),
        (2, ["train", "--top-k", "3"], "--top-k: options of a mixture of experts' router; add --experts E"),
        (1, ["train", "--loss-scale", "8"], "--loss-scale sets mixed precision's loss scaler"),
    ],
)
def test_bad_input_is_one_clear_line(n, args, fragment):
    res = run_mpi(n, args, timeout=30)
    assert_one_line_error(res, fragment)


def test_corrupt_idx_file_is_one_clear_line(tmp_path):
    from tests.unit.run.test_data import write_idx_set

    write_idx_set(tmp_path, n_train=20, n_test=5)
    (tmp_path / "train-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x03garbage")
    res = run_mpi(
        2, ["train", "--dataset", "mnist", "--data-dir", str(tmp_path), "--layers", "784,32,10"], timeout=30
    )
    assert_one_line_error(res, "is truncated or corrupt")


def test_nan_loss_names_step_and_layer(tmp_path):
    res = run_mpi(2, ["train", "--lr", "1e30", "--steps", "50", "--quiet"], timeout=30)
    assert_one_line_error(res, "loss became")
    assert "at step" in res.stderr and "layer" in res.stderr


def test_error_line_starts_a_line_of_its_own_after_the_progress_bar():
    """Without --quiet the tqdm bar is on stderr (rank 0); the error must not be glued to it."""
    res = run_mpi(2, ["train", "--lr", "1e30", "--steps", "50"], timeout=30)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    errors = [line for line in res.stderr.splitlines() if "simpar: error:" in line]
    assert len(errors) == 1 and errors[0].lstrip(" ").startswith("simpar: error: loss became"), res.stderr
    before = res.stderr[: res.stderr.index("simpar: error:")].rstrip(" ")
    assert before == "" or before.endswith(("\n", "\r")), repr(res.stderr)


def test_a_finite_blow_up_is_divergence():
    """float64 keeps 1e117 finite (exit 0 before the rule); loss > 1e6 x the first step's stops it."""
    res = run_mpi(1, ["train", "--dtype", "float64", "--lr", "10", "--steps", "30"], timeout=30)
    assert_one_line_error(res, "loss diverged to", after_training=True)
    assert "above 1e+06 x max(first step's loss" in res.stderr


def test_no_half_written_metrics_after_an_error(tmp_path):
    out = tmp_path / "m.json"
    res = run_mpi(
        2, ["train", "--lr", "1e6", "--steps", "50", "--quiet", "--metrics-out", str(out)], timeout=30
    )
    assert res.returncode == 2
    assert not out.exists() and not list(tmp_path.iterdir())


def test_a_rank_that_raises_mid_training_ends_the_job():
    res = run_script(4, FAULT_SCRIPT, timeout=60)  # a job left hanging by the dead rank fails here
    assert res.returncode != 0
    assert "injected fault on rank 2" in res.stderr


# -- ranks given different inputs: MPMD launches (`mpiexec -n 1 A : -n 1 B`) -------------------------


def run_mpmd(*per_rank_args, timeout=30):
    """One rank per argument list, each with its own command line."""
    cmd = [mpiexec()]
    for i, args in enumerate(per_rank_args):
        cmd += ([":"] if i else []) + ["-n", "1", sys.executable, "-m", "mpi4py", "-m", "simpar", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env())


@pytest.mark.parametrize(
    "rank1_args,fragment",
    [
        (["--batch", "0"], "ranks disagree on --batch: rank 0 has 64, rank 1 has 0"),
        (["--lr", "0.5"], "ranks disagree on --lr: rank 0 has 0.05, rank 1 has 0.5"),
        (["--no-overlap"], "ranks disagree on --no-overlap"),
    ],
)
def test_ranks_with_different_options_fail_together(rank1_args, fragment):
    """Used to hang (validate failed on rank 1 only) or, for --lr, train silently wrong."""
    res = run_mpmd(["train", "--steps", "5"], ["train", "--steps", "5", *rank1_args])
    assert_one_line_error(res, fragment)


# -- data files ----------------------------------------------------------------------------------------


def _mnist(folder):
    layers = ["--layers", "784,32,10", "--batch", "8", "--steps", "2"]
    return ["train", "--dataset", "mnist", "--data-dir", str(folder), *layers]


def test_truncated_gz_idx_is_one_line(tmp_path):
    from tests.unit.run.test_data import write_idx_set

    write_idx_set(tmp_path, n_train=200, n_test=5, gz=True)
    gz = tmp_path / "train-images-idx3-ubyte.gz"
    gz.write_bytes(gz.read_bytes()[: gz.stat().st_size // 2])
    res = run_mpi(2, _mnist(tmp_path), timeout=30)
    assert_one_line_error(res, "is truncated or corrupt")


def test_labels_beyond_the_classes_are_one_line(tmp_path):
    from tests.unit.run.test_data import write_idx, write_idx_set

    write_idx_set(tmp_path, n_train=20, n_test=5)
    write_idx(tmp_path / "train-labels-idx1-ubyte", [12] * 20)
    res = run_mpi(2, _mnist(tmp_path), timeout=30)
    assert_one_line_error(res, "a label is 12; MNIST labels must be 0..9")


def test_an_idx_file_with_no_rows_is_one_line(tmp_path):
    import numpy as np

    from tests.unit.run.test_data import write_idx, write_idx_set

    write_idx_set(tmp_path, n_train=20, n_test=5)
    write_idx(tmp_path / "train-images-idx3-ubyte", np.zeros((0, 28, 28)))
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.zeros(0))
    res = run_mpi(2, _mnist(tmp_path), timeout=30)
    assert_one_line_error(res, "the training IDX files hold 0 rows")


# -- output files --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "folder", "same-path"])
def test_bad_output_paths_are_refused_before_training(tmp_path, kind):
    target = tmp_path / "out"
    if kind == "fifo":
        os.mkfifo(target)
        args, fragment = ["--metrics-out", str(target)], "it is a FIFO, not a regular file"
    elif kind == "folder":
        target.mkdir()
        args, fragment = ["--trace", str(target)], "it names a folder"
    else:
        args = ["--metrics-out", str(target), "--weights-out", str(tmp_path / "." / "out")]
        fragment = "the same file as --metrics-out"
    res = run_mpi(2, ["train", "--steps", "50", *args], timeout=30)
    assert_one_line_error(res, fragment)
    assert "train:" not in res.stderr  # refused before the first step, not after training


def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path):
    out = tmp_path / "m.json"
    res = run_script(2, FULL_DISK_SCRIPT, ["train", "--steps", "2", "--metrics-out", str(out)], timeout=30)
    assert_one_line_error(res, f"cannot write {out}: File too large", after_training=True)
    assert not list(tmp_path.iterdir())
