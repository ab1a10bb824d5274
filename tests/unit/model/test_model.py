"""Gradients of every layer type against finite differences (float64), and the optimizers' updates."""

import numpy as np
import pytest

import kernels
from simpar.model import mlp as model
from simpar.model import optim
from simpar.runtime.context import Runtime
from tests.conftest import numeric_grad


@pytest.mark.parametrize("act", ["relu", "tanh", "gelu", "none"])
def test_activation_backward_matches_finite_differences(act):
    rng = np.random.default_rng(0)
    z = rng.standard_normal((4, 5))
    z[np.abs(z) < 1e-3] = 0.1  # keep away from ReLU's kink
    fwd, bwd = model.ACTIVATIONS[act]
    dy = rng.standard_normal(z.shape)
    analytic = bwd(dy, z, fwd(z))
    numeric = numeric_grad(lambda: float((fwd(z) * dy).sum()), z)
    np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-8)


def test_softmax_cross_entropy_gradient_and_value():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((6, 4))
    labels = np.array([0, 3, 1, 1, 2, 0])
    loss, d = model.softmax_cross_entropy(logits, labels, global_batch=6)
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    assert loss == pytest.approx(-np.log(p[np.arange(6), labels]).mean(), rel=1e-12)
    numeric = numeric_grad(lambda: model.softmax_cross_entropy(logits, labels, 6)[0], logits)
    np.testing.assert_allclose(d, numeric, rtol=1e-6, atol=1e-9)


def test_loss_shares_of_shards_add_up_to_the_mean():
    rng = np.random.default_rng(2)
    logits, labels = rng.standard_normal((10, 3)), rng.integers(0, 3, 10)
    whole, dwhole = model.softmax_cross_entropy(logits, labels, 10)
    parts = [model.softmax_cross_entropy(logits[s], labels[s], 10) for s in (slice(0, 3), slice(3, 10))]
    assert sum(p[0] for p in parts) == pytest.approx(whole, rel=1e-14)
    np.testing.assert_allclose(np.concatenate([p[1] for p in parts]), dwhole, rtol=1e-14)


@pytest.mark.parametrize("act", ["relu", "tanh", "gelu"])
def test_whole_mlp_gradient_matches_finite_differences(act):
    store = model.serial_store([5, 7, 6, 3], act, seed=3, dtype=np.float64)
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((8, 5)), rng.integers(0, 3, 8)

    def loss_only():
        h = x
        for layer in store.layers:
            h, _ = model.layer_forward(layer, h)
        return model.softmax_cross_entropy(h, y, 8)[0]

    store.zero_grad()
    model.forward_backward(store, x, y, 8)
    numeric = numeric_grad(loss_only, store.params)
    np.testing.assert_allclose(store.grads, numeric, rtol=1e-5, atol=1e-8)


def test_split_backward_leaves_every_layers_weight_gradient_to_the_w_pass():
    """Inside deferred_weight_grads the B pass computes dx only -- for the FIRST layer it meets too
    (the pending list starts empty) -- and the W closures, one per layer in backward order, then
    give exactly the gradients of the plain backward."""
    store = model.serial_store([5, 7, 3], "relu", seed=3, dtype=np.float64)
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((8, 5)), rng.integers(0, 3, 8)
    h1, c1 = model.layer_forward(store.layers[0], x)
    h2, c2 = model.layer_forward(store.layers[1], h1)
    _, g = model.softmax_cross_entropy(h2, y, 8)
    store.zero_grad()
    model.layer_backward(store.layers[0], c1, model.layer_backward(store.layers[1], c2, g), need_dx=False)
    plain = store.grads.copy()
    store.zero_grad()
    with model.deferred_weight_grads() as w_passes:
        dx = model.layer_backward(store.layers[1], c2, g)
        model.layer_backward(store.layers[0], c1, dx, need_dx=False)
    assert len(w_passes) == 2 and not store.grads.any()  # B alone: no weight gradient yet
    for w_pass in w_passes:
        w_pass()
    np.testing.assert_allclose(store.grads, plain, rtol=1e-12)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_lazy_zero_grad_writes_then_adds_and_settles_what_backward_missed(backend):
    """zero_grad(lazy=True) leaves the buffer alone: the first backward of each layer WRITES its
    gradients (whatever stale numbers were there, NaN included), later micro-steps add, and settle()
    zeroes a layer backward never reached. Bit for bit what the eager fill(0) + += gives."""
    if backend not in kernels.available():
        pytest.skip(f"{backend} kernels not installed")
    rt = Runtime(kernels=kernels.load(backend))  # the layers' kernels: the store hands them down
    rng = np.random.default_rng(5)
    batches = [(rng.standard_normal((8, 20)), rng.integers(0, 4, 8)) for _ in range(2)]

    def grads(lazy: bool, micro_steps: int):
        # 20 -> 64 -> 48 -> 4: layer 1 (8 x 64 x 48 > SMALL_MACS) takes the BLAS path, the others one call
        store = model.serial_store([20, 64, 48, 4], "gelu", seed=2, dtype=np.float64, rt=rt)
        store.grads.fill(np.nan)  # stale numbers: lazy must overwrite every one of them
        store.zero_grad(lazy=lazy)
        for x, y in batches[:micro_steps]:
            model.forward_backward(store, x, y, 16)
        store.settle()
        return store.grads.copy()

    for steps in (1, 2):
        eager, lazy = grads(False, steps), grads(True, steps)
        assert np.isfinite(lazy).all()
        np.testing.assert_array_equal(lazy, eager)
    store = model.serial_store([20, 48, 4], "relu", seed=2, dtype=np.float64, rt=rt)
    store.grads.fill(np.nan)
    store.zero_grad(lazy=True)
    store.settle()  # no backward ran: every gradient is zero
    assert not store.grads.any() and not any(layer.grads_stale for layer in store.layers)


