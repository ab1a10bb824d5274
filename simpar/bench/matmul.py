"""`python -m simpar bench matmul`: our Numba matmul and fused layer against NumPy/OpenBLAS.

    python -m simpar bench matmul
    python -m simpar bench matmul --sizes 256,512,1024 --dtype float64 --repeat 7 --json
    python -m simpar bench matmul --breakdown          # + where the Numba GEMM's time goes

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


# -- --breakdown: where the Numba GEMM's time goes -----------------------------------------------------
# The driver kernels/cpu.py's _gemm runs three kinds of work: packing B (once per k-block), packing A
# (once per k-block and row block) and the micro-kernel (once per tile per k-block). The functions
# below replay exactly the calls _gemm makes for an n x n x n product, one kind at a time, on buffers
# packed beforehand, so each kind's time is measured alone; a fourth runs one micro-kernel call
# repeatedly on panels that sit in L1, the kernel's own peak. (Copies of the driver's loops: timing
# inside the real driver would need clocks in nopython code, which Numba does not offer.)


def _phase_functions():
    from numba import njit

    from kernels import cpu

    MR, MC, KC = cpu.MR, cpu.MC, cpu.KC

    @njit(cache=False)
    def pack_b_only(Bp, B, K, N):
        for p0 in range(0, K, KC):
            cpu._pack_b(Bp, B, False, p0, min(KC, K - p0), N)

    @njit(cache=False)
    def pack_a_only(Ap, A, M, K):
        for p0 in range(0, K, KC):
            for i0 in range(0, M, MC):
                cpu._pack_a(Ap, A, False, i0, min(MC, M - i0), p0, min(KC, K - p0))

    @njit(cache=False)
    def micro_only(Ap, Bp, M, K, N, tile):
        NR = tile.shape[1]
        partial = np.zeros_like(
            tile
        )  # as _gemm: earlier k-blocks into a partial-sum tile, the last into `tile`
        for p0 in range(0, K, KC):
            kc, first, last = min(KC, K - p0), p0 == 0, p0 + KC >= K
            for i0 in range(0, M, MC):
                for q in range((N + NR - 1) // NR):
                    for p in range((min(MC, M - i0) + MR - 1) // MR):
                        if last:
                            cpu._micro(Ap[p], Bp[q], kc, partial, tile, first)
                        else:
                            cpu._micro(Ap[p], Bp[q], kc, partial, partial, first)

    @njit(cache=False)
    def micro_in_l1(Ap, Bp, kc, tile, reps):
        for _ in range(reps):
            cpu._micro(Ap[0], Bp[0], kc, tile, tile, False)

    return pack_b_only, pack_a_only, micro_only, micro_in_l1


def breakdown(n: int, dtype, repeat: int) -> dict:
    """Seconds of each kind of work in an n x n x n Numba GEMM, the whole GEMM, OpenBLAS's, and the
    micro-kernel's GF/s with its panels in L1 (kc = 256: 5x256 of A and 256x64 B of bytes stay resident)."""
    from kernels import cpu

    pack_b_only, pack_a_only, micro_only, micro_in_l1 = _phase_functions()
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(n)
    a, b = (rng.standard_normal((n, n)).astype(dtype) for _ in range(2))
    NR = cpu.NR_BYTES // dtype.itemsize
    kb = min(cpu.KC, n)
    Bp = np.zeros(((n + NR - 1) // NR, kb, NR), dtype)
    Ap = np.zeros(((min(cpu.MC, n) + cpu.MR - 1) // cpu.MR, kb, cpu.MR), dtype)
    tile = np.zeros((cpu.MR, NR), dtype)

    def timed(fn) -> float:
        fn()
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    out = {
        "n": n,
        "openblas_s": timed(lambda: a @ b),
        "numba_s": timed(lambda: cpu.matmul(a, b)),
        "pack_b_s": timed(lambda: pack_b_only(Bp, b, n, n)),
        "pack_a_s": timed(lambda: pack_a_only(Ap, a, n, n)),
        "micro_s": timed(lambda: micro_only(Ap, Bp, n, n, n, tile)),
    }
    kc, reps = 256, 20000
    Ap1, Bp1 = np.full((1, kc, cpu.MR), 1e-3, dtype), np.full((1, kc, NR), 1e-3, dtype)
    out["micro_l1_gflops"] = (
        2.0 * cpu.MR * NR * kc * reps / timed(lambda: micro_in_l1(Ap1, Bp1, kc, tile, reps)) / 1e9
    )
    out["openblas_gflops"] = 2.0 * n**3 / out["openblas_s"] / 1e9
    return out


def format_breakdown(rows: list[dict], dtype: str) -> str:
    lines = [
        f"where the Numba GEMM's time goes, {dtype}, 1 thread (medians; each kind of work replayed alone)",
        f"{'n':>6} {'OpenBLAS':>9} {'Numba':>9} {'pack B':>8} {'pack A':>8} {'micro':>8} {'micro GF/s':>11} "
        f"{'in L1':>8} {'OpenBLAS GF/s':>14}",
    ]
    for r in rows:
        ms = lambda k: f"{r[k] * 1e6:>8.1f}"  # noqa: E731  (microseconds)
        micro_gf = 2.0 * r["n"] ** 3 / r["micro_s"] / 1e9
        lines.append(
            f"{r['n']:>6} {ms('openblas_s'):>9} {ms('numba_s'):>9} {ms('pack_b_s'):>8} {ms('pack_a_s'):>8} "
            f"{ms('micro_s'):>8} {micro_gf:>11.1f} {r['micro_l1_gflops']:>8.1f} {r['openblas_gflops']:>14.1f}"
        )
    lines.append(
        "times in microseconds; micro GF/s: the micro-kernel calls of the whole GEMM on packed panels; "
        "in L1: one tile's k loop repeated with its panels in L1 (the kernel's peak)."
    )
    return "\n".join(lines)
