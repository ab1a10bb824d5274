"""Predicted vs measured step time on THIS machine, for every layout the tour runs.

    python benchmarks/predict_vs_measure.py [--repeats 3] [--steps 12] [--json]

First `simpar bench --calibrate` measures this machine (GEMM rate, memory speed, MPI ping-pong,
per-layer call overhead) into a temporary `local`-style profile; then each layout trains for real
(784-1024-1024-10 MLP, float32, global batch 512, synthetic data) on the wall clock, `--repeats`
times; the measured figure is the median over repeats of each run's median step (warm-up left out).
The prediction is the cost model's `predicted.time.step_s` on the calibrated profile. Layouts whose
world fits the cores (no oversubscription) come first; the oversubscribed ones (4 ranks here) are
reported too -- the profile models their shared cores as cores/ranks of a core each.

Goal: within 10% where ranks do not share cores. Where they miss, the table says by how much.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from simpar.launch import _env, run  # noqa: E402

MODEL = [
    "--dataset",
    "synthetic",
    "--samples",
    "4096",
    "--layers",
    "784,1024,1024,10",
    "--batch",
    "512",
    "--dtype",
    "float32",
    "--kernels",
    "numpy",
]
LAYOUTS = [
    ("serial", 1, []),
    ("dp2", 2, ["--dp", "2"]),
    ("dp2-zero1", 2, ["--dp", "2", "--zero", "1"]),
    ("dp2-zero2", 2, ["--dp", "2", "--zero", "2"]),
    ("dp2-zero3", 2, ["--dp", "2", "--zero", "3"]),
    ("tp2", 2, ["--tp", "2"]),
    ("pp2-gpipe", 2, ["--pp", "2", "--schedule", "gpipe"]),
    ("pp2-1f1b", 2, ["--pp", "2", "--schedule", "1f1b"]),
    ("dp4", 4, ["--dp", "4"]),
    ("tp4", 4, ["--tp", "4"]),
    ("dp2xpp2", 4, ["--dp", "2", "--pp", "2"]),
]


def calibrate(path: str) -> None:
    cmd = [sys.executable, "-m", "simpar", "bench", "--calibrate", "-o", path]
    res = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=120)
    if res.returncode:
        raise SystemExit(f"calibration failed: {res.stderr.strip()}")


def measure(ranks: int, args: list[str], hw: str, steps: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "m.json")
        res = run(
            ranks,
            [
                "train",
                *MODEL,
                *args,
                "--steps",
                str(steps),
                "--hardware",
                hw,
                "--quiet",
                "--metrics-out",
                out,
            ],
            timeout=600,
        )
        if res.returncode:
            raise SystemExit(res.stderr)
        with open(out) as f:
            m = json.load(f)
    return m["time"]["step_s_median"], m["predicted"]["time"]["step_s"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    cores = os.cpu_count() or 1
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        hw = os.path.join(tmp, "hw.json")
        calibrate(hw)
        for name, ranks, extra in LAYOUTS:
            runs = [measure(ranks, extra, hw, args.steps) for _ in range(args.repeats)]
            measured = statistics.median(r[0] for r in runs)
            predicted = runs[0][1]
            rows.append(
                {
                    "layout": name,
                    "ranks": ranks,
                    "oversubscribed": ranks > cores,
                    "measured_s": measured,
                    "predicted_s": predicted,
                    "error": predicted / measured - 1,
                }
            )
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(
        f"predicted vs measured step, {cores} cores, MLP 784-1024-1024-10 float32 batch 512, "
        f"median of {args.repeats} runs x {args.steps} steps, calibrated profile"
    )
    print(f"{'layout':<12} {'ranks':>5} {'measured ms':>12} {'predicted ms':>13} {'error':>8}")
    for r in rows:
        flag = "  (ranks share cores)" if r["oversubscribed"] else ""
        ms = f"{1e3 * r['measured_s']:>12.2f} {1e3 * r['predicted_s']:>13.2f}"
        print(f"{r['layout']:<12} {r['ranks']:>5} {ms} {r['error']:>+8.1%}{flag}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
