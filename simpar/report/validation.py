"""`simpar validate`: each published measurement in validation/ against what the cost model predicts.

A point (one CSV row, validation/README.md lists the columns) says what was measured -- a collective of
`size_bytes` on `gpus` GPUs over `nodes` nodes, a GEMM of m x n x k, memory bandwidth, a kernel
launch, a whole GPT training step (`gpt-step`) -- on which hardware, under which profile of ours, and
what the source printed. The prediction is the cost model's closed form for that one operation
(costmodel/nccl.py on the profile's numbers; a training step: `plan --arch gpt`, validation_gpt.py),
in the source's own unit; ratio = predicted / published. A point passes within its tolerance (20%
unless the CSV gives another, with its reason in `how`).
"""

from __future__ import annotations

import csv
import io
import os
import statistics

from ..costmodel import gpus, hardware, nccl
from ..errors import SimparError
from . import validation_gpt

REQUIRED = ("id", "quantity", "op", "profile", "value", "unit", "source_url")
TOLERANCE = 0.20
PRECISION = {
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "tf32": "tf32",
    "fp16": "mixed",
    "bf16": "mixed",
    "half": "mixed",
    "bfloat16": "mixed",
    "fp64": "fp64",
    "double": "fp64",
}
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv")
UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "GB/s": 1e9, "TFLOP/s": 1e12}


def default_files() -> list[str]:
    """validation/*.csv at the repository root (next to the simpar package)."""
    root = os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "validation"
    )
    return (
        sorted(os.path.join(root, f) for f in os.listdir(root) if f.endswith(".csv"))
        if os.path.isdir(root)
        else []
    )


