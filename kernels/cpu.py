"""CPU kernels in Numba: a blocked matmul, the fused linear layer, and the reduce-add.

Why a hand-written matmul at all? NumPy hands `x @ W` to OpenBLAS, whose kernels are hand-tuned
assembly. Writing one in Numba shows what those kernels do -- keep operands in cache, reuse every
loaded value many times, let the CPU's vector unit (AVX2: 4 float64 or 8 float32 lanes) do the
arithmetic -- and it lets us *fuse* the bias and the activation into the matmul (see `_gemm`).

How the matmul keeps the vector unit busy (C = A @ B, A: M x K, B: K x N):

* Packing. A block of B (KC rows x NC columns) is copied once into a small contiguous buffer `P`
  that stays in the L2 cache while every row of A streams past it. For `dY @ W.T` the packing is
  where the right operand gets transposed, so the hot loop never walks memory with a stride.
* Register blocking. The innermost loop updates MR=4 rows of C for KU=2 steps of k at once:
  the 2 values of P it loads are each used 4 times, and each element of C is loaded and stored
  once per 2 k-steps instead of every step. The 8 numbers of A it needs are loop constants, held
  in registers.
* Vectorisation. That innermost loop runs over j, the contiguous column index of C and P, with no
  dependence between iterations, so LLVM's loop vectoriser turns it into AVX2 code on its own.

Why not the textbook micro-kernel (a 4x8 tile of C in 32 scalar accumulators, k innermost)? We
tried it: with `fastmath=False` it stays scalar (about 0.15x OpenBLAS here), because turning 32
scalars into vector registers needs LLVM's SLP vectoriser, which Numba switches off by default
(it has miscompiled code), and vectorising a dot product along k needs reassociation, which
`fastmath=False` forbids. The row-strip form above needs neither. Each C[i, j] still adds its
products in plain k order, exactly like the naive triple loop; only the bias-first start of the
fused forward differs from NumPy's `(x @ W) + b`, by a rounding.

What it reaches: about 0.45-0.65x OpenBLAS, single-threaded, on the Zen 3 core it was tuned on
(`python -m simpar bench matmul` measures yours). The gap is C's memory traffic: OpenBLAS keeps
its tile of C in vector registers for the whole k loop, we load and store C every 2 k-steps,
because without SLP there is no way to tell Numba "these values form one register". Numba wins
where calls, not flops, dominate: tiny layers, and the fused forward with gelu (NumPy's gelu is
about seven passes over memory). kernels.choose_auto encodes where that is.

All kernels take and return one float dtype (float32 or float64) and never promote.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

KC = 64          # k-block: rows of B packed at a time (KC x 2 KiB = 128 KiB: stays in L2)
NC_BYTES = 2048  # column block: 256 float64 or 512 float32, so the inner loop runs 64 AVX2 steps
PAD = 16         # spare columns in the block buffers (see _gemm)
ACTS = {"none": 0, "relu": 1, "tanh": 2, "gelu": 3}
_GELU_C = math.sqrt(2.0 / math.pi)   # the same constants as simpar/model.py
_GELU_A = 0.044715


# -- the matmul ------------------------------------------------------------------------------------

@njit(cache=True, fastmath=False)
def _strip4(C, i, P, k, nc, a00, a01, a10, a11, a20, a21, a30, a31):
    """C[i:i+4, :nc] += a[4x2] @ P[k:k+2, :nc]: the vectorised inner loop (j is contiguous).

    A function of its own on purpose: its loop index starts at 0 and indexes C and P directly.
    Written inline in _gemm with a column offset (C[i, j0 + j]) LLVM left the same loop scalar.
    """
    for j in range(nc):
        b0 = P[k, j]
        b1 = P[k + 1, j]
        C[i, j] = C[i, j] + a00 * b0 + a01 * b1
        C[i + 1, j] = C[i + 1, j] + a10 * b0 + a11 * b1
        C[i + 2, j] = C[i + 2, j] + a20 * b0 + a21 * b1
        C[i + 3, j] = C[i + 3, j] + a30 * b0 + a31 * b1


@njit(cache=True, fastmath=False)
def _strip1(C, i, P, k, nc, a):
    """C[i, :nc] += a * P[k, :nc]: the leftover rows and the leftover odd k."""
    for j in range(nc):
        C[i, j] = C[i, j] + a * P[k, j]


@njit(cache=True, fastmath=False)
def _pack(P, B, tb, p0, kc, j0, nc):
    """P[:kc, :nc] = op(B)[p0:p0+kc, j0:j0+nc], reading B along its rows either way."""
    if tb:                                  # op(B) = B.T: this is where the transpose happens
        for j in range(nc):
            for k in range(kc):
                P[k, j] = B[j0 + j, p0 + k]
    else:
        for k in range(kc):
            for j in range(nc):
                P[k, j] = B[p0 + k, j0 + j]


@njit(cache=True, fastmath=False)
def _a(A, ta, i, k):
    """Element (i, k) of op(A): A, or A.T when `ta` (so x.T @ dz needs no transposed copy of x)."""
    return A[k, i] if ta else A[i, k]


@njit(cache=True, fastmath=False)
def _activate(z, act, zero, one, half, c, a):
    """act(z) for one element; the constants come in z's dtype, so float32 math stays float32."""
    if act == 1:
        return z if z > zero else zero
    if act == 2:
        return math.tanh(z)
    if act == 3:
        return half * z * (one + math.tanh(c * (z + a * (z * z * z))))
    return z


