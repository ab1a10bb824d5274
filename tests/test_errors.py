"""Bad input: every rank ends, exit status 2, ONE line `simpar: error: ...` on stderr, quickly.

And a rank that crashes mid-training takes the whole job down (non-zero) instead of hanging it.
"""

import time
from pathlib import Path

import pytest

from tests.mpiutil import run_mpi, run_script

FAULT_SCRIPT = Path(__file__).with_name("fault_rank.py")


def assert_one_line_error(res, fragment, elapsed):
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2, f"exit {res.returncode}; stderr:\n{res.stderr}"
    assert len(lines) == 1, f"expected one line, got:\n{res.stderr}"
    assert lines[0].startswith("simpar: error: "), lines[0]
    assert fragment in lines[0], lines[0]
    assert "Traceback" not in res.stdout + res.stderr
    assert elapsed < 15


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
        (2, ["train", "--seed", "-1"], "--seed must be a non-negative integer"),
        (2, ["train", "--momentum", "1.5"], "--momentum must be in"),
        (2, ["tour", "--quick", "--layers", "32,10"], "inputs have 64 features"),
        (2, ["train", "--layers", "32,10"], "inputs have 64 features"),
        (1, ["plot-everything"], "unknown command"),
    ],
)
def test_bad_input_is_one_clear_line(n, args, fragment):
    t = time.time()
    res = run_mpi(n, args, timeout=30)
    assert_one_line_error(res, fragment, time.time() - t)


def test_corrupt_idx_file_is_one_clear_line(tmp_path):
    from tests.test_data import write_idx_set

    write_idx_set(tmp_path, n_train=20, n_test=5)
    (tmp_path / "train-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x03garbage")
    t = time.time()
    res = run_mpi(
        2, ["train", "--dataset", "mnist", "--data-dir", str(tmp_path), "--layers", "784,32,10"], timeout=30
    )
    assert_one_line_error(res, "is truncated or corrupt", time.time() - t)


def test_nan_loss_names_step_and_layer(tmp_path):
    t = time.time()
    res = run_mpi(2, ["train", "--lr", "1e6", "--steps", "50", "--quiet"], timeout=30)
    assert_one_line_error(res, "loss became", time.time() - t)
    assert "at step" in res.stderr and "layer" in res.stderr


def test_no_half_written_metrics_after_an_error(tmp_path):
    out = tmp_path / "m.json"
    res = run_mpi(
        2, ["train", "--lr", "1e6", "--steps", "50", "--quiet", "--metrics-out", str(out)], timeout=30
    )
    assert res.returncode == 2
    assert not out.exists() and not list(tmp_path.iterdir())


def test_a_rank_that_raises_mid_training_ends_the_job():
    t = time.time()
    res = run_script(4, FAULT_SCRIPT, timeout=60)
    elapsed = time.time() - t
    assert res.returncode != 0
    assert "injected fault on rank 2" in res.stderr
    assert elapsed < 15, f"took {elapsed:.1f} s"
