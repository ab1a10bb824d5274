"""The Numba backend's optimizer updates: one fused sweep per step instead of NumPy's several.

NumPy's `w -= lr * g` writes lr*g to a temporary and reads it back; Adam's line makes five temporaries.
On a model of a few million parameters those sweeps are memory-bound milliseconds per step. These
loops read each of w, g and the state once and write w and the state once (PyTorch's "fused" and
apex's FusedAdam do the same on GPUs). The arithmetic is NumPy's, operation for operation in the same
order and type (the constants arrive as numbers of w's dtype; no fastmath, so no fused multiply-add),
so the results are bit for bit the reference's: tests/unit/kernels/test_kernels.py checks it.
(benchmarks/hot_path.py measures what the fused SGD sweep saves per step.)
"""

from __future__ import annotations

import numpy as np
from numba import njit

from . import reference


@njit(cache=True)
def _sgd(w, g, lr):
    for i in range(w.shape[0]):
        w[i] = w[i] - lr * g[i]


@njit(cache=True)
def _sgd_momentum(w, g, v, lr, mu):
    for i in range(w.shape[0]):
        vi = v[i] * mu + g[i]
        v[i] = vi
        w[i] = w[i] - lr * vi


# error_model="numpy": a division by zero gives inf or nan, as in NumPy, instead of Numba's default
# check-and-raise per element -- a branch that kept LLVM from vectorising the square root and the
# division (5.5 -> 1.6 ms at 1.86M float32 parameters). Vector sqrt and divide round exactly like the
# scalar ones (IEEE), so the bits stay NumPy's; no fast-math is involved.
@njit(cache=True, error_model="numpy")
def _adam(w, g, m, v, lr, b1, c1, b2, c2, eps, ms, vs):
    for i in range(w.shape[0]):
        gi = g[i]
        mi = m[i] * b1 + c1 * gi
        vi = v[i] * b2 + c2 * (gi * gi)
        m[i] = mi
        v[i] = vi
        w[i] = w[i] - (lr * (mi * ms)) / (np.sqrt(vi * vs) + eps)


def _flat(*arrays):
    """1-D views of same-shape contiguous float32/float64 arrays, or None (then NumPy does it)."""
    a0 = arrays[0]
    if a0.dtype not in (np.float32, np.float64):
        return None
    for a in arrays:
        if a.dtype != a0.dtype or a.shape != a0.shape or not a.flags.c_contiguous:
            return None
    return [a.reshape(-1) for a in arrays]


def sgd_update(w, g, v, lr, momentum):
    flat = _flat(w, g) if v is None else _flat(w, g, v)
    if flat is None:
        return reference.sgd_update(w, g, v, lr, momentum)
    t = w.dtype.type
    if v is None:
        _sgd(flat[0], flat[1], t(lr))
    else:
        _sgd_momentum(flat[0], flat[1], flat[2], t(lr), t(momentum))


def adam_update(w, g, m, v, lr, beta1, beta2, eps, m_scale, v_scale):
    flat = _flat(w, g, m, v)
    if flat is None:
        return reference.adam_update(w, g, m, v, lr, beta1, beta2, eps, m_scale, v_scale)
    t = w.dtype.type
    _adam(*flat, t(lr), t(beta1), t(1 - beta1), t(beta2), t(1 - beta2), t(eps), t(m_scale), t(v_scale))


def optimizer_passes(name: str, momentum: bool) -> int:
    """Elements read or written per parameter (the simulated clock charges them, kernels/__init__.py):
    _sgd reads w, g, writes w (3); _sgd_momentum also reads and writes v (5); _adam reads w, g, m, v
    and writes m, v, w (7)."""
    return {"sgd": 5 if momentum else 3, "adam": 7}[name]
