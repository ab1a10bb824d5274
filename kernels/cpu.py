"""CPU kernels in Numba: a GotoBLAS-style matmul, the fused linear layer, and the reduce-add.

(Over 300 lines on purpose: the matmul's packing, micro-kernel and driver only make sense read
together, and the fused layer reuses them; splitting them would scatter one algorithm.)

Why a hand-written matmul at all? NumPy hands `x @ W` to OpenBLAS, whose kernels are hand-tuned
assembly. Writing one in Numba shows what those kernels do: keep operands in cache, keep a tile of
the result in vector registers, and feed the CPU's FMA units (AVX2: 8 float32 / 4 float64 lanes,
two FMAs per cycle) every cycle. `matmul` below is that kernel (C = op(A) @ op(B), A: M x K):

* Packing. For each k-block of KC=512 rows, op(B) is copied into NR-column panels (Bp[q, k, :]
  is NR contiguous numbers) and each MC=60-row block of op(A) into MR-row panels (Ap[p, k, :]).
  The hot loop then reads both with stride 1; a transpose (x.T @ dz, dz @ W.T) costs nothing
  extra, it is just a different packing order. A B panel (KC x 64 bytes = 32 KiB) stays close
  while every A panel of the block (<= 240 KiB, in L2) passes it. Larger KC means fewer passes
  over C (each k-block adds into it): KC=512 measured ~5% faster than 256 at n=1024 (MC 30-120,
  KC=1024: the same). Packing is O(n^2) but is ~15% of the time at n=256 float32, so it is kept
  lean: 64-byte row copies (vector moves) for B, views with a constant MR-long inner loop for A,
  and only a partial last panel zero-padded -- 2-2.5x faster than scalar loops into a zeroed buffer.
* The micro-kernel. An MR x NR = 5 x (64 bytes) tile of C -- 5 x 16 float32 or 5 x 8 float64,
  i.e. 10 AVX2 registers -- lives in 80 (or 40) scalar local variables for the whole k loop; each
  step loads one row of Bp (2 vector loads), broadcasts 5 numbers of Ap and does 10 vector FMAs.
  >= 8 independent accumulators cover the FMA latency (4 cycles x 2 units). Alone, with its data
  in L1, it runs at 90-99 GF/s float32 / 47-51 float64 -- OpenBLAS's speed (4 rows: about 5% less).
  6 rows (12 registers) made LLVM spill registers to the stack: 2x slower.
* How it vectorises. The tile's scalars become vector registers through LLVM's SLP vectoriser,
  which Numba switches off by default -- we switch it on (numba.config.SLP_VECTORIZE, below).
  `fastmath={"contract"}` on the micro-kernel lets mul+add become one FMA; no other fast-math
  flag is used (no reassociation: each C[i, j] still sums its products in k order; nnan/ninf
  stay off, so NaN and inf propagate exactly as in NumPy). `inspect_asm` shows 10 `vfmadd231ps
  ymm` per k step. Without SLP the same code runs scalar, about 20x slower.

What it reaches, single-threaded, on the shared Zen 3 core it was tuned on (medians of noisy
runs; `python -m simpar bench matmul` measures yours), n = 256, 512, 1024: float32 0.90, 0.92-0.95,
0.91x OpenBLAS; float64 0.94, 0.91-1.0, 0.93x (before the lean packing and the direct tile output:
0.70, 0.80, 0.87 and 0.85, 0.92, 0.94); on a busy machine single runs scatter +-0.1.
What assembly still does better: prefetching, exact scheduling, a 6 x 16 tile, packing A (an
MR-interleaving transpose, ~10% of the time at n=256 float32) with shuffles. No gain from: A read
unpacked through strided views, A panels as MR contiguous rows, packing B panels on first use.

The fused linear layer is therefore, honestly, "GEMM + fused epilogue" (the cuBLASLt design):

* forward: z = x @ W by OpenBLAS, then ONE Numba sweep that adds the bias and writes y = act(z)
  while each row of z is in L1 (`_bias_act`). NumPy's `act(x @ W + b)` sweeps z once for the bias
  and once or more for the activation (gelu: about seven passes and temporaries).
* backward: ONE sweep computes dz = act'(z) * dy and the bias gradient db = sum(dz) together
  (`_act_backward`), then OpenBLAS does dx = dz @ W.T and dW = x.T @ dz.
* tiny layers (batch * fan_in * fan_out <= SMALL_MACS = 16384) do everything, GEMMs included, in
  one Numba call with our own `_gemm` (it ends with the same epilogue sweep): there, Python call
  overheads dominate and one call beats several.

Measured single-threaded against NumPy's unfused layer (kernels.NumpyKernels): forward and
backward 1.0-1.3x at batch 64-256, widths 128-1024 (relu, gelu; float32, float64), 1.3-1.8x on
tiny layers. Not enough to repay loading them, so `--kernels auto` runs NumPy's (kernels.AUTO says why).

All kernels take and return one float dtype (float32 or float64) and never promote.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import njit

from .cpu_optim import adam_update, sgd_update
from .cpu_optim import optimizer_passes as fused_optimizer_passes
from .reference import GELU_A, GELU_C

# -- the matmul ------------------------------------------------------------------------------------

# Numba leaves LLVM's SLP vectoriser off by default; the micro-kernel needs it (see above). It is read
# whenever a function is compiled, so setting it here, before any kernel below is compiled, covers
# them all -- no environment variable needed. It also applies to any other Numba CPU code compiled
# later in this process (simpar has none).
numba.config.SLP_VECTORIZE = 1

MR = 5  # rows of the register tile: 5 x 2 = 10 accumulator registers
NR_BYTES = 64  # its width: two AVX2 registers per row (16 float32 or 8 float64)
KC = 512  # k-block: a KC x NR panel of B (32 KiB) stays in L1/L2 while a tile is computed
MC = 60  # row block: the packed MC x KC block of A (120-240 KiB) stays in L2
ACTS = {"none": 0, "relu": 1, "tanh": 2, "gelu": 3}


def _micro_kernel_source(mr, nr):
    """Source of `T = S + A[:kc].T @ B[:kc]` (S unread if `first`) for mr x nr tiles S, T (may be
    one array), held in mr*nr local variables. Python cannot declare 80 locals in a loop, so a
    template writes the kernel. For mr=nr=2:

        def _micro_2x2(A, B, kc, S, T, first, zero):
            if first:
                c0_0 = zero; c0_1 = zero; c1_0 = zero; c1_1 = zero
            else:
                c0_0 = S[0, 0]; c0_1 = S[0, 1]; c1_0 = S[1, 0]; c1_1 = S[1, 1]
            for k in range(kc):
                b0 = B[k, 0]; b1 = B[k, 1]
                a = A[k, 0]; c0_0 += a * b0; c0_1 += a * b1
                a = A[k, 1]; c1_0 += a * b0; c1_1 += a * b1
            T[0, 0] = c0_0; T[0, 1] = c0_1; T[1, 0] = c1_0; T[1, 1] = c1_1

    T's indices are constants and T is C-contiguous: with variable indices (C[i + 0, j + 1]) Numba
    adds a negative-index check to each access, and with a strided T the stores, where the SLP
    vectoriser starts, are not adjacent: either way LLVM no longer vectorises -- 20x slower.
    """
    tile = [(r, c) for r in range(mr) for c in range(nr)]
    lines = [
        f"def _micro_{mr}x{nr}(A, B, kc, S, T, first, zero):",
        "    if first:",
        "        " + "; ".join(f"c{r}_{c} = zero" for r, c in tile),
        "    else:",
        "        " + "; ".join(f"c{r}_{c} = S[{r}, {c}]" for r, c in tile),
        "    for k in range(kc):",
        "        " + "; ".join(f"b{c} = B[k, {c}]" for c in range(nr)),
    ]
    for r in range(mr):
        lines.append(f"        a = A[k, {r}]; " + "; ".join(f"c{r}_{c} += a * b{c}" for c in range(nr)))
    lines.append("    " + "; ".join(f"T[{r}, {c}] = c{r}_{c}" for r, c in tile))
    return "\n".join(lines) + "\n"


def _make_micro_kernel(mr, nr):
    """Compile the template; its code claims this file as its source so that Numba can cache it."""
    namespace = {}
    exec(compile(_micro_kernel_source(mr, nr), __file__, "exec"), namespace)
    fn = namespace[f"_micro_{mr}x{nr}"]
    fn.__module__ = __name__
    return njit(cache=True, fastmath={"contract"}, boundscheck=False)(fn)


_micro32 = _make_micro_kernel(MR, NR_BYTES // 4)
_micro64 = _make_micro_kernel(MR, NR_BYTES // 8)


@njit(cache=True)
def _pack_a(Ap, A, ta, i0, mc, p0, kc):
    """Ap[p, k, r] = op(A)[i0 + p*MR + r, p0 + k]: MR-row panels, MR numbers per k. op(A) is A.T
    when `ta` (x.T @ dz): packing is where the transpose happens, for free."""
    for p in range((mc + MR - 1) // MR):
        i, rows = i0 + p * MR, min(MR, mc - p * MR)
        if rows < MR:
            Ap[p, :kc, :] = 0
        # Through views whose indices start at 0, LLVM can drop Numba's negative-index checks.
        dst, src = Ap[p], A[p0 : p0 + kc, i : i + rows] if ta else A[i : i + rows, p0 : p0 + kc].T
        if rows == MR:  # a constant: the inner loop is unrolled
            for k in range(kc):
                for r in range(MR):
                    dst[k, r] = src[k, r]
        else:
            for k in range(kc):
                for r in range(rows):
                    dst[k, r] = src[k, r]


@njit(cache=True)
def _pack_b(Bp, B, tb, p0, kc, N):
    """Bp[q, k, c] = op(B)[p0 + k, q*NR + c]: NR-column panels, NR contiguous numbers per k."""
    NR = NR_BYTES // B.itemsize  # a compile-time constant
    for q in range(Bp.shape[0]):
        j = q * NR
        cols = min(NR, N - j)
        if cols < NR:
            Bp[q, :kc, :] = 0
        if tb:  # op(B) = B.T (dz @ W.T)
            for c in range(cols):
                for k in range(kc):
                    Bp[q, k, c] = B[j + c, p0 + k]
        elif cols == NR:  # one 64-byte row copy per k
            for k in range(kc):
                for c in range(NR):
                    Bp[q, k, c] = B[p0 + k, j + c]
        else:
            for k in range(kc):
                Bp[q, k, :cols] = B[p0 + k, j : j + cols]


@njit(cache=True)
def _activate(z, act, zero, one, half, c, a):
    """act(z) for one element; the constants come in z's dtype, so float32 math stays float32."""
    if act == 1:
        return zero if z < zero else z  # NaN stays NaN, as in np.maximum
    if act == 2:
        return math.tanh(z)
    if act == 3:
        return half * z * (one + math.tanh(c * (z + a * (z * z * z))))
    return z


