"""Predicted vs measured step time on THIS machine, for every layout the tour runs.

    python benchmarks/predict_vs_measure.py [--repeats 3] [--steps 12] [--json]

Each repeat first runs `simpar bench --calibrate` (GEMM rate, memory speed, MPI ping-pong, per-layer
call overhead) into a temporary `local`-style profile, then trains every layout for real
(784-1024-1024-10 MLP, float32, global batch 512, synthetic data) on the wall clock and pairs each
run's median step (warm-up left out) with the cost model's `predicted.time.step_s` on that repeat's
profile. Calibrating per repeat compares like with like: this machine's GEMM rate drifts by 10-25%
over minutes, so a profile measured once and used for runs minutes later mostly measures the drift.
The table gives the medians over repeats of the measured step, the prediction and the error. Layouts whose
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
    p.add_argument("--layouts", default="", help="comma-separated names (default: all)")
    p.add_argument("--kernels", default="numpy", choices=("numpy", "numba"))
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    cores = os.cpu_count() or 1
    wanted = [x for x in args.layouts.split(",") if x]
    layouts = [lay for lay in LAYOUTS if not wanted or lay[0] in wanted]
    runs: dict = {name: [] for name, _, _ in layouts}  # name -> [(measured, predicted)] per repeat
    with tempfile.TemporaryDirectory() as tmp:
        hw = os.path.join(tmp, "hw.json")
        for _ in range(args.repeats):
            calibrate(hw)  # again each repeat: the runs that follow see the same machine
            for name, ranks, extra in layouts:
                runs[name].append(measure(ranks, [*extra, "--kernels", args.kernels], hw, args.steps))
    rows = []
    for name, ranks, _ in layouts:
        rows.append(
            {
                "layout": name,
                "ranks": ranks,
                "oversubscribed": ranks > cores,
                "measured_s": statistics.median(m for m, _ in runs[name]),
                "predicted_s": statistics.median(q for _, q in runs[name]),
                "error": statistics.median(q / m - 1 for m, q in runs[name]),
                "errors": [q / m - 1 for m, q in runs[name]],
            }
        )
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(
        f"predicted vs measured step, {cores} cores, MLP 784-1024-1024-10 float32 batch 512, "
        f"median of {args.repeats} runs x {args.steps} steps, {args.kernels} kernels, calibrated per run"
    )
    print(f"{'layout':<12} {'ranks':>5} {'measured ms':>12} {'predicted ms':>13} {'error':>8}  per run")
    for r in rows:
        flag = "  (ranks share cores)" if r["oversubscribed"] else ""
        ms = f"{1e3 * r['measured_s']:>12.2f} {1e3 * r['predicted_s']:>13.2f}"
        each = " ".join(f"{e:+.0%}" for e in r["errors"])
        print(f"{r['layout']:<12} {r['ranks']:>5} {ms} {r['error']:>+8.1%}  {each}{flag}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
