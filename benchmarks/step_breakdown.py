"""Where one serial step's wall-clock time goes, call by call, beside what the cost model charges.

    python benchmarks/step_breakdown.py [--kernels numpy|numba] [--rows 512] [--steps 30] [--optimizer adam]

Runs the serial step of benchmarks/predict_vs_measure.py (MLP 784-1024-1024-10, float32, SGD with
momentum or Adam, lazy zero_grad, as parallel/data.py does it) through simpar's own functions, with the
simulated clock installed on a profile measured in this process just before (bench/calibrate.py's
GEMM rate, numpy.add speed, per-layer call overhead). The simulated clock charges each call exactly
what the cost model predicts for it (tests/mpi/runtime/test_simclock.py holds the two together), so each row
sets a call's wall time beside the model's charge for it: where a row's gap is large, the model
misses work there. `data` is the batch gather (x[rows]) and `rest` the step's wall time outside the
timed calls (Python between them); the model charges neither. Medians over `--steps` after 5 warm-up
steps; the GEMM rate is measured again after the steps, to show how far it drifted meanwhile.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from simpar.units import THREAD_VARS  # noqa: E402  (pure Python: NumPy is not loaded yet)

for _v in THREAD_VARS:  # one compute thread, before NumPy starts its pool
    os.environ[_v] = "1"

import numpy as np  # noqa: E402

import kernels  # noqa: E402
from simpar.bench.calibrate import measure_gamma, measure_gemm, measure_layer_overhead  # noqa: E402
from simpar.model import mlp as model  # noqa: E402
from simpar.model.optim import SGD, Adam  # noqa: E402
from simpar.runtime import simclock  # noqa: E402
from simpar.runtime.context import Runtime  # noqa: E402

WARMUP = 5


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kernels", default="numpy", choices=("numpy", "numba"))
    p.add_argument("--rows", type=int, default=512)
    p.add_argument("--layers", default="784,1024,1024,10")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--optimizer", default="sgd", choices=("sgd", "adam"), help="sgd: with momentum 0.9")
    args = p.parse_args()
    widths = [int(w) for w in args.layers.split(",")]

    rate = measure_gemm("float32")
    profile = simclock.Profile(
        name="this process",
        flop_rate=rate,
        gamma=measure_gamma(),
        layer_overhead=measure_layer_overhead(),
        compute_share=1.0,
        links={},
    )
    clock = simclock.SimClock(profile)
    rt = Runtime(clock=clock, kernels=kernels.load(args.kernels))  # what a run hands its layers

    wall: dict = collections.defaultdict(list)  # call -> wall seconds per step
    charged: dict = collections.defaultdict(list)  # call -> simulated seconds per step

    def timed(name: str, fn):
        def call(*a, **k):
            t0, c0 = time.perf_counter(), clock.now
            out = fn(*a, **k)
            wall[name(*a) if callable(name) else name].append(time.perf_counter() - t0)
            charged[name(*a) if callable(name) else name].append(clock.now - c0)
            return out

        return call

    model.layer_forward = timed(lambda layer, *_: f"forward {layer.index}", model.layer_forward)
    model.layer_backward = timed(lambda layer, *_: f"backward {layer.index}", model.layer_backward)
    model.softmax_cross_entropy = timed("loss", model.softmax_cross_entropy)

    store = model.serial_store(widths, "relu", 0, np.float32, rt=rt)
    optimizer = SGD(1e-4, 0.9, rt) if args.optimizer == "sgd" else Adam(1e-4, rt=rt)
    optimizer.step = timed("optimizer", optimizer.step)
    rng = np.random.default_rng(1)
    data_x = rng.standard_normal((8 * args.rows, widths[0])).astype(np.float32)
    data_y = rng.integers(0, widths[-1], 8 * args.rows)
    gather = timed("data", lambda rows: (data_x[rows], data_y[rows]))
    for _ in range(WARMUP + args.steps):
        start = time.perf_counter()
        x, y = gather(rng.choice(len(data_x), args.rows, replace=False))
        store.zero_grad(lazy=True)
        model.forward_backward(store, x, y, args.rows)
        store.settle()
        optimizer.step([store.params], [store.grads])
        wall["step"].append(time.perf_counter() - start)
    after = measure_gemm("float32")

    def med(xs):
        return statistics.median(xs[WARMUP:]) * 1e3

    names = [n for n in wall if n != "step"]
    rest = med(wall["step"]) - sum(med(wall[n]) for n in names)
    print(
        f"serial step, MLP {args.layers} float32, {args.rows} rows, {args.kernels} kernels, "
        f"{args.optimizer}; GEMM "
        f"{rate / 1e9:.1f} GFLOP/s before, {after / 1e9:.1f} after; numpy.add "
        f"{3 / profile.gamma / 1e9:.1f} GB/s moved; layer overhead {profile.layer_overhead * 1e6:.1f} us"
    )
    print(f"{'call':<12} {'wall ms':>9} {'model ms':>9} {'gap ms':>8}")
    for n in names + ["rest"]:
        w, c = (rest, 0.0) if n == "rest" else (med(wall[n]), med(charged.get(n, [0.0] * len(wall[n]))))
        print(f"{n:<12} {w:>9.3f} {c:>9.3f} {w - c:>+8.3f}")
    total_c = sum(med(charged.get(n, [0.0] * len(wall[n]))) for n in names)
    print(f"{'step':<12} {med(wall['step']):>9.3f} {total_c:>9.3f} {med(wall['step']) - total_c:>+8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
