"""Check kernels/cuda.py against NumPy on a real NVIDIA GPU, then time it (one run, < 90 s).

    python benchmarks/gpu_kernels.py            # on a machine with a GPU, numba and numba-cuda
    python benchmarks/gpu_kernels.py --sim      # no GPU: the CUDA simulator, tiny sizes

1. Correctness: the CudaKernels backend (host arrays in and out) against kernels.NumpyKernels for
   forward and backward, float32 and float64, on odd shapes and at 1024. Each error is measured
   against the dot-product error bound (|x| @ |W|), as tests/test_kernels.py does.
2. Speed, float32, on arrays already on the device (no host<->device copies in the timings):
   the tiled matmul at n = 1024, 2048, 4096; the fused forward (matmul + bias + gelu in one
   kernel); and the unfused version (matmul, then a second kernel that reads z back for bias +
   gelu) to show what fusion saves. CUDA events time each call; the median of --repeat calls
   after a warm-up (the first call also compiles) is reported.
The last line printed is one JSON object with every number.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sim", action="store_true", help="run under NUMBA_ENABLE_CUDASIM=1 with tiny sizes")
    p.add_argument("--repeat", type=int, default=5, help="timed calls per measurement (median)")
    return p.parse_args()


def main() -> int:
    args = parse_args()
    if args.sim:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"  # must happen before numba is imported
    sys.path.insert(0, str(ROOT))
    warnings.filterwarnings(
        "ignore", message=".*under-utilization.*"
    )  # tiny grids are the point of the checks
    import numpy as np
    from numba import cuda

    import kernels
    from kernels import cuda as kc

    t_start = time.perf_counter()
    device = getattr(cuda.get_current_device(), "name", "CUDA simulator")
    device = device.decode() if isinstance(device, bytes) else str(device)
    print(f"device: {device}; numpy {np.__version__}; simulator: {args.sim}", flush=True)

    # -- 1. correctness ---------------------------------------------------------------------------
    rng = np.random.default_rng(0)
    shapes = (
        [(1, 1, 1, "relu"), (5, 17, 3, "gelu"), (20, 6, 18, "tanh")]
        if args.sim
        else [(1, 1, 1, "relu"), (257, 129, 65, "gelu"), (100, 33, 1000, "none"), (1024, 1024, 1024, "tanh")]
    )
    worst = {}
    for dtype in (np.float32, np.float64):
        tol = 1e-5 if dtype == np.float32 else 1e-12
        for m, k, n, act in shapes:
            x = rng.standard_normal((m, k)).astype(dtype)
            W = rng.standard_normal((k, n)).astype(dtype)
            b = rng.standard_normal(n).astype(dtype)
            dy = rng.standard_normal((m, n)).astype(dtype)
            z, y = kc.CudaKernels.linear_act_forward(x, W, b, act)
            z0, y0 = kernels.NumpyKernels.linear_act_forward(x, W, b, act)
            got = (z, y, *kc.CudaKernels.linear_act_backward(dy, x, W, z0, y0, act, True))
            ref = (z0, y0, *kernels.NumpyKernels.linear_act_backward(dy, x, W, z0, y0, act, True))
            s = np.abs(x) @ np.abs(W) + np.abs(b)
            g = 2 * np.abs(dy)  # bounds |dz| term by term
            scales = (s, 1.2 * s, g @ np.abs(W).T, np.abs(x).T @ g, g.sum(axis=0))
            ratio = max(
                float(np.max(np.abs(u.astype(np.float64) - r) / (tol * (sc + np.abs(r)) + 1e-30)))
                for u, r, sc in zip(got, ref, scales)
            )
            assert all(u.dtype == dtype and u.shape == r.shape for u, r in zip(got, ref))
            key = f"{np.dtype(dtype).name} {m}x{k}x{n} {act}"
            worst[key] = ratio
            print(f"check {key:<28} error / bound = {ratio:.3f} {'ok' if ratio <= 1 else 'FAIL'}", flush=True)
    checks_ok = all(r <= 1 for r in worst.values())

    # -- 2. speed (float32, device arrays) -------------------------------------------------------
    f32 = np.float32
    bias_act = kc.kernels_for(f32)["bias_act"]

    def time_ms(launch) -> float:
        launch()  # warm-up (and compile)
        cuda.synchronize()
        times = []
        for _ in range(args.repeat):
            start, end = cuda.event(), cuda.event()
            t0 = time.perf_counter()
            start.record()
            launch()
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
            times.append(ms if ms >= 0 else 1e3 * (time.perf_counter() - t0))  # simulator: -1
        return statistics.median(times)

    speed = []
    for n in [16, 32] if args.sim else [1024, 2048, 4096]:
        A = cuda.to_device(rng.standard_normal((n, n)).astype(f32))
        B = cuda.to_device(rng.standard_normal((n, n)).astype(f32))
        bias = cuda.to_device(rng.standard_normal(n).astype(f32))
        Z, Y = cuda.device_array((n, n), f32), cuda.device_array((n, n), f32)
        grid, block = kc.grid_2d(n, n)
        t_mm = time_ms(lambda: kc.linear_device(A, B, Z=Z, Y=Z))
        t_fused = time_ms(lambda: kc.linear_device(A, B, bias=bias, act="gelu", Z=Z, Y=Y))
        t_unfused = time_ms(
            lambda: (kc.linear_device(A, B, Z=Z, Y=Z), bias_act[grid, block](Z, bias, kc.ACTS["gelu"], Y))
        )
        gflop = 2 * n**3 / 1e9
        row = {
            "n": n,
            "matmul_gflops": gflop / (t_mm / 1e3),
            "fused_gflops": gflop / (t_fused / 1e3),
            "unfused_gflops": gflop / (t_unfused / 1e3),
            "matmul_ms": t_mm,
            "fused_ms": t_fused,
            "unfused_ms": t_unfused,
        }
        speed.append(row)
        print(
            f"n={n:>5}: tiled matmul {row['matmul_gflops']:9.1f} GFLOP/s ({t_mm:.3f} ms); fused "
            f"matmul+bias+gelu {row['fused_gflops']:9.1f}; unfused (2 kernels) {row['unfused_gflops']:9.1f}",
            flush=True,
        )

    summary = {
        "device": device,
        "simulator": args.sim,
        "checks_ok": checks_ok,
        "worst_error_over_bound": max(worst.values()),
        "tile": kc.TILE,
        "dtype_speed": "float32",
        "speed": speed,
        "seconds": time.perf_counter() - t_start,
    }
    print(json.dumps(summary))
    return 0 if checks_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
