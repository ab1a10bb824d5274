"""Check kernels/cuda.py against NumPy on a real NVIDIA GPU, then time it against cuBLAS (one run).

    python benchmarks/gpu_kernels.py            # a machine with a GPU, numba-cuda (and CuPy for the peer)
    python benchmarks/gpu_kernels.py --sim      # no GPU: the CUDA simulator, tiny sizes (~50 s of CPU)

1. Correctness: the CudaKernels backend (host arrays in and out) against kernels.NumpyKernels for
   forward and backward, float32 and float64, on odd shapes and at 1024. Each error is measured
   against the dot-product error bound (|x| @ |W|), as tests/unit/kernels/test_kernels.py does.
2. Speed, float32, on arrays already on the device (no host<->device copies in the timings), at
   n = 1024, 2048, 4096 (n x n times n x n): the tiled matmul; the fused forward (matmul + bias + gelu
   in one kernel); the unfused version (matmul, then a second kernel that reads z back for bias +
   gelu) to show what fusion saves. CUDA events time each call: the median of --repeat calls after
   one warm-up call (which also compiles). GFLOP/s counts the 2 n^3 of the product only.
3. The peer, when CuPy is installed: cuBLAS through `cupy.matmul` on the SAME device arrays (zero-copy
   views through __cuda_array_interface__), timed the same way, in plain FP32 (CuPy's default;
   CUPY_TF32=1 lets cuBLAS round to TF32: the label says so and the peer's check then fails). The
   fused and the unfused layer are both held against cuBLAS's matmul followed by one CuPy elementwise
   bias+gelu kernel -- what a framework without an epilogue-fusing GEMM does. The peer's layer output
   is checked against NumPy at the smallest n. Without CuPy one line says so; its JSON fields are null.

What it prints: the device; one `check ...` line per correctness case; a `cuBLAS peer:` line; then per
n three lines -- the tiled matmul, the fused layer, the unfused layer -- each with simpar's GFLOP/s and
milliseconds and, with the peer, cuBLAS's GFLOP/s and the ratio simpar/cuBLAS (1.0 = parity). The
last line is one JSON object with every number. It is sized to finish well under 90 s on a data-centre
GPU, the first-call compiles included (an estimate: it has not run on a GPU yet). Without a GPU (and
without --sim) it prints one line on stderr and exits with status 2.

(Over 300 lines: one script, run once on a GPU machine, whose three parts -- correctness, speed,
the cuBLAS peer -- print one report; the speed runs and the peer time the same device arrays.)
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
PEER_MISSING = "cuBLAS peer: CuPy not installed (pip install cupy-cuda12x)"
SIZES, SIM_SIZES = (1024, 2048, 4096), (16, 32)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sim", action="store_true", help="run under NUMBA_ENABLE_CUDASIM=1 with tiny sizes")
    p.add_argument("--repeat", type=int, default=5, help="timed calls per measurement (median)")
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    return args


def first_line(text) -> str:
    """The first non-blank line of an error text: numba's messages start with blank lines."""
    return next((line.strip() for line in str(text).splitlines() if line.strip()), str(text))


def no_gpu_reason(cuda) -> str | None:
    """None when numba can run kernels on a GPU here; otherwise numba's reason, in one line."""
    if cuda.is_available():  # initializes the driver, so cuda_error() below is filled in
        return None
    if cuda.cuda_error():
        return first_line(cuda.cuda_error()).rstrip(".")
    return "driver found but libNVVM is missing: pip install 'numba-cuda[cu12]' (or [cu13], to match it)"