@njit(cache=True, fastmath=False)
def _gemm(Z, Y, A, ta, B, tb, bias, act):
    """Z = op(A) @ op(B) + bias and Y = act(Z), computed one NC-wide column block at a time.

    The fusion: the block of C starts out as the bias (instead of zeros, then a separate "+ b"
    pass) and the activation is applied as soon as a block is finished, while it is still in
    cache -- NumPy's `act(x @ W + b)` instead reads and writes the whole output once for the
    bias and once or more for the activation (gelu is about seven elementwise passes).
    Y may be Z itself (act "none"). `bias` of size 0 means no bias.
    """
    M = Z.shape[0]
    N = Z.shape[1]
    K = B.shape[1] if tb else B.shape[0]
    NC = NC_BYTES // Z.itemsize
    zero, one, half = Z.dtype.type(0.0), Z.dtype.type(1.0), Z.dtype.type(0.5)
    gc, ga = Z.dtype.type(_GELU_C), Z.dtype.type(_GELU_A)
    # +PAD columns: rows 4096 bytes apart would make a store to row i and the load of row i+2
    # look like the same address to the CPU's store/load check (4K aliasing) and stall.
    Cb = np.empty((M, min(NC, N) + PAD), Z.dtype)
    P = np.empty((min(KC, K), min(NC, N) + PAD), Z.dtype)
    m4 = M - M % 4
    for j0 in range(0, N, NC):
        nc = min(NC, N - j0)
        for i in range(M):
            for j in range(nc):
                Cb[i, j] = bias[j0 + j] if bias.size > 0 else zero
        for p0 in range(0, K, KC):
            kc = min(KC, K - p0)
            k2 = kc - kc % 2
            _pack(P, B, tb, p0, kc, j0, nc)
            for i in range(0, m4, 4):
                for k in range(0, k2, 2):
                    q = p0 + k
                    _strip4(Cb, i, P, k, nc,
                            _a(A, ta, i, q), _a(A, ta, i, q + 1), _a(A, ta, i + 1, q), _a(A, ta, i + 1, q + 1),
                            _a(A, ta, i + 2, q), _a(A, ta, i + 2, q + 1), _a(A, ta, i + 3, q), _a(A, ta, i + 3, q + 1))
                if k2 < kc:
                    for r in range(4):
                        _strip1(Cb, i + r, P, k2, nc, _a(A, ta, i + r, p0 + k2))
            for i in range(m4, M):
                for k in range(kc):
                    _strip1(Cb, i, P, k, nc, _a(A, ta, i, p0 + k))
        for i in range(M):                          # epilogue: store z and y = act(z) together
            for j in range(nc):
                z = Cb[i, j]
                Z[i, j0 + j] = z
                Y[i, j0 + j] = _activate(z, act, zero, one, half, gc, ga)


def _prep(*arrays):
    """C-contiguous copies where needed, all of one float dtype (we never promote)."""
    dtype = arrays[0].dtype
    if dtype not in (np.float32, np.float64):
        raise TypeError(f"numba kernels support float32 and float64, not {dtype}")
    for a in arrays[1:]:
        if a.dtype != dtype:
            raise TypeError(f"mixed dtypes {dtype} and {a.dtype}: cast the inputs to one dtype")
    return [np.ascontiguousarray(a) for a in arrays]


def matmul(a, b, trans_a=False, trans_b=False):
    """op(a) @ op(b) with the Numba kernel, where op transposes when asked.

    The three products of a linear layer: matmul(x, W), matmul(dz, W, trans_b=True) for dz @ W.T,
    and matmul(x, dz, trans_a=True) for x.T @ dz -- no transposed copy is made in Python.
    """
    a, b = _prep(a, b)
    m = a.shape[1] if trans_a else a.shape[0]
    k = a.shape[0] if trans_a else a.shape[1]
    kb, n = (b.shape[1], b.shape[0]) if trans_b else b.shape
    if k != kb:
        raise ValueError(f"matmul: inner dimensions differ ({k} vs {kb})")
    out = np.empty((m, n), a.dtype)
    _gemm(out, out, a, trans_a, b, trans_b, np.empty(0, a.dtype), 0)
    return out


