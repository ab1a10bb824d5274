"""A run on the Numba kernels is predicted exactly as it is simulated (memory passes per backend).

The in-process tests (no MPI job): tests/unit/costmodel/test_passes.py.
"""

from __future__ import annotations

import dataclasses

import pytest

from simpar import costmodel as cm
from simpar.config import RunConfig
from simpar.costmodel import hardware
from simpar.run.launch import launch


def test_a_numba_run_is_predicted_as_simulated():
    """Tensor parallelism (column and row layers: the row shard's bias and activation are NumPy's
    after g) with Adam, on the Numba kernels and the simulated clock: predict == simulate exactly,
    bytes and memory exact, and the prediction is the Numba kernels' (not the reference's)."""
    args = dict(tp=2, layers="64,128,128,10", batch=32, steps=2, optimizer="adam", lr=0.001)
    m = launch(2, kernels="numba", clock="sim", hardware="dgx-h100", **args)
    assert m["kernels"] == "numba"
    assert m["prediction_mismatches"] == []
    assert m["time"]["sim"]["step_s"] == pytest.approx(m["predicted"]["time"]["step_s"], rel=1e-9)
    hw = hardware.load("dgx-h100")
    cfg = RunConfig(**{k: v for k, v in args.items() if k != "layers"}, layers=[64, 128, 128, 10])
    step = {
        k: cm.predict_from_config(dataclasses.replace(cfg, kernels=k), 2, steps=2, hw=hw)
        for k in ("numpy", "numba")
    }
    assert m["predicted"]["time"]["step_s"] == step["numba"]["time"]["step_s"]
    assert step["numba"]["time"]["step_s"] < step["numpy"]["time"]["step_s"]  # Adam: 7 passes, not 32
