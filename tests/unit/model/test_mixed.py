"""Mixed precision in-process: half kernels, the scaled loss, the loss scaler and its skipped steps.

The tests that launch real MPI jobs: tests/mpi/model/test_mixed.py.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import kernels
from simpar.model import precision as mp
from simpar.model.mlp import softmax_cross_entropy
from simpar.model.optim import SGD, Adam

BF16 = np.dtype(ml_dtypes.bfloat16)


# -- the pieces ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16])
def test_half_kernels_round_the_float32_result(dtype):
    rng = np.random.default_rng(0)
    x, W, b = (rng.standard_normal(s).astype(dtype) for s in ((5, 7), (7, 3), (3,)))
    k = mp.HalfKernels(kernels.load("numpy"), dtype)
    z, y = k.linear_act_forward(x, W, b, "relu")
    want = x.astype(np.float32) @ W.astype(np.float32) + b.astype(np.float32)
    assert z.dtype == dtype and y.dtype == dtype
    np.testing.assert_array_equal(z, want.astype(dtype))  # computed in float32, rounded once
    np.testing.assert_array_equal(y, np.maximum(want, 0).astype(dtype))
    z, y = k.linear_act_forward(x, W, b, "none")
    assert y is z  # the logits layer: Context counts z once
    dx, dW, db = k.linear_act_backward(y, x, W, z, y, "none", True)
    assert dx.dtype == dW.dtype == db.dtype == dtype and dW.shape == W.shape


def test_scaled_loss_gradient_is_the_float32_one_times_the_scale():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((8, 10)).astype(np.float16)
    labels = rng.integers(0, 10, 8)
    loss, d = mp.scaled_loss_grad(logits, labels, 1024, 2.0**10)
    ref_loss, ref = softmax_cross_entropy(logits.astype(np.float32), labels, 1024)
    assert loss == ref_loss and d.dtype == np.float16
    np.testing.assert_array_equal(d, (ref * 2.0**10).astype(np.float16))


@pytest.mark.parametrize(
    "inner,bpp", [(lambda: Adam(0.01), 12), (lambda: SGD(0.1, 0.9), 8), (lambda: SGD(0.1, 0.0), 4)]
)
def test_optimizer_state_is_the_zero_papers_k(inner, bpp):
    """K bytes per parameter (ZeRO paper sec. 3.1): Adam 12 (master, momentum, variance), SGD with
    momentum 8, plain SGD 4 (just the float32 master)."""
    opt = mp.MixedPrecisionOptimizer(inner(), "mixed-fp16")
    w = np.ones(100, np.float16)
    opt.step([w], [np.full(100, 2.0**16 * 0.5, np.float16)])
    assert opt.state_nbytes() == bpp * 100
    assert w.dtype == np.float16 and np.all(w < 1)  # updated, rounded back into the half weights


def test_overflow_skips_the_step_and_halves_the_scale(monkeypatch):
    opt = mp.MixedPrecisionOptimizer(SGD(0.1, 0.0), "mixed-fp16")
    w = np.ones(4, np.float16)
    opt.step([w], [np.array([1, np.inf, 1, 1], np.float16)])
    assert np.all(w == 1) and opt.scale == 2.0**15 and opt.summary()["skipped_at"] == [1]
    monkeypatch.setattr(mp, "GROWTH_INTERVAL", 2)
    for _ in range(2):
        opt.step([w], [np.ones(4, np.float16)])
    assert opt.scale == 2.0**16 and opt.summary()["skipped_steps"] == 1
    # The update used the UNSCALED gradient: 2 steps of lr * g / scale, g = 1.
    np.testing.assert_allclose(w, np.float16(1 - 0.1 / 2**15 - 0.1 / 2**15), rtol=1e-3)


def test_bfloat16_travels_as_its_bits():
    x = np.arange(6, dtype=np.float32).astype(BF16)
    wire = mp.as_wire(x)
    assert wire.dtype == np.uint16 and wire.nbytes == x.nbytes and np.shares_memory(wire, x)
    h = np.ones(3, np.float16)
    assert mp.as_wire(h) is h
