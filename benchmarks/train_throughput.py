"""Training throughput: simpar data parallelism on 2 ranks vs PyTorch DDP (gloo, CPU), same MLP.

    python benchmarks/train_throughput.py [--ranks 2] [--steps 30] [--repeats 3] [--json]
    python benchmarks/train_throughput.py --layouts serial,dp,tp,pp     # every layout, same model


Same work on both sides: MLP 784-1024-1024-10, ReLU, float32, batch 256 per rank, plain SGD,
synthetic inputs, one compute thread per process. Reported: median samples/s over the timed steps
(after warm-up); `--repeats` runs of the whole set back to back (GEMM rate, simpar, PyTorch,
simpar on one rank with 256 rows, the gradient's ring all-reduce alone, GEMM rate again), reporting
medians of the per-repeat ratios simpar / PyTorch and simpar / limit, where the compute-bound
limit = ranks x (single-thread GEMM FLOP/s measured here) / (FLOPs per sample). The last lines
say what data parallelism adds (scaling against one rank alone) and the most a rank can reach
when it does its own reduction: its serial step plus the all-reduce alone. PyTorch is optional:
`pip install torch==2.13.0` (exactly that pin -- a looser one pulls a multi-GB CUDA build); without
it the torch line says so.

(Over 300 lines: one script whose measurements -- GEMM rate, simpar, PyTorch, the all-reduce
alone, --layouts -- are taken back to back on the same machine and reported as ratios of each other.)
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

from simpar.model.mlp import parameter_count  # noqa: E402

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


def simpar_rate(ranks: int, steps: int, kernels: str, layout: str = "dp", batch: int | None = None) -> float:
    """Median samples/s of `simpar train` on this model; `batch` (global) defaults to ranks x 256."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.dirname(here))
    from simpar.run.launch import run

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
                str(batch or PER_RANK_BATCH * ranks),
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


def ring_allreduce_alone(ranks: int) -> tuple[float, float]:
    """(seconds, memory-roofline seconds) of one ring all-reduce of the model's gradient, by itself:
    `simpar bench allreduce` on `ranks` ranks (median of its timed iterations)."""
    from simpar.run.launch import run

    size = 4 * parameter_count(LAYERS)  # float32 gradients
    res = run(ranks, ["bench", "allreduce", "--sizes", str(size), "--algorithms", "ring", "--json"])
    if res.returncode:
        raise SystemExit(res.stderr)
    ring = next(r for r in json.loads(res.stdout)["rows"] if r["algorithm"] == "ring")
    return ring["time_us"] / 1e6, ring["roofline_us"] / 1e6


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
    if args.steps < 5 or args.repeats < 1:
        ap.error("--steps must be at least 5 (the first 3 are warm-up) and --repeats at least 1")
    if args.layouts:
        return compare_layouts(args)

    # Each repeat is one set of measurements: the GEMM rate, simpar, PyTorch, ..., the GEMM rate again, back
    # to back. This VM's speed drifts by 10-25% over minutes, so a ratio is only honest between figures
    # taken together; the medians below are medians of per-repeat ratios, not ratios of medians.
    reps = []
    for _ in range(args.repeats):
        before = gemm_rate()
        simpar = simpar_rate(args.ranks, args.steps, args.kernels)
        torch = torch_rate(args.ranks, args.steps, args.torch_python)
        # What data parallelism adds: one rank alone on its 256 rows, and the gradient's all-reduce alone.
        serial = simpar_rate(args.ranks, args.steps, args.kernels, "serial", batch=PER_RANK_BATCH)
        allreduce_s, roofline_s = ring_allreduce_alone(args.ranks)
        gemm = (before + gemm_rate()) / 2
        limit = args.ranks * gemm / flops_per_sample()
        # A rank that does its own reduction cannot beat its serial step plus the all-reduce (its copies
        # and additions run on the same core as the GEMMs); the faster of measured and roofline, to be fair:
        bound_step = PER_RANK_BATCH / serial + min(allreduce_s, roofline_s)
        reps.append(
            {
                "simpar": simpar,
                "torch": torch,
                "gemm": gemm,
                "limit": limit,
                "serial_1rank": serial,
                "allreduce_s": allreduce_s,
                "allreduce_roofline_s": roofline_s,
                "bound": args.ranks * PER_RANK_BATCH / bound_step / limit,
            }
        )
    med = statistics.median
    have_torch = reps[0]["torch"] is not None
    simpar, limit = med(r["simpar"] for r in reps), med(r["limit"] for r in reps)
    torch = med(r["torch"] for r in reps) if have_torch else None
    vs_torch = [r["simpar"] / r["torch"] for r in reps] if have_torch else []
    of_limit = [r["simpar"] / r["limit"] for r in reps]
    serial_of_limit = [r["serial_1rank"] * args.ranks / r["limit"] for r in reps]
    scaling = [r["simpar"] / (r["serial_1rank"] * args.ranks) for r in reps]
    bounds = [r["bound"] for r in reps]
    result = {
        "ranks": args.ranks,
        "layers": LAYERS,
        "batch_per_rank": PER_RANK_BATCH,
        "kernels": args.kernels,
        "repeats": reps,
        "simpar_samples_per_s": simpar,
        "torch_ddp_samples_per_s": torch,
        "ratio_vs_torch": med(vs_torch) if vs_torch else None,
        "gemm_gflops_1thread": med(r["gemm"] for r in reps) / 1e9,
        "compute_bound_samples_per_s": limit,
        "fraction_of_compute_bound": med(of_limit),
        "serial_fraction_of_compute_bound": med(serial_of_limit),
        "scaling_vs_serial": med(scaling),
        "bound_with_reduction_on_core": med(bounds),
        "allreduce_ms": med(r["allreduce_s"] for r in reps) * 1e3,
        "allreduce_roofline_ms": med(r["allreduce_roofline_s"] for r in reps) * 1e3,
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"MLP {'-'.join(map(str, LAYERS))}, float32, batch {PER_RANK_BATCH}/rank, {args.ranks} ranks, "
        f"1 thread each; {args.repeats} repeats of (GEMM rate, simpar, PyTorch, serial, all-reduce, "
        "GEMM rate), "
        f"each the median of {args.steps} steps; figures are medians over the repeats"
    )
    print(f"  simpar data parallel ({args.kernels:>5}) : {simpar:9.0f} samples/s")
    if have_torch:
        print(
            f"  PyTorch DDP (gloo)            : {torch:9.0f} samples/s   simpar/torch = "
            f"{med(vs_torch):.2f}x (per repeat: {_list(vs_torch, '.2f', 'x')})"
        )
    else:
        print("  PyTorch DDP                   : torch is not installed (pip install torch==2.13.0)")
    print(
        f"  compute-bound limit           : {limit:9.0f} samples/s   "
        f"({args.ranks} x {result['gemm_gflops_1thread']:.1f} GFLOP/s / "
        f"{flops_per_sample() / 1e6:.2f} MFLOP per sample); simpar reaches {med(of_limit):.0%} "
        f"(per repeat: {_list(of_limit, '.0%')})"
    )
    print(
        f"  one rank alone, {PER_RANK_BATCH} rows      : {med(serial_of_limit):.0%} of one rank's limit; "
        f"{args.ranks} ranks reach {med(scaling):.0%} of {args.ranks} x that ({_list(scaling, '.0%')})"
    )
    print(
        f"  gradient all-reduce alone     : ring {result['allreduce_ms']:.2f} ms for "
        f"{4 * parameter_count(LAYERS) / 1e6:.2f} MB "
        f"(memory roofline {result['allreduce_roofline_ms']:.2f} ms)"
    )
    print(
        f"  bound, reduction on the cores : {med(bounds):.0%} of the limit: one rank's serial step + the "
        f"all-reduce alone ({_list(bounds, '.0%')})"
    )
    return 0