# -- the fused linear layer ------------------------------------------------------------------------

@njit(cache=True, fastmath=False)
def _act_backward(dy, z, y, act, dz, db):
    """dz = act'(z) * dy (the formulas of simpar/model.py) and db = dz summed over rows, one sweep."""
    zero, one, half = dz.dtype.type(0.0), dz.dtype.type(1.0), dz.dtype.type(0.5)
    gc, ga, ga3 = dz.dtype.type(_GELU_C), dz.dtype.type(_GELU_A), dz.dtype.type(3 * _GELU_A)
    for j in range(dz.shape[1]):
        db[j] = zero
    for i in range(dz.shape[0]):
        for j in range(dz.shape[1]):
            g = dy[i, j]
            if act == 1:
                g = g if z[i, j] > zero else g * zero
            elif act == 2:
                g = g * (one - y[i, j] * y[i, j])
            elif act == 3:
                x = z[i, j]
                t = math.tanh(gc * (x + ga * (x * x * x)))
                g = g * (half * (one + t) + half * x * (one - t * t) * (gc * (one + ga3 * x * x)))
            dz[i, j] = g
            db[j] += g


@njit(cache=True, fastmath=False)
def _backward(dy, x, W, z, y, act, need_dx, dx, dW, db):
    """The whole backward in one call from Python (each call from Python costs a few microseconds)."""
    dz = np.empty_like(dy)
    _act_backward(dy, z, y, act, dz, db)
    none = np.empty(0, dy.dtype)
    # Flags as variables, not literals: Numba would compile a separate _gemm for each literal
    # combination, tripling the compile time.
    yes, no, identity = need_dx | True, need_dx & False, act * 0
    if need_dx:
        _gemm(dx, dx, dz, no, W, yes, none, identity)          # dx = dz @ W.T
    _gemm(dW, dW, x, yes, dz, no, none, identity)              # dW = x.T @ dz


def linear_act_forward(x, W, b, act):
    """(z, y) with z = x @ W + b and y = act(z) in one kernel; for act "none", y is z."""
    if b is None:
        b = np.empty(0, W.dtype)
    x, W, b = _prep(x, W, b)
    z = np.empty((x.shape[0], W.shape[1]), x.dtype)
    y = z if act == "none" else np.empty_like(z)
    _gemm(z, y, x, False, W, False, b, ACTS[act])
    return z, y


def linear_act_backward(dy, x, W, z, y, act, need_dx):
    """(dx, dW, db): dz = act'(dy, z, y), dx = dz @ W.T (None unless need_dx), dW = x.T @ dz."""
    dy, x, W, z, y = _prep(dy, x, W, z, y)
    dx = np.empty(x.shape if need_dx else (0, 0), x.dtype)
    dW = np.empty(W.shape, W.dtype)
    db = np.empty(W.shape[1], W.dtype)
    _backward(dy, x, W, z, y, ACTS[act], need_dx, dx, dW, db)
    return (dx if need_dx else None), dW, db


# -- the reduction inside collectives --------------------------------------------------------------

@njit(cache=True, fastmath=False)
def _reduce_add(dst, src):
    for i in range(dst.shape[0]):
        dst[i] += src[i]


def reduce_add(dst, src):
    """dst += src in place (1-D chunks of a ring all-reduce); other layouts fall back to NumPy."""
    if (dst.ndim == 1 and src.ndim == 1 and dst.flags.c_contiguous and src.flags.c_contiguous
            and dst.dtype == src.dtype and dst.dtype in (np.float32, np.float64) and dst.shape == src.shape):
        _reduce_add(dst, src)
    else:
        np.add(dst, src, out=dst)


def warm_up():
    """Compile (first run) or load from the cache (later runs) every kernel for both dtypes now,
    so that the first training step does not pay for it (about 8 s to compile, 0.4 s to load)."""
    for dtype in (np.float32, np.float64):
        x = np.ones((2, 2), dtype)
        z, y = linear_act_forward(x, x, x[0], "relu")
        linear_act_backward(x, x, x, z, y, "relu", True)
        reduce_add(x[0].copy(), x[0])


class NumbaKernels:
    """The Numba backend: same interface and results (to rounding) as kernels.NumpyKernels."""
    name = "numba"
    linear_act_forward = staticmethod(linear_act_forward)
    linear_act_backward = staticmethod(linear_act_backward)
    reduce_add = staticmethod(reduce_add)
