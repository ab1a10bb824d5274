"""The Numba and CUDA kernels against the NumPy reference (kernels.NumpyKernels).

Tolerances follow the standard error bound of a dot product: |computed - exact| <= K * eps * sum_k
|a_k b_k|, so each element is compared relative to |A| @ |B| (plus |b|), not to its own value --
an output that cancels to nearly zero may legitimately differ from NumPy's in its leading digit.
The CUDA kernels run under the simulator in a subprocess: NUMBA_ENABLE_CUDASIM must be set before
numba is imported, and this process has imported it already.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kernels
from kernels import cpu

ACTS = ["none", "relu", "tanh", "gelu"]
TOL = {np.float64: 1e-12, np.float32: 1e-5}


def close(got, ref, scale, dtype):
    """|got - ref| <= tol * scale elementwise (scale: the error bound's sum of magnitudes)."""
    assert got.dtype == dtype, (got.dtype, dtype)
    assert got.shape == ref.shape, (got.shape, ref.shape)
    tiny = np.finfo(dtype).tiny
    err = np.abs(got.astype(np.float64) - ref.astype(np.float64))
    bound = TOL[dtype] * (np.abs(scale.astype(np.float64)) + np.abs(ref.astype(np.float64))) + tiny
    assert np.all(err <= bound), f"max error/bound {np.max(err / bound):.3g}"


def messy(a, how):
    """The same values in a layout the kernels must cope with (views, Fortran order)."""
    if how == 1:
        return np.asfortranarray(a)
    if how == 2:
        wide = np.zeros((a.shape[0], 2 * a.shape[1]), a.dtype)
        wide[:, ::2] = a
        return wide[:, ::2]  # a non-contiguous view
    return a


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_backward_into_writes_the_same_bits_as_backward(backend):
    """linear_act_backward_into (used after a lazy zero_grad) writes dW, db into views of a flat
    buffer: the same operations as linear_act_backward, so the same bits, on the small one-call
    path and the BLAS path alike; nothing outside the views is touched."""
    k = kernels.NumpyKernels if backend == "numpy" else cpu.NumbaKernels
    rng = np.random.default_rng(7)
    for dtype in (np.float32, np.float64):
        for m, kk, n in ((3, 5, 4), (64, 96, 80)):  # 60 and 491,520 multiply-adds
            for act, need_dx in (("relu", True), ("gelu", False), ("none", True)):
                x, W = rng.standard_normal((m, kk)).astype(dtype), rng.standard_normal((kk, n)).astype(dtype)
                z, y = k.linear_act_forward(x, W, np.zeros(n, dtype), act)
                dy = rng.standard_normal((m, n)).astype(dtype)
                dx0, dW0, db0 = k.linear_act_backward(dy, x, W, z, y, act, need_dx)
                flat = np.full(kk * n + n + 1, 7, dtype)  # one guard element after the views
                dW, db = flat[: kk * n].reshape(kk, n), flat[kk * n : kk * n + n]
                dx = k.linear_act_backward_into(dy, x, W, z, y, act, need_dx, dW, db)
                np.testing.assert_array_equal(dW, dW0)
                np.testing.assert_array_equal(db, db0)
                assert flat[-1] == 7
                if need_dx:
                    np.testing.assert_array_equal(dx, dx0)
                else:
                    assert dx is None


def check_layer(m, k, n, dtype, act, bias, need_dx, layout, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(dtype)
    W = rng.standard_normal((k, n)).astype(dtype)
    b = rng.standard_normal(n).astype(dtype) if bias else None
    z, y = cpu.NumbaKernels.linear_act_forward(messy(x, layout), messy(W, layout), b, act)
    z0, y0 = kernels.NumpyKernels.linear_act_forward(x, W, b, act)
    scale = np.abs(x) @ np.abs(W) + (0 if b is None else np.abs(b))
    close(z, z0, scale, dtype)
    close(y, y0, 1.2 * scale, dtype)  # every activation has slope <= 1.13
    dy = rng.standard_normal((m, n)).astype(dtype)
    dx, dW, db = cpu.NumbaKernels.linear_act_backward(
        messy(dy, layout), messy(x, layout), messy(W, layout), z0, y0, act, need_dx
    )
    dx0, dW0, db0 = kernels.NumpyKernels.linear_act_backward(dy, x, W, z0, y0, act, need_dx)
    # dz = act'(z) * dy may cancel (gelu' crosses zero near z = -0.75): bound it by the size of
    # its terms, which is at most 2 |dy| for every activation here.
    adz = 2 * np.abs(dy)
    close(dW, dW0, np.abs(x).T @ adz, dtype)
    close(db, db0, adz.sum(axis=0), dtype)
    if need_dx:
        close(dx, dx0, adz @ np.abs(W).T, dtype)
    else:
        assert dx is None


dims = st.integers(1, 70)


@settings(max_examples=60, deadline=None)
@given(
    m=dims,
    k=dims,
    n=dims,
    dtype=st.sampled_from([np.float32, np.float64]),
    act=st.sampled_from(ACTS),
    bias=st.booleans(),
    need_dx=st.booleans(),
    layout=st.integers(0, 2),
    seed=st.integers(0, 2**32 - 1),
)
def test_linear_layer_matches_numpy(m, k, n, dtype, act, bias, need_dx, layout, seed):
    check_layer(m, k, n, dtype, act, bias, need_dx, layout, seed)


@settings(max_examples=40, deadline=None)
@given(
    m=dims,
    k=dims,
    n=dims,
    dtype=st.sampled_from([np.float32, np.float64]),
    ta=st.booleans(),
    tb=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_matmul_matches_numpy(m, k, n, dtype, ta, tb, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(dtype)
    A, B = (a.T if ta else a), (b.T if tb else b)
    close(cpu.matmul(a, b, trans_a=ta, trans_b=tb), A @ B, np.abs(A) @ np.abs(B), dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_block_edges_at_257(dtype):
    """257 = one past every block size: leftover rows, an odd k, a 1-wide column block."""
    rng = np.random.default_rng(257)
    a = rng.standard_normal((257, 257)).astype(dtype)
    b = rng.standard_normal((257, 257)).astype(dtype)
    scale = np.abs(a) @ np.abs(b)
    close(cpu.matmul(a, b), a @ b, scale, dtype)
    close(cpu.matmul(a, b, trans_b=True), a @ b.T, np.abs(a) @ np.abs(b).T, dtype)
    close(cpu.matmul(a, b, trans_a=True), a.T @ b, np.abs(a).T @ np.abs(b), dtype)
    check_layer(257, 257, 257, dtype, "gelu", True, True, 0, 1)
    check_layer(1, 257, 10, dtype, "relu", True, True, 0, 2)


def test_dtype_is_kept_and_mixing_is_refused():
    x = np.ones((3, 4), np.float32)
    z, y = cpu.NumbaKernels.linear_act_forward(x, np.ones((4, 2), np.float32), None, "none")
    assert z.dtype == np.float32 and y is z
    with pytest.raises(TypeError):
        cpu.NumbaKernels.linear_act_forward(x, np.ones((4, 2)), None, "relu")


@settings(max_examples=30, deadline=None)
@given(n=st.integers(0, 300), dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 2**32 - 1))
def test_reduce_add(n, dtype, seed):
    rng = np.random.default_rng(seed)
    dst, src = rng.standard_normal(n).astype(dtype), rng.standard_normal(n).astype(dtype)
    expected = dst + src
    cpu.reduce_add(dst, src)
    np.testing.assert_array_equal(dst, expected)  # one addition per element: exact
    buf = rng.standard_normal(2 * n + 2).astype(dtype)
    view, expected = buf[::2], buf[::2] + buf[1::2]  # strided chunks fall back to NumPy
    cpu.reduce_add(view, buf[1::2].copy())
    np.testing.assert_array_equal(buf[::2], expected)


@settings(max_examples=25, deadline=None)
@given(
    shape=st.sampled_from([(0,), (7,), (33, 5), (300,)]),
    dtype=st.sampled_from([np.float32, np.float64]),
    momentum=st.sampled_from([0.0, 0.9]),
    step=st.integers(1, 50),
    seed=st.integers(0, 2**32 - 1),
)
def test_fused_optimizer_updates_are_the_references_bit_for_bit(shape, dtype, momentum, step, seed):
    """The Numba optimizer sweeps do NumPy's operations in NumPy's order and type: identical bits, not
    just close ones (a float64 constant sneaking into a float32 update would break this)."""
    rng = np.random.default_rng(seed)
    w, g, v = (rng.standard_normal(shape).astype(dtype) for _ in range(3))
    v2 = np.abs(v)  # Adam's second moment is never negative
    ref, fused = [w.copy(), v.copy()], [w.copy(), v.copy()]
    kernels.NumpyKernels.sgd_update(ref[0], g, ref[1] if momentum else None, 0.05, momentum)
    cpu.NumbaKernels.sgd_update(fused[0], g, fused[1] if momentum else None, 0.05, momentum)
    for a, b in zip(ref, fused):
        assert a.dtype == dtype and b.dtype == dtype
        np.testing.assert_array_equal(a, b)
    scales = (1 / (1 - 0.9**step), 1 / (1 - 0.999**step))
    ref, fused = [w.copy(), v.copy(), v2.copy()], [w.copy(), v.copy(), v2.copy()]
    kernels.NumpyKernels.adam_update(ref[0], g, ref[1], ref[2], 1e-3, 0.9, 0.999, 1e-8, *scales)
    cpu.NumbaKernels.adam_update(fused[0], g, fused[1], fused[2], 1e-3, 0.9, 0.999, 1e-8, *scales)
    for a, b in zip(ref, fused):
        assert b.dtype == dtype
        np.testing.assert_array_equal(a, b)
    strided = w.reshape(-1)[::2].copy(), g.reshape(-1)[::2]  # a non-contiguous g falls back to NumPy
    expect = strided[0] - dtype(0.05) * strided[1]
    cpu.NumbaKernels.sgd_update(strided[0], strided[1], None, 0.05, 0.0)
    np.testing.assert_array_equal(strided[0], expect)


def test_load_numba_through_the_package():
    backend = kernels.load("numba")
    assert backend is cpu.NumbaKernels and backend.name == "numba"
    for name in ("linear_act_forward", "linear_act_backward", "reduce_add"):
        assert callable(getattr(backend, name))


def test_bench_matmul_breakdown_prints_each_part(capsys):
    """`bench matmul --breakdown` replays the GEMM's packing and micro-kernel calls alone (no timed
    assertion: what it measures is printed, not judged)."""
    from simpar.cli.bench import matmul_main

    assert matmul_main(["--sizes", "40", "--repeat", "1", "--breakdown"]) == 0
    out = capsys.readouterr().out
    assert "where the Numba GEMM's time goes" in out and "pack A" in out
    row = out.strip().splitlines()[-2].split()
    assert row[0] == "40" and len(row) == 9 and all(float(x) >= 0 for x in row[1:])