def _list(values, fmt: str, unit: str = "") -> str:
    return ", ".join(f"{v:{fmt}}{unit}" for v in values)


def compare_layouts(args) -> int:
    """Every layout once per repeat, with the GEMM rate before and after, so each layout's fraction of
    its limit and its speed-up over serial are ratios of figures taken minutes apart at most."""
    layouts = args.layouts.split(",")
    for layout in layouts:
        if layout not in LAYOUTS:
            known = ", ".join(LAYOUTS)
            raise SystemExit(f"train_throughput: unknown layout {layout!r} (choose from {known})")
    reps = []
    for _ in range(args.repeats):
        before = gemm_rate()
        rates = {a: simpar_rate(args.ranks, args.steps, args.kernels, a) for a in layouts}
        reps.append((rates, (before + gemm_rate()) / 2))
    med = statistics.median
    rows = []
    for a in layouts:
        fractions = [rates[a] / layout_limit(a, args.ranks, gemm) for rates, gemm in reps]
        speedups = [rates[a] / rates["serial"] for rates, _ in reps] if "serial" in layouts else []
        rows.append((a, med(rates[a] for rates, _ in reps), med(fractions), fractions, speedups))
    gemm = med(g for _, g in reps)
    if args.json:
        print(
            json.dumps(
                [
                    {"layout": a, "samples_per_s": r, "fraction_of_compute_bound": f, "vs_serial": s}
                    for a, r, f, _, s in rows
                ]
            )
        )
        return 0
    print(
        f"MLP {'-'.join(map(str, LAYERS))}, float32, global batch {PER_RANK_BATCH * args.ranks}, "
        f"{args.kernels} kernels; {args.repeats} repeats of every layout in turn, each the median of "
        f"{args.steps} steps; medians over the repeats; GEMM {gemm / 1e9:.1f} GFLOP/s on one thread"
    )
    for layout, rate, fraction, fractions, speedups in rows:
        ranks = 1 if layout == "serial" else args.ranks
        vs = f"   {med(speedups):4.2f}x serial ({_list(speedups, '.2f', 'x')})" if speedups else ""
        if layout == "serial":
            vs = ""
        print(
            f"  {layout:>6} on {ranks} rank(s): {rate:8.0f} samples/s = {fraction:4.0%} of its "
            f"compute-bound limit ({_list(fractions, '.0%')}){vs}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