def test_init_is_a_function_of_seed_and_layer_only():
    W1, b1 = model.init_layer(5, 2, 8, 6, np.float64)
    W2, b2 = model.init_layer(5, 2, 8, 6, np.float64)
    W3, _ = model.init_layer(5, 3, 8, 6, np.float64)
    assert np.array_equal(W1, W2) and np.array_equal(b1, b2) and not np.array_equal(W1, W3)
    W32, _ = model.init_layer(5, 2, 8, 6, np.float32)
    assert W32.dtype == np.float32 and np.allclose(W32, W1, rtol=1e-6)


def test_parameter_count():
    assert (
        model.parameter_count([64, 128, 128, 128, 10])
        == 64 * 128 + 128 + 2 * (128 * 128 + 128) + 128 * 10 + 10
    )


def test_sgd_momentum_matches_hand_computation():
    w, g = np.array([1.0, 2.0]), np.array([0.5, -1.0])
    opt = optim.SGD(lr=0.1, momentum=0.9)
    opt.step([w], [g])
    np.testing.assert_allclose(w, [0.95, 2.1])
    opt.step([w], [g])  # v = 0.9*g + g = 1.9 g
    np.testing.assert_allclose(w, [0.95 - 0.095, 2.1 + 0.19])
    assert opt.state_nbytes() == 16


def reference_adam(w, grads, lr, beta1=0.9, beta2=0.999, eps=1e-8):
    """Kingma & Ba 2015, Algorithm 1, in float64: the weights after each of the given gradients."""
    w, m, v, out = np.array(w, dtype=np.float64), 0.0, 0.0, []
    for t, g in enumerate(grads, start=1):
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)
        w = w - lr * m_hat / (np.sqrt(v_hat) + eps)
        out.append(w)
    return out


def test_adam_first_step_is_lr_times_sign_and_keeps_dtype():
    w = np.array([1.0, -1.0], dtype=np.float32)
    g = np.array([0.2, -0.4], dtype=np.float32)
    opt = optim.Adam(lr=0.01)
    opt.step([w], [g])
    # first step: m_hat = g, v_hat = g^2 -> update = lr * sign(g) (up to eps), whatever the betas
    np.testing.assert_allclose(w, [0.99, -0.99], rtol=1e-6)
    assert w.dtype == np.float32 and opt.m[0].dtype == np.float32
    assert opt.state_nbytes() == 2 * 2 * 4


@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-12), (np.float32, 2e-6)])
def test_adam_several_steps_match_reference(dtype, rtol):
    """Six steps with gradients of changing size and sign: from step 2 on the update depends on
    beta1, beta2, eps and the bias corrections, which step 1 (lr * sign(g)) does not show."""
    rng = np.random.default_rng(7)
    w0 = rng.standard_normal(6)
    grads = [rng.standard_normal(6) * scale for scale in (1.0, 0.1, 3.0, 0.01, 1.0, 0.5)]
    want = reference_adam(w0, grads, lr=0.1)
    # The check can tell Adam's defaults apart: another beta2 or beta1 lands far outside rtol.
    for other in (dict(beta2=0.99), dict(beta1=0.8)):
        wrong = reference_adam(w0, grads, lr=0.1, **other)[-1]
        assert np.abs(wrong - want[-1]).max() > 10 * rtol * np.abs(want[-1]).max()
    w = w0.astype(dtype)
    opt = optim.Adam(lr=0.1)
    for g, expect in zip(grads, want):
        opt.step([w], [g.astype(dtype)])
        assert w.dtype == dtype
        np.testing.assert_allclose(w, expect, rtol=rtol, atol=rtol * np.abs(expect).max())


def test_elementwise_optimizer_is_independent_of_grouping():
    rng = np.random.default_rng(0)
    w, g = rng.standard_normal(10), rng.standard_normal(10)
    a, b = w.copy(), w.copy()
    oa, ob = optim.Adam(0.01), optim.Adam(0.01)
    for _ in range(3):
        oa.step([a], [g])
        ob.step([b[:4], b[4:]], [g[:4], g[4:]])
    np.testing.assert_array_equal(a, b)
