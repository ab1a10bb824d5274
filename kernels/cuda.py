"""GPU kernels in numba.cuda: the teaching twin of kernels/cpu.py.

The same three jobs -- matmul, the fused linear layer, the reduce-add -- written the way a first
CUDA course writes them, correctness first:

* Tiled matmul. One thread computes one element of C. A block of TILE x TILE threads walks along
  k in steps of TILE: each thread copies ONE element of op(A) and ONE of op(B) into shared memory,
  the block waits (`syncthreads`), and then every thread reads TILE values of each tile from fast
  on-chip shared memory. So each element fetched from global memory is used TILE times -- the GPU
  version of the CPU kernel's register blocking and packing.
* Fusion. The matmul kernel's epilogue adds the bias and applies the activation to its one
  element before the single write to global memory: no second kernel reading z back.
* Transposes are index swaps while loading the tiles (`ta`, `tb`), never copies.

`CudaKernels` takes and returns host NumPy arrays (copying over and back on every call), so it is
a drop-in backend but not a fast one; benchmarks/gpu_kernels.py times the kernels on device arrays,
beside cuBLAS (through CuPy) on the same arrays.

Runs without a GPU under the simulator: set NUMBA_ENABLE_CUDASIM=1 before numba is first imported.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, from_dtype

from . import reference
from .reference import GELU_A, GELU_C

TILE = 16  # 16 x 16 = 256 threads per block
ACTS = {"none": 0, "relu": 1, "tanh": 2, "gelu": 3}


@functools.lru_cache(maxsize=None)
def kernels_for(dtype):
    """Compile (lazily, once per dtype) the kernels for float32 or float64.

    Built in a closure so that every constant -- zero, one, the GELU constants -- has the array's
    own dtype: a bare 0.5 would be a float64 and silently turn float32 arithmetic into float64.
    """
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise TypeError(f"cuda kernels support float32 and float64, not {dtype}")
    nbtype = from_dtype(dtype)
    t = dtype.type
    zero, one, half = t(0), t(1), t(0.5)
    gc, ga, ga3 = t(GELU_C), t(GELU_A), t(3 * GELU_A)

    @cuda.jit(device=True)
    def activate(z, act):
        if act == 1:
            return z if z > zero else zero
        if act == 2:
            return math.tanh(z)
        if act == 3:
            return half * z * (one + math.tanh(gc * (z + ga * z * z * z)))
        return z

    @cuda.jit
    def linear(A, ta, B, tb, bias, act, Z, Y):
        """Z = op(A) @ op(B) (+ bias), Y = act(Z). Grid: ceil(N/TILE) x ceil(M/TILE) blocks."""
        sA = cuda.shared.array((TILE, TILE), nbtype)
        sB = cuda.shared.array((TILE, TILE), nbtype)
        tx = cuda.threadIdx.x  # column inside the tile: consecutive threads
        ty = cuda.threadIdx.y  # read consecutive addresses (coalesced)
        row = cuda.blockIdx.y * TILE + ty
        col = cuda.blockIdx.x * TILE + tx
        M, N = Z.shape
        K = A.shape[0] if ta else A.shape[1]
        acc = zero
        for t0 in range(0, K, TILE):
            ka = t0 + tx  # this thread loads op(A)[row, ka] ...
            kb = t0 + ty  # ... and op(B)[kb, col]
            if row < M and ka < K:
                sA[ty, tx] = A[ka, row] if ta else A[row, ka]
            else:
                sA[ty, tx] = zero  # padding: contributes nothing to the sum
            if kb < K and col < N:
                sB[ty, tx] = B[col, kb] if tb else B[kb, col]
            else:
                sB[ty, tx] = zero
            cuda.syncthreads()  # the whole tile is loaded ...
            for k in range(TILE):
                acc += sA[ty, k] * sB[k, tx]
            cuda.syncthreads()  # ... and used by everyone before it is overwritten
        if row < M and col < N:  # the fused epilogue: one write of z and y
            if bias.size > 0:
                acc += bias[col]
            Z[row, col] = acc
            Y[row, col] = activate(acc, act)

    @cuda.jit
    def bias_act(Z, bias, act, Y):
        """The UNFUSED epilogue, for comparison only: a second kernel that reads z back from global
        memory, adds the bias and applies act -- the extra memory pass that `linear` avoids."""
        j, i = cuda.grid(2)  # x runs along a row: coalesced accesses
        if i < Z.shape[0] and j < Z.shape[1]:
            z = Z[i, j] + bias[j]
            Z[i, j] = z
            Y[i, j] = activate(z, act)

    @cuda.jit
    def act_backward(dy, z, y, act, dz):
        """dz = act'(z) * dy elementwise (formulas of simpar/model.py); one thread per element."""
        j, i = cuda.grid(2)  # x runs along a row: coalesced accesses
        if i < dz.shape[0] and j < dz.shape[1]:
            g = dy[i, j]
            if act == 1:
                g = g if z[i, j] > zero else g * zero
            elif act == 2:
                g = g * (one - y[i, j] * y[i, j])
            elif act == 3:
                x = z[i, j]
                th = math.tanh(gc * (x + ga * x * x * x))
                g = g * (half * (one + th) + half * x * (one - th * th) * (gc * (one + ga3 * x * x)))
            dz[i, j] = g

    @cuda.jit
    def column_sum(dz, db):
        """db[j] = sum_i dz[i, j]: one thread per column (simple; a tree reduction would be faster)."""
        j = cuda.grid(1)
        if j < db.shape[0]:
            s = zero
            for i in range(dz.shape[0]):
                s += dz[i, j]
            db[j] = s

    @cuda.jit
    def reduce_add(dst, src):
        i = cuda.grid(1)
        if i < dst.shape[0]:
            dst[i] += src[i]

    return {
        "linear": linear,
        "bias_act": bias_act,
        "act_backward": act_backward,
        "column_sum": column_sum,
        "reduce_add": reduce_add,
    }