@njit(cache=True, inline="always")
def _micro(A, B, kc, S, T, first):
    """The micro-kernel for T's dtype: T = S + A.T @ B, or T = A.T @ B if `first` (S unread)."""
    if T.itemsize == 4:
        _micro32(A, B, kc, S, T, first, T.dtype.type(0))
    else:
        _micro64(A, B, kc, S, T, first, T.dtype.type(0))


@njit(cache=True)
def _gemm(Z, Y, A, ta, B, tb, bias, act, work):
    """Z = op(A) @ op(B) + bias and Y = act(Z); Y may be Z itself (act 0). `bias` of size 0: none.

    The first k-block starts each tile from zero (nothing to clear); the last copies each finished
    tile into Z from a small C-contiguous `tile` still in L1 (a strided view of Z as the kernel's
    output stopped the SLP vectoriser). In between (K > KC) partial sums live in Cp in tile order,
    Cp[q, p] = the tile at rows p*MR, columns q*NR, streamed in order (Z's own rows, 4 KiB apart
    at n=1024, made tile updates cache misses). No zeroed Cp and gather pass over all of C: 5-10%
    faster at n=256..512. Then `_bias_act` adds bias and activation: the fused epilogue.

    Ap, Bp and Cp are carved from `work`, replaced by a larger buffer if it is too small; the
    buffer used is returned so that the caller can keep it: fresh ~1 MiB buffers on every call
    cost ~250 page faults each time (half the time of a 256 x 256 float64 product).
    """
    M, N = Z.shape
    K = B.shape[1] if tb else B.shape[0]
    NR = NR_BYTES // Z.itemsize
    kb, nq, mp = max(1, min(KC, K)), (N + NR - 1) // NR, (M + MR - 1) // MR
    cq, cm = (nq, mp) if K > KC else (1, 1)  # partial sums between k-blocks, if any
    nb, na, nc = nq * kb * NR, ((min(MC, M) + MR - 1) // MR) * kb * MR, cq * cm * MR * NR
    if work.size < nb + na + nc:
        work = np.empty(nb + na + nc, Z.dtype)
    Bp = work[:nb].reshape((nq, kb, NR))
    Ap = work[nb : nb + na].reshape((na // (kb * MR), kb, MR))
    Cp = work[nb + na : nb + na + nc].reshape((cq, cm, MR, NR))
    tile = np.empty((MR, NR), Z.dtype)
    if K == 0:
        Z[:] = 0
    for p0 in range(0, K, KC):
        kc, first, last = min(KC, K - p0), p0 == 0, p0 + KC >= K
        _pack_b(Bp, B, tb, p0, kc, N)
        for i0 in range(0, M, MC):
            _pack_a(Ap, A, ta, i0, min(MC, M - i0), p0, kc)
            for q in range(nq):
                j = q * NR
                for p in range((min(MC, M - i0) + MR - 1) // MR):
                    i = i0 + p * MR
                    S = Cp[q, i // MR] if K > KC else Cp[0, 0]
                    if not last:
                        _micro(Ap[p], Bp[q], kc, S, S, first)
                        continue
                    _micro(Ap[p], Bp[q], kc, S, tile, first)
                    if i + MR <= M and j + NR <= N:  # into Z while the tile is in L1
                        for r in range(MR):
                            for c in range(NR):
                                Z[i + r, j + c] = tile[r, c]
                    else:
                        Z[i : i + MR, j : j + NR] = tile[: min(MR, M - i), : min(NR, N - j)]
    _bias_act(Z, Y, bias, act)
    return work


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
    none = np.empty(0, a.dtype)
    _WORK[a.dtype] = _gemm(out, out, a, trans_a, b, trans_b, none, 0, _WORK.get(a.dtype, none))
    return out


_WORK = {}  # matmul's packing buffers, one per dtype, kept between calls (see _gemm)


# -- the fused linear layer ------------------------------------------------------------------------


@njit(cache=True)
def _bias_act(z, y, bias, act):
    """z += bias and y = act(z) in ONE sweep over z: the fused epilogue after a BLAS GEMM."""
    zero, one, half = z.dtype.type(0.0), z.dtype.type(1.0), z.dtype.type(0.5)
    gc, ga = z.dtype.type(GELU_C), z.dtype.type(GELU_A)
    for i in range(z.shape[0]):
        if bias.size > 0:
            for j in range(z.shape[1]):
                z[i, j] += bias[j]
        if act != 0:  # z[i] is in L1 now; y is written in the same sweep
            for j in range(z.shape[1]):
                y[i, j] = _activate(z[i, j], act, zero, one, half, gc, ga)


@njit(cache=True)
def _act_backward(dy, z, y, act, dz, db):
    """dz = act'(z) * dy (the formulas of simpar/model.py) and db = dz summed over rows, one sweep."""
    zero, one, half = dz.dtype.type(0.0), dz.dtype.type(1.0), dz.dtype.type(0.5)
    gc, ga, ga3 = dz.dtype.type(GELU_C), dz.dtype.type(GELU_A), dz.dtype.type(3 * GELU_A)
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


@njit(cache=True)
def _backward_small(dy, x, W, z, y, act, need_dx, dx, dW, db):
    """The whole backward of a small layer in one call from Python, with our own GEMM."""
    dz = np.empty_like(dy)
    _act_backward(dy, z, y, act, dz, db)
    none = np.empty(0, dy.dtype)
    # Flags as variables, not literals: Numba would compile a separate _gemm for each literal
    # combination, tripling the compile time.
    yes, no, identity = need_dx | True, need_dx & False, act * 0
    work = none  # small: fresh buffers are cheap
    if need_dx:
        work = _gemm(dx, dx, dz, no, W, yes, none, identity, work)  # dx = dz @ W.T
    _gemm(dW, dW, x, yes, dz, no, none, identity, work)  # dW = x.T @ dz


SMALL_MACS = 1 << 14  # up to here the whole layer is one Numba call (measured crossover, see top)


def linear_act_forward(x, W, b, act):
    """(z, y) with z = x @ W + b and y = act(z); for act "none", y is z. See the module docstring."""
    if b is None:
        b = np.empty(0, W.dtype)
    x, W, b = _prep(x, W, b)
    y_is_z = act == "none"
    if x.shape[0] * x.shape[1] * W.shape[1] <= SMALL_MACS:  # one Numba call does it all
        z = np.empty((x.shape[0], W.shape[1]), x.dtype)
        y = z if y_is_z else np.empty_like(z)
        _gemm(z, y, x, False, W, False, b, ACTS[act], np.empty(0, x.dtype))
        return z, y
    z = np.matmul(x, W)  # the GEMM: OpenBLAS
    y = z if y_is_z else np.empty_like(z)
    if b.size or not y_is_z:
        _bias_act(z, y, b, ACTS[act])  # + the fused epilogue
    return z, y


def linear_act_backward(dy, x, W, z, y, act, need_dx):
    """(dx, dW, db): dz = act'(dy, z, y), dx = dz @ W.T (None unless need_dx), dW = x.T @ dz."""
    dW, db = np.empty(W.shape, dy.dtype), np.empty(W.shape[1], dy.dtype)
    return linear_act_backward_into(dy, x, W, z, y, act, need_dx, dW, db), dW, db


def linear_act_backward_into(dy, x, W, z, y, act, need_dx, dW, db):
    """As linear_act_backward, but WRITES dW and db into the (C-contiguous) arrays given -- views of
    the flat gradient buffer after a lazy zero_grad -- and returns dx only."""
    dy, x, W, z, y = _prep(dy, x, W, z, y)
    if x.shape[0] * x.shape[1] * W.shape[1] <= SMALL_MACS:
        dx = np.empty(x.shape if need_dx else (0, 0), x.dtype)
        _backward_small(dy, x, W, z, y, ACTS[act], need_dx, dx, dW, db)
        return dx if need_dx else None
    dz = np.empty_like(dy)
    _act_backward(dy, z, y, ACTS[act], dz, db)  # act' and the bias gradient, one sweep
    np.matmul(x.T, dz, out=dW)  # then the two GEMMs: OpenBLAS
    return dz @ W.T if need_dx else None


# -- the reduction inside collectives --------------------------------------------------------------


@njit(cache=True)
def _reduce_add(dst, src):
    for i in range(dst.shape[0]):
        dst[i] += src[i]


def reduce_add(dst, src):
    """dst += src in place (1-D chunks of a ring all-reduce); other layouts fall back to NumPy."""
    if (
        dst.ndim == 1
        and src.ndim == 1
        and dst.flags.c_contiguous
        and src.flags.c_contiguous
        and dst.dtype == src.dtype
        and dst.dtype in (np.float32, np.float64)
        and dst.shape == src.shape
    ):
        _reduce_add(dst, src)
    else:
        np.add(dst, src, out=dst)


def warm_up(dtypes=(np.float32, np.float64)):
    """Compile (first run) or load from the cache (later runs) every kernel for `dtypes` now, so that
    the first training step does not pay for it (about 20 s to compile, 0.5 s to load both dtypes)."""
    for dtype in dtypes:
        for n in (2, 64):  # both paths: below and above SMALL_MACS
            x = np.ones((n, n), dtype)
            z, y = linear_act_forward(x, x, x[0], "relu")
            linear_act_backward(x, x, x, z, y, "relu", True)
        reduce_add(x[0].copy(), x[0])
        w = x[0].copy()
        sgd_update(w, x[0], None, 0.1, 0.0)
        sgd_update(w, x[0], w.copy(), 0.1, 0.9)
        adam_update(w, x[0], w.copy(), w.copy(), 0.1, 0.9, 0.999, 1e-8, 10.0, 1000.0)


class NumbaKernels:
    """The Numba backend: same interface and results (to rounding) as kernels.NumpyKernels."""

    name = "numba"
    linear_act_forward = staticmethod(linear_act_forward)
    linear_act_backward = staticmethod(linear_act_backward)
    linear_act_backward_into = staticmethod(linear_act_backward_into)
    reduce_add = staticmethod(reduce_add)
    sgd_update = staticmethod(sgd_update)
    adam_update = staticmethod(adam_update)

    # What these kernels move besides the GEMMs (kernels/__init__.py: the clock charges it).
    @staticmethod
    def forward_passes(bias: bool, act: bool) -> int:
        """_bias_act's one sweep: reads z (1), writes z += b (1) and y (1) while the row is in L1."""
        return (1 if bias or act else 0) + bias + act

    @staticmethod
    def backward_passes(act: bool) -> int:
        """_act_backward's one sweep: reads dy (and z or y: 1), writes dz; db adds up in the same
        sweep (a row of b numbers, in cache). Even the identity copies dy into dz: 2."""
        return 2 + act

    optimizer_passes = staticmethod(fused_optimizer_passes)  # the fused loops (cpu_optim.py)
