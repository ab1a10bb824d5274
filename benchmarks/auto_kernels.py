"""Should `--kernels auto` load Numba? What its kernels cost a process to load, what they save a step.

    python benchmarks/auto_kernels.py [--repeats 5] [--steps 3000]

For two tiny models at the sizes the old `auto` rule gave Numba (at most 16,384 multiply-adds a
kernel call, where one fused Numba call stands in for several NumPy ones): an MLP 8-32-32-4 on 16
rows, and a GPT of 2 blocks, h = 16, s = 8 on 2 sequences (16 token rows x 16 x 64), it runs
`python -m simpar train` on one rank with `--kernels numpy` and `--kernels numba` in turns,
`--repeats` times each, and reports medians of:

  start   the wall time of a whole 1-step run (Python, the imports, Numba's import and its kernels
          loaded from the on-disk cache, the step, the metrics file): what choosing Numba adds to
          every process of a job;
  step    the run's own median step over `--steps` steps (metrics' time.step_s_median).

and from them the steps after which Numba's saving a step repays its start: (start_numba -
start_numpy) / (step_numpy - step_numba), "never" where Numba's step is not faster. NumPy is the
peer measured in the same run. One compute thread per process. kernels.AUTO quotes runs of this.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from simpar.units import THREAD_VARS  # noqa: E402  (pure Python: NumPy is not loaded yet)

MODELS = {
    "MLP 8-32-32-4, 16 rows": ["--layers", "8,32,32,4", "--dataset", "synthetic", "--batch", "16"],
    "GPT 2 blocks, h 16, s 8, 2 sequences": [
        *("--arch", "gpt", "--n-layers", "2", "--hidden", "16", "--heads", "4", "--seq-len", "8"),
        *("--vocab", "16", "--dataset", "copy", "--samples", "64", "--batch", "2"),
    ],
}
BACKENDS = ("numpy", "numba")


def train(args: list[str], steps: int, backend: str, out: str) -> tuple[float, float]:
    """(wall seconds of the whole process, its median step) of one `simpar train` run."""
    env = {**os.environ, **dict.fromkeys(THREAD_VARS, "1")}
    cmd = [sys.executable, "-m", "simpar", "train", *args, "--steps", str(steps), "--quiet"]
    start = time.perf_counter()
    subprocess.run([*cmd, "--kernels", backend, "--metrics-out", out], check=True, env=env)
    wall = time.perf_counter() - start
    with open(out) as f:
        return wall, json.load(f)["time"]["step_s_median"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3000)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "m.json")
        for args in MODELS.values():  # compile and cache once, untimed
            train(args, 1, "numba", out)
        for name, args in MODELS.items():
            start = {b: [] for b in BACKENDS}
            step = {b: [] for b in BACKENDS}
            for i in range(opts.repeats):
                for backend in BACKENDS[:: 1 if i % 2 else -1]:  # in turns, so a slow spell hits both
                    start[backend].append(train(args, 1, backend, out)[0])
                    step[backend].append(train(args, opts.steps, backend, out)[1])
            s = {b: statistics.median(start[b]) for b in BACKENDS}
            t = {b: statistics.median(step[b]) for b in BACKENDS}
            saved = t["numpy"] - t["numba"]
            pays = f"after {(s['numba'] - s['numpy']) / saved:,.0f} steps" if saved > 0 else "never"
            print(
                f"{name}: start {s['numpy']:.2f} s numpy, {s['numba']:.2f} s numba "
                f"(+{s['numba'] - s['numpy']:.2f} s); step {t['numpy'] * 1e6:.1f} us numpy, "
                f"{t['numba'] * 1e6:.1f} us numba (numba / numpy {t['numba'] / t['numpy']:.3f}); "
                f"Numba repays its start {pays}"
            )


if __name__ == "__main__":
    main()