def grid_2d(m, n):
    """(blocks, threads) covering an m x n output with TILE x TILE blocks (x runs along columns)."""
    return (math.ceil(n / TILE), math.ceil(m / TILE)), (TILE, TILE)


def grid_1d(n, threads=256):
    """(blocks, threads) covering n elements."""
    return max(1, math.ceil(n / threads)), threads


def linear_device(A, B, bias=None, act="none", ta=False, tb=False, Z=None, Y=None):
    """Launch the tiled (fused) matmul on DEVICE arrays; returns (Z, Y) as device arrays."""
    k = kernels_for(A.dtype)
    M = A.shape[1] if ta else A.shape[0]
    N = B.shape[0] if tb else B.shape[1]
    Z = cuda.device_array((M, N), A.dtype) if Z is None else Z
    Y = (Z if act == "none" else cuda.device_array((M, N), A.dtype)) if Y is None else Y
    bias = cuda.device_array(0, A.dtype) if bias is None else bias
    grid, block = grid_2d(M, N)
    k["linear"][grid, block](A, ta, B, tb, bias, ACTS[act], Z, Y)
    return Z, Y


def _check(*arrays):
    dtype = arrays[0].dtype
    for a in arrays[1:]:
        if a.dtype != dtype:
            raise TypeError(f"mixed dtypes {dtype} and {a.dtype}: cast the inputs to one dtype")
    return [cuda.to_device(np.ascontiguousarray(a)) for a in arrays]


def matmul(a, b, trans_a=False, trans_b=False):
    """op(a) @ op(b) for host arrays, through the device."""
    da, db_ = _check(a, b)
    return linear_device(da, db_, ta=trans_a, tb=trans_b)[0].copy_to_host()


def linear_act_forward(x, W, b, act):
    """(z, y) = (x @ W + b, act(z)) by the fused kernel; host arrays in and out."""
    arrays = _check(x, W) if b is None else _check(x, W, b)
    d_z, d_y = linear_device(*arrays[:2], bias=arrays[2] if b is not None else None, act=act)
    z = d_z.copy_to_host()
    return z, (z if act == "none" else d_y.copy_to_host())


def linear_act_backward(dy, x, W, z, y, act, need_dx):
    """(dx, dW, db): dz by an elementwise kernel, db by a column sum, dx and dW by the tiled matmul
    with its transpose flags (dz @ W.T and x.T @ dz) -- no transposed copies."""
    d_dy, d_x, d_W, d_z, d_y = _check(dy, x, W, z, y)
    k = kernels_for(dy.dtype)
    M, N = dy.shape
    d_dz = cuda.device_array((M, N), dy.dtype)
    grid, block = grid_2d(M, N)
    k["act_backward"][grid, block](d_dy, d_z, d_y, ACTS[act], d_dz)
    d_db = cuda.device_array(N, dy.dtype)
    k["column_sum"][grid_1d(N)](d_dz, d_db)
    dx = linear_device(d_dz, d_W, tb=True)[0].copy_to_host() if need_dx else None
    dW = linear_device(d_x, d_dz, ta=True)[0].copy_to_host()
    return dx, dW, d_db.copy_to_host()


def reduce_add(dst, src):
    """dst += src in place (host arrays, 1-D)."""
    d_dst, d_src = _check(dst, src)
    kernels_for(dst.dtype)["reduce_add"][grid_1d(dst.shape[0])](d_dst, d_src)
    if dst.flags.c_contiguous:
        d_dst.copy_to_host(dst)
    else:
        dst[...] = d_dst.copy_to_host()


class CudaKernels:
    """The CUDA backend: same interface as kernels.NumpyKernels; host arrays in, host arrays out."""

    name = "cuda"
    linear_act_forward = staticmethod(linear_act_forward)
    linear_act_backward = staticmethod(linear_act_backward)
    reduce_add = staticmethod(reduce_add)
    # The optimizers update host arrays: NumPy's reference (a device-resident optimizer would need the
    # parameters to live on the GPU between calls, which this host-in/host-out backend does not do).
    sgd_update = staticmethod(reference.sgd_update)
    adam_update = staticmethod(reference.adam_update)

    # What the device kernels move besides the GEMM's own reads and its write of z (kernels/__init__.py).
    # The host <-> device copies of this host-in/host-out backend are NOT counted: a GPU profile
    # models device-resident tensors, as a real framework keeps them.
    @staticmethod
    def forward_passes(bias: bool, act: bool) -> int:
        """`linear`'s fused epilogue adds the bias in registers; only y = act(z) is one more write."""
        return int(act)

    @staticmethod
    def backward_passes(act: bool) -> int:
        """act_backward reads dy (and z or y: 1), writes dz (2 + act); column_sum reads dz again (1)."""
        return 3 + act

    # The optimizer is NumPy's reference on the host: the same passes as NumpyKernels.
    optimizer_passes = staticmethod(reference.optimizer_passes)
