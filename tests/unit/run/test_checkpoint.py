"""Checkpoints in-process: the round trip, `auto` and stale folders, a failed write, the sampler resuming.

The tests that launch real MPI jobs: tests/mpi/run/test_checkpoint.py.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from simpar.run import checkpoint
from simpar.run.checkpoint import FullState
from simpar.run.data import global_batches

# -- the format, in-process ------------------------------------------------------------------------

LAYERS = [4, 6, 3]


def _state(seed: int) -> FullState:
    rng = np.random.default_rng(seed)
    pairs = lambda: [
        (rng.standard_normal((a, b)), rng.standard_normal(b)) for a, b in zip(LAYERS, LAYERS[1:])
    ]
    return FullState(pairs(), {"m": pairs(), "v": pairs()}, {"t": seed})


def _info() -> dict:
    return {
        "model": {"layers": LAYERS, "activation": "relu", "dtype": "float64"},
        "sampler": {"next_step": 0, "n_train": 10},
        "config": {},
    }


def _same(a: FullState, b: FullState) -> None:
    for x, y in zip(a.params + a.slots["m"] + a.slots["v"], b.params + b.slots["m"] + b.slots["v"]):
        np.testing.assert_array_equal(x[0], y[0])
        np.testing.assert_array_equal(x[1], y[1])
    assert a.scalars == b.scalars


def test_round_trip_keeps_the_newest_three_and_nothing_temporary(tmp_path):
    for step in range(1, 6):
        path = checkpoint.save(str(tmp_path), step, _state(step), _info())
    assert path == str(tmp_path / "step-000005")
    assert sorted(os.listdir(tmp_path)) == ["step-000003", "step-000004", "step-000005"]
    manifest, state = checkpoint.load(path)
    _same(state, _state(5))
    assert manifest["step"] == 5 and manifest["slots"] == ["m", "v"]
    with np.load(tmp_path / "step-000005" / "params.npz", allow_pickle=False) as z:
        assert sorted(z.files) == ["W0", "W1", "b0", "b1"]  # plain arrays: no pickle needed


def test_resolve_auto_newest_and_stale_folders(tmp_path):
    root = str(tmp_path)
    assert checkpoint.resolve("auto", root) is None  # nothing yet: start fresh
    checkpoint.save(root, 10, _state(1), _info())
    checkpoint.save(root, 20, _state(2), _info())
    (tmp_path / "step-000030").mkdir()  # no manifest: never finished, never chosen
    (tmp_path / ".tmp-step-000040-123").mkdir()  # what a killed writer leaves
    (tmp_path / ".trash-step-000005-123").mkdir()
    assert checkpoint.resolve("auto", root) == str(tmp_path / "step-000020")
    assert checkpoint.resolve(root, None) == str(tmp_path / "step-000020")  # a --checkpoint-dir
    checkpoint.prepare(root)
    assert sorted(set(os.listdir(tmp_path)) - {".lock"}) == ["step-000010", "step-000020", "step-000030"]
    # Resumed from step 10 and saving step 15: step 20 belongs to the abandoned run, and goes.
    checkpoint.save(root, 15, _state(3), _info())
    assert [s for s, _ in checkpoint.complete(root)] == [10, 15]


def test_a_failed_write_leaves_no_temporary_folder(tmp_path, monkeypatch):
    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.os, "fsync", full_disk)
    with pytest.raises(checkpoint.SimparError, match="cannot write checkpoint .*No space left"):
        checkpoint.save(str(tmp_path), 5, _state(1), _info())
    assert os.listdir(tmp_path) == []


def test_sampler_resumes_mid_epoch_and_across_epochs():
    full = list(global_batches(100, 30, 7, 10))  # 3 steps per epoch
    for start in (1, 3, 5):
        rest = list(global_batches(100, 30, 7, 10, start))
        assert len(rest) == 10 - start
        for (e1, r1), (e2, r2) in zip(rest, full[start:]):
            assert e1 == e2
            np.testing.assert_array_equal(r1, r2)
