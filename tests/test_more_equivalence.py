"""Layout x option combinations the per-strategy matrices leave out, each against its serial run:
ZeRO fed by rank 0 (--data-source root), pipeline with tanh, the 4-rank hybrids in float32, and
a tree all-reduce under tensor x data parallelism with gradient accumulation."""

import numpy as np
import pytest

from tests.mpiutil import train_json

_serial = {}


def serial(tmp_path_factory, args):
    key = tuple(args)
    if key not in _serial:
        _serial[key] = train_json(1, list(args), tmp_path_factory.mktemp("serial"))
    return _serial[key]


CASES = [
    (
        "zero2-root",
        3,
        ["--dtype", "float64", "--batch", "50"],
        ["--zero", "2", "--data-source", "root"],
        1e-12,
    ),
    (
        "zero3-root-adam",
        2,
        ["--dtype", "float64", "--optimizer", "adam", "--lr", "0.01"],
        ["--zero", "3", "--data-source", "root"],
        1e-12,
    ),
    (
        "pp2-tanh",
        2,
        ["--dtype", "float64", "--activation", "tanh"],
        ["--pp", "2", "--schedule", "gpipe"],
        1e-12,
    ),
    ("dp2xtp2-f32", 4, ["--dtype", "float32"], ["--dp", "2", "--tp", "2"], 1e-5),
    (
        "tp2xpp2-f32-root",
        4,
        ["--dtype", "float32"],
        ["--tp", "2", "--pp", "2", "--data-source", "root"],
        1e-5,
    ),
    (
        "dp2xtp2-tree-accum",
        4,
        ["--dtype", "float64", "--batch", "60"],
        ["--dp", "2", "--tp", "2", "--collectives", "tree", "--grad-accum", "3"],
        1e-12,
    ),
]


@pytest.mark.parametrize("name,n,common,layout,rtol", CASES, ids=[c[0] for c in CASES])
def test_layout_equals_serial(tmp_path, tmp_path_factory, name, n, common, layout, rtol):
    args = ["--steps", "5", *common]
    ref = serial(tmp_path_factory, args)
    run = train_json(n, args + layout, tmp_path)
    np.testing.assert_allclose(run["losses"], ref["losses"], rtol=rtol)
    assert len(run["weights"]) == len(ref["weights"]) == 4
    for (W, b), (W0, b0) in zip(run["weights"], ref["weights"]):
        assert W.dtype == W0.dtype == np.dtype(common[common.index("--dtype") + 1])
        np.testing.assert_allclose(W, W0, rtol=rtol, atol=rtol * np.abs(W0).max())
        np.testing.assert_allclose(b, b0, rtol=rtol, atol=rtol * np.abs(b0).max())
    assert run["prediction_mismatches"] == []  # and the cost model still predicts every byte
