"""--arch resmlp: LayerNorm's and the residual block's backward against finite differences, the
parameter count against the cost model, and data parallelism and ZeRO 1/2/3 against the serial run
(float64, 1e-12: the same arithmetic up to summation order, as for the MLP)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import train_json
from tests.mpiutil import run_mpi

BASE = [
    "--steps",
    "4",
    "--batch",
    "64",
    "--arch",
    "resmlp",
    "--dtype",
    "float64",
    "--layers",
    "64,96,96,96,10",
]


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    return train_json(1, [*BASE, "--optimizer", "adam", "--lr", "0.005"], tmp_path_factory.mktemp("res"))


@pytest.mark.parametrize("n,zero,extra", [(3, 0, []), (4, 1, []), (3, 2, ["--grad-accum", "2"]), (4, 3, [])])
def test_data_parallel_and_zero_match_serial(tmp_path, serial, n, zero, extra):
    m = train_json(n, [*BASE, "--optimizer", "adam", "--lr", "0.005", "--zero", str(zero), *extra], tmp_path)
    np.testing.assert_allclose(m["losses"], serial["losses"], rtol=1e-12)
    for (W, b), (Wr, br) in zip(m["weights"], serial["weights"]):
        assert W.shape == Wr.shape and np.abs(W - Wr).max() <= 1e-12 * np.abs(Wr).max()
        assert b.shape == br.shape
    assert m["prediction_mismatches"] == []  # bytes and params/grads/optimizer memory per rank
    assert serial["losses"][-1] < serial["losses"][0]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--arch", "resmlp", "--layers", "64,128,96,10"], "equal hidden widths"),
    ],
)
def test_unsupported_layouts_are_one_line(args, message):
    res = run_mpi(2, ["train", "--steps", "1", *args], timeout=60)
    assert res.returncode == 2 and res.stderr.count("simpar: error:") == 1, res.stderr[-2000:]
    assert message in res.stderr and "Traceback" not in res.stderr


def test_cost_model_predicts_the_simulated_step_and_activations(tmp_path):
    """The cost model writes a block's work down again (resblocks.resmlp_unit_work): on the simulated
    clock its step time agrees with the run within 5% (as for every MLP layout), and the activations
    each rank keeps for backward are predicted exactly."""
    m = train_json(2, [*BASE, "--zero", "3", "--clock", "sim", "--hardware", "dgx-h100"], tmp_path)
    sim, pred = m["time"]["sim"]["step_s"], m["predicted"]["time"]["step_s"]
    assert abs(pred / sim - 1) <= 0.05, (sim, pred)
    got = [r["activations_peak"] for r in m["memory"]["ranks"]]
    assert got == [r["activations_peak"] for r in m["predicted"]["memory"]["ranks"]]
