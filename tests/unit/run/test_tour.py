"""The tour offers every layout `train` runs with the chosen --arch/--precision, and nothing else.

The tests that launch real MPI jobs: tests/mpi/run/test_tour.py.
"""

from __future__ import annotations

import pytest

from simpar.config import RunConfig, SimparError, validate
from simpar.run.tour import layouts_for

DEFAULT_TOUR = [
    "serial",
    "dp4",
    "dp4-zero1",
    "dp4-zero2",
    "dp4-zero3",
    "tp4",
    "pp4-gpipe",
    "pp4-1f1b",
    "dp2xtp2",
    "dp2xpp2",
    "tp2xpp2",
]
# resmlp: each tensor-parallel layout again with its rows split (--sp), right after it
RESMLP_TOUR = [
    *DEFAULT_TOUR[:6],
    "tp4-sp",
    *DEFAULT_TOUR[6:9],
    "dp2xtp2-sp",
    *DEFAULT_TOUR[9:],
    "tp2xpp2-sp",
]


def names(world: int, **options) -> list[str]:
    return [name for name, _ in layouts_for(world, RunConfig(**options))]


def test_layouts_follow_what_train_accepts():
    assert names(4) == DEFAULT_TOUR  # CI's tour: unchanged
    assert names(4, dtype="float32", precision="mixed-bf16") == DEFAULT_TOUR  # tp too, now
    assert names(4, dtype="float32", precision="mixed-fp16") == DEFAULT_TOUR
    assert names(4, arch="resmlp") == RESMLP_TOUR
    two = ["serial", "dp2", "dp2-zero1", "dp2-zero2", "dp2-zero3", "tp2", "tp2-sp", "pp2-gpipe", "pp2-1f1b"]
    assert names(2, arch="resmlp") == two
    assert names(1) == ["serial"]
    # 36 rows: --sp splits them over tp alone (tp4-sp, dp2xtp2-sp), but under --pp each of the 4
    # micro-batches' 9 rows cannot split over tp 2, so train refuses tp2xpp2-sp and the tour leaves it out
    assert names(4, arch="resmlp", batch=36) == RESMLP_TOUR[:-1]
    with pytest.raises(SimparError, match=r"multiple of dp\*grad-accum\*microbatches\*tp = 8"):
        validate(RunConfig(arch="resmlp", batch=36, dp=1, tp=2, pp=2, sp=True), 4)
    # hidden width 6 splits over tp 2 but not 4; 2 layers leave no room for 4 stages
    no_tp4_pp4 = [n for n in DEFAULT_TOUR if not n.startswith(("tp4", "pp4"))]
    assert names(4, layers=[64, 6, 10]) == no_tp4_pp4