def median_event_ms(launch, new_event, elapsed_ms, repeat) -> float:
    """Median GPU time of `launch()` in ms, bracketed by two CUDA events on the default stream.

    The warm-up call (and its compile) runs first; it is ahead of the start event in the stream, so no
    synchronisation is needed for the events to exclude it. The simulator's events report -1: it runs
    synchronously, so the host clock measures the same thing there."""
    launch()
    times = []
    for _ in range(repeat):
        start, end = new_event(), new_event()
        t0 = time.perf_counter()
        start.record()
        launch()
        end.record()
        end.synchronize()
        ms = elapsed_ms(start, end)
        times.append(ms if ms >= 0 else 1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def load_cupy():
    """(cupy, None) when CuPy imports, else (None, the line that says why the peer is missing)."""
    try:
        import cupy
    except Exception as e:  # not installed, or built for another CUDA (that raises on import)
        if isinstance(e, ModuleNotFoundError) and e.name == "cupy":
            return None, PEER_MISSING
        return None, f"cuBLAS peer: CuPy cannot be imported ({type(e).__name__}: {first_line(e)})"
    return cupy, None


class CublasPeer:
    """cuBLAS (through CuPy) on simpar's own device arrays: the figure a vendor library reaches."""

    def __init__(self, cp):
        from kernels.reference import GELU_A, GELU_C

        self.cp = cp
        tf32 = os.environ.get("CUPY_TF32", "0") not in ("", "0")
        self.label = f"CuPy {cp.__version__}, cuBLAS {'TF32' if tf32 else 'FP32'}"
        # One elementwise kernel for bias + GELU (tanh approximation, as kernels/reference.py): b is
        # broadcast along the rows, so b[j] is added to column j. (T) casts keep float32 arithmetic.
        self.bias_gelu = cp.ElementwiseKernel(
            "T z, T b",
            "T zb, T y",
            f"T u = z + b; zb = u; "
            f"y = (T)0.5 * u * ((T)1 + tanh((T){GELU_C!r} * (u + (T){GELU_A!r} * u * u * u)));",
            "simpar_peer_bias_gelu",
        )

    def view(self, device_array):
        """A CuPy array on the same memory as a numba device array: no copy (checked)."""
        v = self.cp.asarray(device_array)
        assert v.data.ptr == device_array.__cuda_array_interface__["data"][0], "CuPy copied the array"
        return v

    def measure(self, A, B, bias, repeat):
        """({"matmul": ms, "layer": ms}, (z, y) of the layer as host arrays) for numba device arrays."""
        cp = self.cp
        a, b, bb = self.view(A), self.view(B), self.view(bias)
        shape = (a.shape[0], b.shape[1])
        z, zb, y = (cp.empty(shape, dtype=a.dtype) for _ in range(3))
        ms = {
            "matmul": median_event_ms(
                lambda: cp.matmul(a, b, out=z), cp.cuda.Event, cp.cuda.get_elapsed_time, repeat
            ),
            "layer": median_event_ms(
                lambda: (cp.matmul(a, b, out=z), self.bias_gelu(z, bb, zb, y)),
                cp.cuda.Event,
                cp.cuda.get_elapsed_time,
                repeat,
            ),
        }
        return ms, (cp.asnumpy(zb), cp.asnumpy(y))


def speed_row(n, ours_ms, peer_ms=None) -> dict:
    """One size's figures: simpar's three timings (ms), the peer's two (or None), rates and ratios.

    GFLOP/s = 2 n^3 / time. A ratio is simpar's rate over the peer's (= the peer's time over ours);
    the fused and the unfused layer are both held against cuBLAS's matmul + elementwise bias+gelu."""
    gflop = 2 * n**3 / 1e9
    row = {"n": n}
    for kind in ("matmul", "fused", "unfused"):
        row[f"{kind}_gflops"] = gflop / (ours_ms[kind] / 1e3)
        row[f"{kind}_ms"] = ours_ms[kind]
    for kind in ("matmul", "layer"):
        row[f"cublas_{kind}_gflops"] = None if peer_ms is None else gflop / (peer_ms[kind] / 1e3)
        row[f"cublas_{kind}_ms"] = None if peer_ms is None else peer_ms[kind]
    for kind, peer_kind in (("matmul", "matmul"), ("fused", "layer"), ("unfused", "layer")):
        row[f"{kind}_over_cublas"] = None if peer_ms is None else peer_ms[peer_kind] / ours_ms[kind]
    return row


def speed_lines(row) -> list[str]:
    """The three printed lines of one size: simpar's figure, then the peer's and the ratio if any."""
    names = {
        "matmul": ("tiled matmul", "matmul", "cuBLAS matmul"),
        "fused": ("fused matmul+bias+gelu", "layer", "cuBLAS + elementwise"),
        "unfused": ("unfused (2 kernels)", "layer", "cuBLAS + elementwise"),
    }
    lines = []
    for kind, (name, peer_kind, peer_name) in names.items():
        line = (
            f"n={row['n']:>5} {name:<23} {row[f'{kind}_gflops']:9.1f} GFLOP/s ({row[f'{kind}_ms']:8.3f} ms)"
        )
        if row[f"{kind}_over_cublas"] is not None:
            line += (
                f" | {peer_name:<20} {row[f'cublas_{peer_kind}_gflops']:9.1f} GFLOP/s"
                f" | simpar/cuBLAS {row[f'{kind}_over_cublas']:.3f}"
            )
        lines.append(line)
    return lines


def error_over_bound(got, ref, scales, tol) -> float:
    """max |got - ref| / (tol (scale + |ref|)) over every output: <= 1 passes (the dot-product bound)."""
    import numpy as np

    return max(
        float(np.max(np.abs(u.astype(np.float64) - r) / (tol * (sc + np.abs(r)) + 1e-30)))
        for u, r, sc in zip(got, ref, scales)
    )


def verdict(ratio) -> str:
    return "ok" if ratio <= 1 else "FAIL"


def check_kernels(kc, rng, sim) -> dict:
    """Part 1: CudaKernels forward and backward against NumPy; {case: error / bound}."""
    import numpy as np

    import kernels

    shapes = (
        [(1, 1, 1, "relu"), (5, 17, 3, "gelu"), (20, 6, 18, "tanh")]
        if sim
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
            assert all(u.dtype == dtype and u.shape == r.shape for u, r in zip(got, ref))
            key = f"{np.dtype(dtype).name} {m}x{k}x{n} {act}"
            worst[key] = error_over_bound(got, ref, scales, tol)
            print(f"check {key:<28} error / bound = {worst[key]:.3f} {verdict(worst[key])}", flush=True)
    return worst


def peer_error_over_bound(x, W, b, z, y) -> float:
    """The peer's float32 layer (z, y) against NumPy's: is the peer computing the same thing?"""
    import numpy as np

    import kernels

    ref = kernels.NumpyKernels.linear_act_forward(x, W, b, "gelu")
    s = np.abs(x) @ np.abs(W) + np.abs(b)
    return error_over_bound((z, y), ref, (s, 1.2 * s), 1e-5)


def run(args, cuda) -> int:
    import numpy as np

    from kernels import cuda as kc

    t_start = time.perf_counter()
    device = getattr(cuda.get_current_device(), "name", "CUDA simulator")
    device = device.decode() if isinstance(device, bytes) else str(device)
    print(f"device: {device}; numpy {np.__version__}; simulator: {args.sim}", flush=True)
    rng = np.random.default_rng(0)
    worst = check_kernels(kc, rng, args.sim)
    checks_ok = all(r <= 1 for r in worst.values())

    # -- 2. speed (float32, device arrays), 3. the cuBLAS peer on the same arrays ------------------
    cp, peer_note = (None, "cuBLAS peer: not run under the simulator") if args.sim else load_cupy()
    peer = CublasPeer(cp) if cp is not None else None
    peer_label = peer.label if peer is not None else None
    print(peer_note or f"cuBLAS peer: {peer_label}", flush=True)
    peer_error = None
    f32 = np.float32
    bias_act = kc.kernels_for(f32)["bias_act"]
    event_ms = lambda launch: median_event_ms(launch, cuda.event, lambda s, e: s.elapsed_time(e), args.repeat)
    speed = []
    for n in SIM_SIZES if args.sim else SIZES:
        host = [rng.standard_normal(shape).astype(f32) for shape in ((n, n), (n, n), (n,))]
        A, B, bias = (cuda.to_device(h) for h in host)
        Z, Y = cuda.device_array((n, n), f32), cuda.device_array((n, n), f32)
        grid, block = kc.grid_2d(n, n)
        ours = {
            "matmul": event_ms(lambda: kc.linear_device(A, B, Z=Z, Y=Z)),
            "fused": event_ms(lambda: kc.linear_device(A, B, bias=bias, act="gelu", Z=Z, Y=Y)),
            "unfused": event_ms(
                lambda: (kc.linear_device(A, B, Z=Z, Y=Z), bias_act[grid, block](Z, bias, kc.ACTS["gelu"], Y))
            ),
        }
        peer_ms = None
        if peer is not None:
            try:  # a broken CuPy install must not cost the simpar figures: say why and go on without it
                peer_ms, (z_peer, y_peer) = peer.measure(A, B, bias, args.repeat)
            except Exception as e:  # any CuPy/CUDA failure means the same thing here: no peer figure
                peer_note = f"cuBLAS peer: failed at n={n} ({type(e).__name__}: {first_line(e)})"
                print(peer_note + "; going on without it")
                peer = None
            if peer_error is None and peer_ms is not None:  # once, at the smallest n
                peer_error = peer_error_over_bound(*host, z_peer, y_peer)
                print(f"check cuBLAS peer n={n} gelu error / bound = {peer_error:.3f} {verdict(peer_error)}")
        row = speed_row(n, ours, peer_ms)
        speed.append(row)
        print("\n".join(speed_lines(row)), flush=True)

    checks_ok = checks_ok and (peer_error is None or peer_error <= 1)
    summary = {
        "device": device,
        "simulator": args.sim,
        "checks_ok": checks_ok,
        "worst_error_over_bound": max(worst.values()),
        "tile": kc.TILE,
        "dtype_speed": "float32",
        "peer": peer_label,
        "peer_note": peer_note,
        "peer_error_over_bound": peer_error,
        "speed": speed,
        "seconds": time.perf_counter() - t_start,
    }
    print(json.dumps(summary))
    return 0 if checks_ok else 1


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.sim:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"  # must happen before numba is imported
    sys.path.insert(0, str(ROOT))
    warnings.filterwarnings("ignore", message=".*under-utilization.*")  # tiny grids are the point of checks
    try:
        from numba import cuda
        from numba.cuda.cudadrv import error as numba_errors  # the simulator has its own, smaller module
    except ImportError as e:
        print(
            f"gpu_kernels: numba.cuda cannot be imported ({first_line(e)}): pip install numba-cuda",
            file=sys.stderr,
        )
        return 2
    reason = None if args.sim else no_gpu_reason(cuda)
    if reason:
        print(
            f"gpu_kernels: no CUDA GPU here (numba: {reason}); run with --sim for the simulator",
            file=sys.stderr,
        )
        return 2
    toolkit_missing = tuple(
        getattr(numba_errors, name)
        for name in ("CudaSupportError", "NvvmSupportError", "NvrtcSupportError")
        if hasattr(numba_errors, name)
    )
    try:
        return run(args, cuda)
    except toolkit_missing as e:  # a part of the CUDA toolkit numba needs is not installed
        print(f"gpu_kernels: numba cannot build CUDA kernels here ({first_line(e)})", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
