"""Megatron tensor parallelism in-process: what the options accept.

The tests that launch real MPI jobs: tests/mpi/parallel/test_tensor_parallel.py.
"""

from __future__ import annotations

import pytest

from simpar.config import RunConfig, SimparError, validate


def test_widths_not_divisible_by_tp_are_rejected():
    with pytest.raises(SimparError, match=r"hidden widths \[30\] are not divisible by --tp 4"):
        validate(RunConfig(layers=[64, 128, 30, 10], tp=4), 4)
