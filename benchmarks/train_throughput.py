"""Training throughput: simpar data parallelism on 2 ranks vs PyTorch DDP (gloo, CPU), same MLP.

    python benchmarks/train_throughput.py [--ranks 2] [--steps 30] [--repeats 3] [--json]
    python benchmarks/train_throughput.py --layouts serial,dp,tp,pp     # every layout, same model


Same work on both sides: MLP 784-1024-1024-10, ReLU, float32, batch 256 per rank, plain SGD,
synthetic inputs, one compute thread per process. Reported: median samples/s over the timed steps
(after warm-up) of the median of `--repeats` runs, the ratio simpar / PyTorch, and the
compute-bound limit = ranks x (single-thread GEMM FLOP/s measured here) / (FLOPs per sample),
with the fraction of it that simpar reaches. PyTorch is optional: `pip install torch==2.13.0`
(exactly that pin -- a looser one pulls a multi-GB CUDA build); without it the torch column says so.
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

for _v in THREAD_VARS:  # one compute thread per process, before NumPy starts its pool
    os.environ[_v] = "1"

import numpy as np  # noqa: E402

LAYERS = [784, 1024, 1024, 10]
PER_RANK_BATCH = 256


def flops_per_sample(layers=LAYERS) -> int:
    """Forward 2*in*out per layer; backward 2*in*out for dW and, except the first layer, 2*in*out for dx."""
    total = 0
    for i, (a, b) in enumerate(zip(layers[:-1], layers[1:])):
        total += 2 * a * b * (3 if i > 0 else 2)
    return total


def gemm_rate(n: int = 1024, repeats: int = 5) -> float:
    a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    b = a.copy()
    a @ b
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    return 2 * n**3 / statistics.median(times)


# --layouts: the same model and global batch (ranks x 256) on one rank and on `ranks` ranks split three ways.
LAYOUTS = {
    "serial": [],
    "dp": [],  # --dp is the default: all ranks
    "tp": ["--tp", "{ranks}"],
    "pp": ["--pp", "{ranks}", "--microbatches", "8", "--schedule", "1f1b"],
}
PP_MICROBATCHES = 8


def layout_limit(layout: str, ranks: int, gemm: float) -> float:
    """Compute-bound samples/s of a layout: its ranks x the single-thread GEMM rate / FLOPs per sample,
    times (1 - bubble) for the pipeline ((S-1)/(M+S-1) of 1F1B's step is idle, Narayanan et al. 2021)."""
    if layout == "serial":
        return gemm / flops_per_sample()
    limit = ranks * gemm / flops_per_sample()
    if layout == "pp":
        limit *= 1 - (ranks - 1) / (PP_MICROBATCHES + ranks - 1)
    return limit


def simpar_rate(ranks: int, steps: int, kernels: str, layout: str = "dp") -> float:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.dirname(here))
    from simpar.launch import run

    world = 1 if layout == "serial" else ranks
    extra = [a.format(ranks=ranks) for a in LAYOUTS[layout]]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "m.json")
        res = run(
            world,
            [
                "train",
                *extra,
                "--dataset",
                "synthetic",
                "--samples",
                str(PER_RANK_BATCH * ranks * 4 + 100),
                "--layers",
                ",".join(map(str, LAYERS)),
                "--batch",
                str(PER_RANK_BATCH * ranks),
                "--steps",
                str(steps),
                "--optimizer",
                "sgd",
                "--momentum",
                "0",
                "--lr",
                "0.01",
                "--dtype",
                "float32",
                "--kernels",
                kernels,
                "--quiet",
                "--metrics-out",
                out,
            ],
            timeout=600,
        )
        if res.returncode:
            raise SystemExit(res.stderr)
        with open(out) as f:
            return json.load(f)["time"]["samples_per_s_median"]


TORCH_WORKER = r"""
import os, sys, time, statistics
import torch, torch.distributed as dist
torch.set_num_threads(1)
rank, world, steps, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
torch.manual_seed(0)
layers = [784, 1024, 1024, 10]
mods = []
for i, (a, b) in enumerate(zip(layers[:-1], layers[1:])):
    mods.append(torch.nn.Linear(a, b))
    if i < len(layers) - 2:
        mods.append(torch.nn.ReLU())
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*mods))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(256, 784); y = torch.randint(0, 10, (256,))
loss_fn = torch.nn.CrossEntropyLoss()
times = []
for step in range(steps):
    t = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss_fn(model(x), y).backward()
    opt.step()
    times.append(time.perf_counter() - t)
if rank == 0:
    print(256 * world / statistics.median(times[3:]))
dist.destroy_process_group()
"""


