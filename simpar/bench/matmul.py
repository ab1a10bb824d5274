"""`python -m simpar bench matmul`: our Numba matmul and fused layer against NumPy/OpenBLAS.

    python -m simpar bench matmul
    python -m simpar bench matmul --sizes 256,512,1024 --dtype float64 --repeat 7 --json

For each size n it times two things, single-threaded (the way every simpar rank runs):

* the square product (n x n) @ (n x n): NumPy (OpenBLAS) against kernels/cpu.py's matmul;
* a linear layer at a training shape, (batch x n) @ (n x n) + b then the activation: NumPy's
  unfused `act(x @ W + b)` (kernels.NumpyKernels) against the fused Numba kernel.

GFLOP/s counts 2 flops per multiply-add of the matmul only (the bias and activation are not
counted, so the fused numbers show what fusion buys per unit of matmul work). Each figure is the
median of --repeat timed calls after one warm-up call, NumPy and Numba called alternately; a ratio
is the median of the per-pair ratios. Ratios above 1 mean Numba is faster.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

ACTS = ("none", "relu", "tanh", "gelu")


def paired_seconds(peer, ours, repeat: int) -> tuple[float, float, float]:
    """Median seconds of `peer` and of `ours`, and the median of their per-pair ratios.

    The two are called alternately, so a burst of load from elsewhere slows both sides of a pair
    instead of skewing whichever block of calls it happened to hit."""
    peer(), ours()  # warm-up: caches, page faults, first-call costs
    t_peer, t_ours = [], []
    for _ in range(repeat):
        for fn, times in ((peer, t_peer), (ours, t_ours)):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    ratio = statistics.median(p / o for p, o in zip(t_peer, t_ours))
    return statistics.median(t_peer), statistics.median(t_ours), ratio


def measure(n: int, dtype, repeat: int, batch: int, act: str) -> dict:
    from kernels import NumpyKernels, cpu

    rng = np.random.default_rng(n)
    a = rng.standard_normal((n, n)).astype(dtype)
    b = rng.standard_normal((n, n)).astype(dtype)
    x = rng.standard_normal((batch, n)).astype(dtype)
    bias = rng.standard_normal(n).astype(dtype)
    gflop = 2.0 * n**3 / 1e9
    gflop_layer = 2.0 * batch * n * n / 1e9
    t_numpy, t_numba, matmul_ratio = paired_seconds(lambda: a @ b, lambda: cpu.matmul(a, b), repeat)
    t_unfused, t_fused, fused_ratio = paired_seconds(
        lambda: NumpyKernels.linear_act_forward(x, a, bias, act),
        lambda: cpu.NumbaKernels.linear_act_forward(x, a, bias, act),
        repeat,
    )
    return {
        "n": n,
        "numpy_gflops": gflop / t_numpy,
        "numba_gflops": gflop / t_numba,
        "matmul_ratio": matmul_ratio,
        "batch": batch,
        "act": act,
        "numpy_unfused_gflops": gflop_layer / t_unfused,
        "numba_fused_gflops": gflop_layer / t_fused,
        "fused_ratio": fused_ratio,
    }


def format_table(rows: list[dict], dtype: str, threads: str, ready_s: float) -> str:
    lines = [
        f"matmul, {dtype}, BLAS threads {threads} "
        f"(numba kernels ready in {ready_s:.1f} s: compiled or loaded from cache)",
        f"{'n':>6} {'numpy GF/s':>11} {'numba GF/s':>11} {'ratio':>6}   "
        f"{'layer (batch x n x n)':>22} {'numpy unfused':>14} {'numba fused':>12} {'ratio':>6}",
    ]
    for r in rows:
        shape = f"{r['batch']}x{r['n']}x{r['n']} {r['act']}"
        lines.append(
            f"{r['n']:>6} {r['numpy_gflops']:>11.1f} {r['numba_gflops']:>11.1f} {r['matmul_ratio']:>6.2f}   "
            f"{shape:>22} {r['numpy_unfused_gflops']:>14.1f} {r['numba_fused_gflops']:>12.1f} "
            f"{r['fused_ratio']:>6.2f}"
        )
    lines.append(
        "ratio = NumPy time / Numba time (above 1: Numba faster). GF/s counts the matmul's flops only."
    )
    return "\n".join(lines)
