"""Predicted vs measured step time on THIS machine, for every layout the tour runs.

    python benchmarks/predict_vs_measure.py [--repeats 3] [--steps 12] [--layouts serial,dp2,...]
        [--kernels numpy|numba] [--baseline ../other-checkout] [--json]

Before every run, `simpar bench --calibrate` (GEMM rate, memory speed, the link, per-layer call
overhead; ~4 s) writes a temporary `local`-style profile; then the layout trains for real
(784-1024-1024-10 MLP, float32, global batch 512, synthetic data) on the wall clock, and its median
step (warm-up left out) is paired with the cost model's `predicted.time.step_s` on that profile.
Calibrating right before each run compares like with like: this machine's GEMM rate drifts by
10-25% over minutes, so a profile measured once and used for runs minutes later mostly measures
the drift. The table gives the medians over `--repeats` of the measured step, the prediction and
the error, and each run's error. Layouts whose
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

from simpar.run.launch import mpiexec_path  # noqa: E402
from simpar.units import one_thread_env  # noqa: E402

ROOT = os.path.dirname(HERE)

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


def env_for(root: str) -> dict:
    """One compute thread per rank, and `root`'s simpar (this checkout, or --baseline's)."""
    env = one_thread_env(dict(os.environ))
    env["PYTHONPATH"] = root
    return env


def calibrate(path: str, root: str) -> None:
    cmd = [sys.executable, "-m", "simpar", "bench", "--calibrate", "-o", path]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env_for(root), timeout=120, cwd=root)
    if res.returncode:
        raise SystemExit(f"calibration failed: {res.stderr.strip()}")


def measure(ranks: int, args: list[str], hw: str, steps: int, root: str) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "m.json")
        train = [*MODEL, *args, "--steps", str(steps), "--hardware", hw, "--quiet", "--metrics-out", out]
        cmd = [
            mpiexec_path(),
            "-n",
            str(ranks),
            sys.executable,
            "-m",
            "mpi4py",
            "-m",
            "simpar",
            "train",
            *train,
        ]
        res = subprocess.run(cmd, capture_output=True, text=True, env=env_for(root), timeout=600, cwd=root)
        if res.returncode:
            raise SystemExit(res.stderr)
        with open(out) as f:
            m = json.load(f)
    return m["time"]["step_s_median"], m["predicted"]["time"]["step_s"]


def summary(pairs: list) -> dict:
    """Medians over repeats of the measured step, the prediction and the error; each run's error."""
    errors = [q / m - 1 for m, q in pairs]
    return {
        "measured_s": statistics.median(m for m, _ in pairs),
        "predicted_s": statistics.median(q for _, q in pairs),
        "error": statistics.median(errors),
        "errors": errors,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--layouts", default="", help="comma-separated names (default: all)")
    p.add_argument("--kernels", default="numpy", choices=("numpy", "numba"))
    p.add_argument(
        "--baseline",
        help="another simpar checkout: each of its runs (calibrated, then trained "
        "with its own code) goes right before the same run of this one, for a paired before/after",
    )
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    cores = os.cpu_count() or 1
    wanted = [x for x in args.layouts.split(",") if x]
    layouts = [lay for lay in LAYOUTS if not wanted or lay[0] in wanted]
    roots = {"baseline": os.path.abspath(args.baseline)} if args.baseline else {}
    roots["this"] = ROOT
    runs: dict = {(who, lay[0]): [] for who in roots for lay in layouts}  # -> [(measured, predicted)]
    with tempfile.TemporaryDirectory() as tmp:
        hw = os.path.join(tmp, "hw.json")
        for _ in range(args.repeats):
            for name, ranks, extra in layouts:
                for who, root in roots.items():
                    calibrate(hw, root)  # again before every run: the run that follows sees the same machine
                    pair = measure(ranks, [*extra, "--kernels", args.kernels], hw, args.steps, root)
                    runs[(who, name)].append(pair)
    rows = []
    for name, ranks, _ in layouts:
        row = {
            "layout": name,
            "ranks": ranks,
            "oversubscribed": ranks > cores,
            **summary(runs[("this", name)]),
        }
        if args.baseline:
            row["baseline"] = summary(runs[("baseline", name)])
        rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(
        f"predicted vs measured step, {cores} cores, MLP 784-1024-1024-10 float32 batch 512, "
        f"median of {args.repeats} runs x {args.steps} steps, {args.kernels} kernels, calibrated per run"
    )
    base = f" {'baseline error':>15}" if args.baseline else ""
    print(f"{'layout':<12} {'ranks':>5} {'measured ms':>12} {'predicted ms':>13} {'error':>8}{base}  per run")
    for r in rows:
        flag = "  (ranks share cores)" if r["oversubscribed"] else ""
        ms = f"{1e3 * r['measured_s']:>12.2f} {1e3 * r['predicted_s']:>13.2f}"
        each = " ".join(f"{e:+.0%}" for e in r["errors"])
        if args.baseline:
            b = r["baseline"]
            each += "  (baseline " + " ".join(f"{e:+.0%}" for e in b["errors"]) + ")"
            ms += f" {r['error']:>+8.1%} {b['error']:>+15.1%}"
        else:
            ms += f" {r['error']:>+8.1%}"
        print(f"{r['layout']:<12} {r['ranks']:>5} {ms}  {each}{flag}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