def torch_rate(ranks: int, steps: int, python: str) -> float | None:
    check = subprocess.run([python, "-c", "import torch"], capture_output=True)
    if check.returncode:
        return None
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = dict(os.environ)
    procs = [
        subprocess.Popen(
            [python, "-c", TORCH_WORKER, str(r), str(ranks), str(steps), port],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for r in range(ranks)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("torch worker failed:\n" + "\n".join(o[1][-2000:] for o in outs))
    return float(outs[0][0].strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kernels", default="numpy", help="simpar kernels: numpy | numba | auto")
    ap.add_argument(
        "--torch-python",
        default=sys.executable,
        help="interpreter that has torch (e.g. another venv's python)",
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--layouts",
        default=None,
        help="comma list of serial,dp,tp,pp: samples/s of each on the same model and global batch, "
        "with each one's compute-bound limit (no PyTorch run)",
    )
    args = ap.parse_args(argv)
    if args.layouts:
        return compare_layouts(args)

    simpar = statistics.median(simpar_rate(args.ranks, args.steps, args.kernels) for _ in range(args.repeats))
    torch_runs = [torch_rate(args.ranks, args.steps, args.torch_python) for _ in range(args.repeats)]
    torch = None if torch_runs[0] is None else statistics.median(torch_runs)
    gemm = gemm_rate()
    limit = args.ranks * gemm / flops_per_sample()
    result = {
        "ranks": args.ranks,
        "layers": LAYERS,
        "batch_per_rank": PER_RANK_BATCH,
        "kernels": args.kernels,
        "simpar_samples_per_s": simpar,
        "torch_ddp_samples_per_s": torch,
        "ratio_vs_torch": simpar / torch if torch else None,
        "gemm_gflops_1thread": gemm / 1e9,
        "compute_bound_samples_per_s": limit,
        "fraction_of_compute_bound": simpar / limit,
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"MLP {'-'.join(map(str, LAYERS))}, float32, batch {PER_RANK_BATCH}/rank, {args.ranks} ranks, "
        f"1 thread each, median of {args.repeats} runs x {args.steps} steps"
    )
    print(f"  simpar data parallel ({args.kernels:>5}) : {simpar:9.0f} samples/s")
    if torch:
        print(
            f"  PyTorch DDP (gloo)            : {torch:9.0f} samples/s   "
            f"ratio simpar/torch = {simpar / torch:.2f}x"
        )
    else:
        print("  PyTorch DDP                   : torch is not installed (pip install torch==2.13.0)")
    print(
        f"  compute-bound limit           : {limit:9.0f} samples/s   "
        f"({args.ranks} x {gemm / 1e9:.1f} GFLOP/s / "
        f"{flops_per_sample() / 1e6:.2f} MFLOP per sample); simpar reaches {simpar / limit:.0%}"
    )
    return 0


def compare_layouts(args) -> int:
    gemm = gemm_rate()
    rows = []
    for layout in args.layouts.split(","):
        if layout not in LAYOUTS:
            known = ", ".join(LAYOUTS)
            raise SystemExit(f"train_throughput: unknown layout {layout!r} (choose from {known})")
        rate = statistics.median(
            simpar_rate(args.ranks, args.steps, args.kernels, layout) for _ in range(args.repeats)
        )
        rows.append((layout, rate, layout_limit(layout, args.ranks, gemm)))
    if args.json:
        print(json.dumps([{"layout": a, "samples_per_s": r, "compute_bound": lim} for a, r, lim in rows]))
        return 0
    print(
        f"MLP {'-'.join(map(str, LAYERS))}, float32, global batch {PER_RANK_BATCH * args.ranks}, "
        f"{args.kernels} kernels, median of {args.repeats} runs x {args.steps} steps; "
        f"GEMM {gemm / 1e9:.1f} GFLOP/s on one thread"
    )
    serial = dict((a, r) for a, r, _ in rows).get("serial")
    for layout, rate, limit in rows:
        ranks = 1 if layout == "serial" else args.ranks
        vs = f"   {rate / serial:4.2f}x serial" if serial and layout != "serial" else ""
        print(
            f"  {layout:>6} on {ranks} rank(s): {rate:8.0f} samples/s = {rate / limit:4.0%} of its "
            f"compute-bound limit {limit:8.0f}{vs}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
