"""Layout x option combinations the per-strategy matrices leave out, each against its serial run:
ZeRO fed by rank 0 (--data-source root), pipeline with tanh, the 4-rank hybrids in float32, and
a tree all-reduce under tensor x data parallelism with gradient accumulation."""

import numpy as np
import pytest

from tests.conftest import assert_same_model, train_json

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
def test_layout_equals_serial(tmp_path, serial, name, n, common, layout, rtol):
    args = ["--steps", "5", *common]
    ref = serial(args)
    run = train_json(n, args + layout, tmp_path)
    assert_same_model(run, ref, rtol)
    assert len(run["weights"]) == 4
    assert run["weights"][0][0].dtype == np.dtype(common[common.index("--dtype") + 1])
    assert run["prediction_mismatches"] == []  # and the cost model still predicts every byte