def read_text(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError as exc:
        raise SimparError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


def read_points(path: str) -> list[dict]:
    """The rows of one validation CSV, checked: the columns, numbers that are numbers, a source."""
    rows = list(csv.DictReader(io.StringIO(read_text(path, "validation file"))))
    if not rows:
        raise SimparError(f"{path}: no validation points (a CSV with columns {', '.join(REQUIRED)}, ...)")
    missing = [c for c in REQUIRED if c not in rows[0]]
    if missing:
        raise SimparError(f"{path}: missing columns {missing}")
    for i, row in enumerate(rows, start=2):
        where = f"{path}:{i}"
        if not row["source_url"].strip():
            raise SimparError(f"{where}: point {row['id']!r} has no source_url")
        try:
            row["value"] = float(row["value"])
            for key in ("gpus", "nodes", "size_bytes", "m", "n", "k", *validation_gpt.INTS):
                row[key] = int(row[key]) if row.get(key) else 0
            row["tolerance"] = float(row["tolerance"]) if row.get("tolerance") else TOLERANCE
            row["launch"] = nccl.parse_launch(row.get("launch") or "").label()  # checked, in its words
        except ValueError as exc:
            raise SimparError(f"{where}: {exc}") from None
        if row["value"] <= 0 or row["unit"] not in UNITS:
            raise SimparError(f"{where}: value must be > 0 and unit one of {', '.join(UNITS)}")
    return rows


def group_bw(hw, p: int, nodes: int) -> tuple[float, float]:
    """(bus bandwidth, link latency) of a group of p GPUs spread evenly over `nodes` nodes, by the same
    rule as hardware.group_link: one node, the NVLink ring; several, every member's rail."""
    if nodes <= 1:
        return hw.intra_bw, hw.intra_alpha
    members = max(1, p // nodes)
    flows = max(1, hw.devices_per_node // members)
    if hw.ring_proto:
        return nccl.rail_bandwidth(hw.intra_bw, hw.nic_bw, hw.nics_per_node, members, flows), hw.inter_alpha
    return min(hw.nic_bw, hw.nics_per_node * hw.nic_bw / flows), hw.inter_alpha


def collective_seconds(
    hw, op: str, size: float, p: int, nodes: int, algorithm: str = "auto", launch: nccl.Launch | None = None
) -> tuple[float, str]:
    """Seconds of one collective of `size` bytes (nccl-tests' size: the whole buffer) and how it ran;
    `launch`: how the source started it (nccl.Launch: the host's part beyond tuning.cc's one launch)."""
    if op not in COLLECTIVES:
        raise SimparError(f"unknown collective {op!r} (choose from {', '.join(COLLECTIVES)})")
    bw, alpha = group_bw(hw, p, nodes)
    tune = hardware.tuning(hw, p, nodes, bw, alpha)
    algo, _, proto = algorithm.partition("/")
    step = size if op == "send-recv" else size / p
    if algo == "tree":  # NCCL_ALGO=Tree: priced only as a source ran it, one GPU per node
        if op != "all-reduce" or p != nodes or nodes < 2:
            raise SimparError(
                f"algorithm tree is priced for an all-reduce over nodes of one GPU, not {op} on {p}"
            )
        options = nccl.tree_options(tune, gpus.TREE_PROTOCOLS, size)
        steps = nccl.ring_steps(op, p)
        t = min(
            (o for o in options if not proto or o.name == f"tree/{proto}"),
            key=lambda o: o.seconds(steps, step),
        )
    else:
        t = tune.choose(
            op, step, nvls=algo in ("auto", "nvls"), only=proto or ("NVLS" if algo == "nvls" else "")
        )
    if not (launch and hw.ring_proto and launch != nccl.Launch()):
        return t.seconds(nccl.ring_steps(op, p), step), t.name
    extra = launch.extra_seconds(hw.launch_s, gpus.TORCH_CALL_S)
    return t.seconds(nccl.ring_steps(op, p), step) + extra, f"{t.name} {launch.label()}"


def predict(point: dict, hw) -> tuple[float, str]:
    """The cost model's value for one point, in the point's unit, and a word on how it was priced."""
    op, q, unit = point["op"], point["quantity"], UNITS[point["unit"]]
    if op in COLLECTIVES:
        size = point["size_bytes"]
        launch = nccl.parse_launch(point.get("launch") or "")
        algorithm = point.get("algorithm") or "auto"
        t, how = collective_seconds(hw, op, size, point["gpus"], point["nodes"] or 1, algorithm, launch)
        values = {"time": t, "algbw": size / t, "busbw": size / t * nccl.bus_factor(op, point["gpus"])}
    elif op == "gemm":
        prec = PRECISION.get(point["dtype"], point["dtype"])
        if prec not in hw.flops:
            raise SimparError(f"point {point['id']}: profile {hw.name} has no {prec!r} FLOP rate")
        m, n, k = point["m"], point["n"], point["k"]
        t = nccl.gemm_seconds(
            m,
            n,
            k,
            hw.flops[prec],
            hw.gemm_tile.get(prec, 0),
            hw.sms,
            3 / hw.gamma,
            4 if prec in ("fp32", "tf32") else 2,
        )
        values, how = {"time": t, "tflops": 2.0 * m * n * k / t}, prec
    elif op == "gpt-step":
        values, how = validation_gpt.step_values(point, hw)
    elif op == "elementwise":
        values, how = {"bandwidth": 3 / hw.gamma}, "3/gamma"
    elif op == "launch":
        values, how = {"latency": hw.launch_s}, "launch_s"
    else:
        raise SimparError(f"point {point['id']}: unknown op {op!r}")
    if q not in values:
        raise SimparError(
            f"point {point['id']}: quantity {q!r} does not apply to {op} (use {', '.join(values)})"
        )
    return values[q] / unit, how


def evaluate(points: list[dict], hardware_override: str | None = None) -> list[dict]:
    profiles: dict = {}
    out = []
    for point in points:
        name = hardware_override or point["profile"]
        hw = profiles.setdefault(name, hardware.load(name))
        predicted, how = predict(point, hw)
        ratio = predicted / point["value"]
        out.append(
            {
                **point,
                "profile": name,
                "predicted": predicted,
                "ratio": ratio,
                "priced_as": how,
                "ok": abs(ratio - 1) <= point["tolerance"],
            }
        )
    return out


def summary(rows: list[dict]) -> dict:
    errors = [abs(r["ratio"] - 1) for r in rows]
    worst = max(rows, key=lambda r: abs(r["ratio"] - 1))
    checks = [abs(r["ratio"] - 1) for r in rows if r.get("fit") != "yes"]
    return {
        "points": len(rows),
        "fitted": len(rows) - len(checks),
        "sources": len({r["source_url"].split("#")[0] for r in rows}),
        "median_abs_error": statistics.median(errors),
        "median_abs_error_checks": statistics.median(checks) if checks else None,
        "worst": {"id": worst["id"], "ratio": worst["ratio"]},
        "failed": [r["id"] for r in rows if not r["ok"]],
    }


def table(rows: list[dict]) -> str:
    lines = [f"{'point':34} {'profile':13} {'published':>12} {'predicted':>12} {'ratio':>6}  tol   priced as"]
    for r in rows:
        mark = "" if r["ok"] else "  <-- out of tolerance"
        fit = " (fit)" if r.get("fit") == "yes" else ""
        lines.append(
            f"{r['id'][:34]:34} {r['profile'][:13]:13} {r['value']:>9.4g} {r['unit'][:2]:2} "
            f"{r['predicted']:>9.4g} {r['unit'][:2]:2} {r['ratio']:6.2f}  {r['tolerance']:.0%}  "
            f"{r['priced_as']}{fit}{mark}"
        )
    s = summary(rows)
    checks = s["median_abs_error_checks"]
    lines.append(
        f"{s['points']} points ({s['fitted']} used to fit a constant), {s['sources']} sources: "
        f"median |error| {s['median_abs_error']:.1%}"
        + (f" (checks only {checks:.1%})" if checks is not None else "")
        + f", worst {s['worst']['id']} ratio {s['worst']['ratio']:.2f}; {len(s['failed'])} out of tolerance"
    )
    return "\n".join(lines)
