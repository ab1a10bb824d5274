"""Errors in-process: one rank's error raised on every rank, a full disk leaving no temp file.

The tests that launch real MPI jobs: tests/mpi/test_errors.py.
"""

import errno
import os

import pytest


class FakeWorld:
    """Two ranks seen from rank 0: `other` is what rank 1 contributes to the exchange."""

    size, rank = 2, 0

    def __init__(self, other):
        self.other = other

    def gather_object(self, obj, root=0):
        return [obj, self.other]

    def bcast_object(self, obj, root=0):
        return obj


def test_an_error_on_one_rank_is_raised_on_every_rank_naming_it():
    from simpar.config import SimparError
    from simpar.runtime.agree import together

    with pytest.raises(SimparError, match=r"^rank 1: --data-dir /x has no train-images"):
        together(FakeWorld("--data-dir /x has no train-images"), lambda: 42)
    assert together(FakeWorld(None), lambda: 42) == 42


def test_ranks_with_different_data_fail_together():
    from simpar.config import RunConfig, SimparError
    from simpar.run.data import load_dataset
    from simpar.runtime.agree import fingerprint, same_data

    data = load_dataset(RunConfig())
    same_data(data, FakeWorld(fingerprint(data)))  # identical copies: fine
    data.y_train[0] = (data.y_train[0] + 1) % 10
    with pytest.raises(SimparError, match="ranks loaded different data: rank 1 differs from rank 0"):
        same_data(data, FakeWorld(fingerprint(load_dataset(RunConfig()))))


def test_no_space_left_in_process_leaves_no_temp_file(tmp_path):
    from simpar.config import SimparError
    from simpar.files import atomic_write

    def fill_the_disk(f):
        f.write("{" * 100)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(SimparError, match="cannot write .*m.json: No space left on device"):
        atomic_write(str(tmp_path / "m.json"), fill_the_disk)
    assert not list(tmp_path.iterdir())
