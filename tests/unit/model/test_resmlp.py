"""--arch resmlp in-process: LayerNorm's and the residual block's backward against finite differences.

The tests that launch real MPI jobs: tests/mpi/model/test_resmlp.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from simpar import costmodel as cm
from simpar.config import RunConfig
from simpar.model.resmlp import BlockUnit, build_units, layernorm_backward, layernorm_forward
from tests.conftest import numeric_grad

LAYERS = [64, 96, 96, 96, 10]


def test_layernorm_backward_matches_finite_differences():
    rng = np.random.default_rng(0)
    x, gamma, beta = rng.standard_normal((4, 6)), rng.standard_normal(6), rng.standard_normal(6)
    w = rng.standard_normal((4, 6))  # loss = sum(w * LN(x)): dL/dy = w
    loss = lambda: float((w * layernorm_forward(x, gamma, beta)[0]).sum())
    _, cache = layernorm_forward(x, gamma, beta)
    dx, dgamma, dbeta = layernorm_backward(w, cache, gamma)
    for got, wrt in ((dx, x), (dgamma, gamma), (dbeta, beta)):
        np.testing.assert_allclose(got, numeric_grad(loss, wrt), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("act", ["relu", "tanh", "gelu"])
def test_block_backward_matches_finite_differences(act):
    rng = np.random.default_rng(1)
    unit = BlockUnit(1, 5, act)
    flat = unit.init(3, np.float64) + 0.1 * rng.standard_normal(unit.size)  # gamma, beta off 1, 0
    x = rng.standard_normal((3, 5))
    w = rng.standard_normal((3, 5))
    loss = lambda: float((w * unit.forward(flat, x)[0]).sum())
    _, ctx = unit.forward(flat, x)
    grads = np.zeros(unit.size)
    dx = unit.backward(flat, grads, ctx, w, need_dx=True)
    np.testing.assert_allclose(dx, numeric_grad(loss, x), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grads, numeric_grad(loss, flat), rtol=1e-5, atol=1e-7)


def test_units_and_the_cost_models_sizes_agree():
    cfg = RunConfig(layers=LAYERS, arch="resmlp")
    units = build_units(cfg)
    assert [type(u).__name__ for u in units] == ["LinearUnit", "BlockUnit", "BlockUnit", "LinearUnit"]
    sizes = cm.stages.unit_sizes(cm.Spec(widths=LAYERS, batch=64, arch="resmlp"))
    assert [u.size for u in units] == sizes == [64 * 96 + 96, 2 * 96 * 96 + 4 * 96, 2 * 96 * 96 + 4 * 96, 970]
