"""What each change to the training step's hot path buys, measured in pairs in one process.

    python benchmarks/hot_path.py [--pairs 40] [--rows 256] [--layers 784,1024,1024,10]

One rank's training step of the data-parallel benchmark (benchmarks/train_throughput.py: MLP
784-1024-1024-10, float32, 256 rows, plain SGD, one thread), run through simpar's own functions
(model.forward_backward, the kernels' sgd_update). For each
change, the step without it and the step with it take turns, `--pairs` times after a warm-up, so a
slow spell of this shared machine hits both alike; reported are the median step of each and the
median of the per-pair differences (what the change saves), in ms and as a share of the step:

  lazy zero_grad   fill(0) + "dW += x.T @ dz"  vs  the first backward writing dW straight into
                   the flat gradient buffer (model.ParamStore.zero_grad(lazy=True))
  fused optimizer  NumPy's "w -= lr * g" (a temporary)  vs  one Numba sweep (kernels/cpu_optim.py _sgd)
  fused layers     kernels "numpy" (NumPy's unfused bias, activation and their backward)  vs
                   "numba" (one sweep epilogue after each BLAS GEMM)

Each row measures one change with the other two in their current state (lazy, fused, numba).
"""

from __future__ import annotations

import argparse
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
from simpar.model import mlp as model  # noqa: E402
from simpar.runtime.context import Runtime  # noqa: E402


def make_step(widths: list[int], rows: int):
    """A closure running one SGD step on fixed data; its options say which variant runs."""
    store = model.serial_store(widths, "relu", seed=0, dtype=np.float32)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((rows, widths[0])).astype(np.float32)
    y = rng.integers(0, widths[-1], rows)
    lr = np.float32(1e-4)  # small: the weights barely move, so every pair does the same work
    fused_sgd = kernels.load("numba").sgd_update

    def step(lazy: bool = True, fused_optimizer: bool = True, backend: str = "numba") -> None:
        for layer in store.layers:  # the layers' kernels (a run hands them its runtime's)
            layer.rt = Runtime(kernels=kernels.load(backend))
        store.zero_grad(lazy=lazy)
        model.forward_backward(store, x, y, rows)
        store.settle()
        # The optimizer is chosen on its own, whatever the layers' backend, so each row changes one thing.
        update = fused_sgd if fused_optimizer else kernels.NumpyKernels.sgd_update
        update(store.params, store.grads, None, lr, 0.0)

    return step


def paired(step, before: dict, after: dict, pairs: int) -> tuple[float, float, float]:
    """(median step before, median step after, median of per-pair savings), seconds."""
    for _ in range(3):  # warm-up: Numba loads its cache, NumPy and glibc settle their buffers
        step(**before)
        step(**after)
    t_before, t_after = [], []
    for i in range(pairs):
        for options, times in ((before, t_before), (after, t_after))[:: 1 if i % 2 else -1]:
            t = time.perf_counter()
            step(**options)
            times.append(time.perf_counter() - t)
    saved = [b - a for b, a in zip(t_before, t_after)]
    return statistics.median(t_before), statistics.median(t_after), statistics.median(saved)


CHANGES = [
    ("lazy zero_grad", {"lazy": False}, {"lazy": True}),
    ("fused optimizer", {"fused_optimizer": False}, {"fused_optimizer": True}),
    ("fused layers", {"backend": "numpy"}, {"backend": "numba"}),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--layers", default="784,1024,1024,10")
    args = ap.parse_args(argv)
    try:
        kernels.load("numba")
    except ImportError as exc:
        raise SystemExit(f"hot_path: the numba kernels cannot load ({exc}); pip install numba") from None
    widths = [int(w) for w in args.layers.split(",")]
    step = make_step(widths, args.rows)
    print(
        f"one rank's SGD step, MLP {'-'.join(map(str, widths))}, float32, {args.rows} rows, 1 thread; "
        f"{args.pairs} pairs in turn, medians"
    )
    for name, before, after in CHANGES:
        t_before, t_after, saved = paired(step, before, after, args.pairs)
        print(
            f"  {name:<16} step {t_before * 1e3:6.2f} -> {t_after * 1e3:6.2f} ms; "
            f"saves {saved * 1e3:5.2f} ms per step = {saved / t_before:5.1%} (median of the pairs)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
