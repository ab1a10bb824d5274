"""`python -m simpar plan`: what a layout costs, before you run it (no MPI, answers instantly).

    python -m simpar plan --layers 784,4096,4096,10 --batch 1024 --dp 8 --tp 4 --pp 2 --hardware ib-cluster
    python -m simpar plan --params 7e9 --batch 512 --dp 64 --zero 3 --precision mixed --optimizer adam
    python -m simpar plan --params 70e9 --sweep tp=1,2,4,8 --dp 8 -o sweep.png
    python -m simpar plan --params 13e9 --compare --world 64 --hardware ib-cluster --memory-limit 80GB
    python -m simpar plan --pp 4 --microbatches 8 --schedule 1f1b --show-schedule

--params N: a model too big to run is planned as an MLP stand-in of L square layers of width h
(widths [h] * (L+1)). Unless --width/--depth say otherwise, h keeps GPT-3's aspect ratio h/L ~ 128
(Brown et al. 2020, Table 2.1: 175B has h = 12288, L = 96): h = (128 N)^(1/3) rounded to a multiple
of 128, L = N / (h^2 + h) (with only --depth: h = sqrt(N/L), rounded to a multiple of 128, or of
8 below 1024, so that tensor parallelism divides it). It has the right parameter count and layer widths, so bytes of gradients,
ZeRO shards and tensor-parallel activations scale right; its activation memory is an MLP's (one x
and one z per layer), far less than a transformer's attention and MLP blocks.
"""

from __future__ import annotations

import argparse
import json
import math

from .. import costmodel as cm
from ..config import SimparError
from ..costmodel import hardware
from ..costmodel.compare import explain, factorizations, fits_in, rank_layouts  # noqa: F401  (lessons use them)
from ..units import fmt_si as fmt_bytes
from ..units import fmt_time, parse_bytes, parse_count
from .base import Parser

SWEEPABLE = ("dp", "tp", "pp", "zero", "batch", "width", "microbatches", "grad_accum")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="simpar plan", description="Predict bytes, memory and time of a layout (no MPI).")
    g = p.add_argument_group("model (one of)")
    g.add_argument(
        "--layers", default=None, help="widths, input first, e.g. 784,4096,4096,10 (default: the digits MLP)"
    )
    g.add_argument("--params", default=None, help="parameter count of a what-if model, e.g. 7e9, 70B, 1T")
    g.add_argument("--width", type=int, default=None, help="with --params: layer width h")
    g.add_argument("--depth", type=int, default=None, help="with --params: number of layers L")
    g = p.add_argument_group("layout")
    g.add_argument("--batch", type=int, default=64, help="global batch (samples per optimizer step)")
    for name in ("dp", "tp", "pp"):
        g.add_argument(f"--{name}", type=int, default=1)
    g.add_argument("--zero", type=int, default=0, help="ZeRO stage 0-3 (with --dp)")
    g.add_argument("--schedule", default="1f1b", help="naive | gpipe | 1f1b")
    g.add_argument("--microbatches", type=int, default=4)
    g.add_argument("--grad-accum", type=int, default=1)
    g.add_argument("--stage-layers", default=None, help="layers per stage, e.g. 2,1,1")
    g.add_argument("--collectives", default="ring", help=" | ".join(cm.ALLREDUCE))
    g.add_argument("--bucket-mb", type=float, default=1.0, help="gradient bucket size, MiB")
    g.add_argument("--no-overlap", action="store_true")
    g.add_argument("--data-source", default="local", help="local | root")
    g.add_argument("--precision", default="fp32", help="fp32 | fp64 | mixed (2-byte params/grads, K=12 Adam)")
    g.add_argument("--optimizer", default="sgd", help="sgd | adam")
    g.add_argument("--arch", default="mlp", help="mlp | resmlp (pre-LN residual blocks; dp and --zero)")
    g.add_argument("--momentum", type=float, default=0.9)
    g = p.add_argument_group("hardware and output")
    g.add_argument(
        "--hardware", default="local", help="local | dgx-h100 | ib-cluster | ethernet-100g | FILE.json"
    )
    g.add_argument("--memory-limit", default=None, help="bytes per rank, e.g. 80GB, 24GiB")
    g.add_argument("--json", action="store_true", help="print the prediction as JSON")
    g.add_argument("--sweep", default=None, help=f"KEY=V1,V2,... with KEY one of {', '.join(SWEEPABLE)}")
    g.add_argument("-o", "--out", default=None, help="sweep plot file (default sweep.png)")
    g.add_argument("--compare", action="store_true", help="rank every dp x tp x pp (x zero) of --world ranks")
    g.add_argument("--world", type=int, default=None, help="with --compare: number of ranks")
    g.add_argument(
        "--show-schedule", action="store_true", help="draw the pipeline schedule (--pp, --microbatches)"
    )
    return p


# -- parsing helpers ------------------------------------------------------------------------------------


def standin_widths(n_params: int, width: int | None = None, depth: int | None = None) -> list[int]:
    """An MLP of L square layers of width h with about n_params parameters (see the module docstring)."""
    if (width is not None and width < 1) or (depth is not None and depth < 1):
        raise SimparError("--width and --depth must be positive")
    if width is None and depth is None:
        width = max(128, round((128 * n_params) ** (1 / 3) / 128) * 128)
    if width is None:  # rounded like the default so that tensor parallelism can divide it
        raw = math.sqrt(n_params / depth)
        step = 128 if raw >= 1024 else 8
        width = max(step, round(raw / step) * step)
    if depth is None:
        depth = max(1, round(n_params / (width * width + width)))
    if width < 1 or depth < 1:
        raise SimparError("--width and --depth must be positive")
    return [width] * (depth + 1)


def spec_from_args(a) -> cm.Spec:
    if a.layers and a.params:
        raise SimparError("give --layers or --params, not both")
    if (a.width or a.depth) and not a.params:
        raise SimparError("--width and --depth shape a --params model; with --layers give the widths")
    if a.params:
        widths = standin_widths(parse_count(a.params), a.width, a.depth)
    else:
        try:
            widths = [int(w) for w in (a.layers or "64,128,128,128,10").split(",") if w.strip()]
        except ValueError:
            raise SimparError(f"--layers {a.layers!r}: expected comma-separated integers") from None
    stage_layers = None
    if a.stage_layers:
        try:
            stage_layers = [int(v) for v in a.stage_layers.split(",")]
        except ValueError:
            raise SimparError(
                f"--stage-layers {a.stage_layers!r}: expected comma-separated integers"
            ) from None
    names = {"float32": "fp32", "float64": "fp64", "bf16": "mixed", "fp16": "mixed"}
    names.update({"mixed-fp16": "mixed", "mixed-bf16": "mixed"})  # train's --precision names
    precision = names.get(a.precision, a.precision)
    if a.data_source not in ("local", "root"):
        raise SimparError(f"unknown data source {a.data_source!r} (choose from local, root)")
    spec = cm.Spec(
        widths=widths,
        batch=a.batch,
        dp=a.dp,
        tp=a.tp,
        pp=a.pp,
        zero=a.zero,
        schedule=a.schedule,
        microbatches=a.microbatches,
        grad_accum=a.grad_accum,
        collectives=a.collectives,
        bucket_mb=a.bucket_mb,
        overlap=not a.no_overlap,
        data_source=a.data_source,
        stage_layers=stage_layers,
        precision=precision,
        optimizer=a.optimizer,
        momentum=a.momentum,
        arch=a.arch,
    )
    if stage_layers is not None and (
        len(stage_layers) != spec.pp or sum(stage_layers) != spec.n_layers or min(stage_layers) < 1
    ):
        raise SimparError(
            f"--stage-layers {stage_layers} must give {spec.pp} positive counts summing to {spec.n_layers}"
        )
    return cm.check(spec)


# -- the main command -------------------------------------------------------------------------------------


def plan_main(argv: list[str]) -> int:
    a = build_parser().parse_args(argv)
    if a.show_schedule:
        return show_schedule(a)
    spec = spec_from_args(a)
    hw = hardware.load(a.hardware)
    limit = parse_bytes(a.memory_limit) if a.memory_limit else None
    if a.compare:
        return print_compare(
            spec, hw, a.world, limit if limit is not None else (hw.memory_bytes or None), a.json
        )
    if a.sweep:
        return sweep(spec, hw, a.sweep, a.out or "sweep.png", a.json, limit)
    pred = cm.predict(spec, hw)
    if a.json:
        print(json.dumps(pred, indent=1, default=str))
    else:
        print(format_plan(pred, hw, limit))
    return 0


def show_schedule(a) -> int:
    from ..parallel.schedules import show_schedule_main as fn

    if a.pp < 1 or a.microbatches < 1:
        raise SimparError("--show-schedule needs --pp >= 1 and --microbatches >= 1")
    try:
        text = fn(a.schedule, a.pp, a.microbatches)
    except ValueError as exc:
        raise SimparError(str(exc)) from None
    if text:
        print(text)
    return 0


# -- the readable table -------------------------------------------------------------------------------------


def format_plan(pred: dict, hw, limit: float | None) -> str:
    sp, t = pred["spec"], pred["time"]
    lines = [
        f"simpar plan: {describe_model(pred)}, global batch {sp['batch']}, {pred['layout']} on "
        f"{pred['world']} rank{'s' if pred['world'] > 1 else ''}, {sp['precision']} {sp['optimizer']}, hardware {hw.name}",
        "links: "
        + "; ".join(
            f"{g} group -> {l['name']} ({fmt_bytes(l['bytes_per_s'])}/s, {fmt_time(l['alpha_s'])})"
            for g, l in pred["links"].items()
            if g != "world" and sp[g] > 1
        )
        if pred["world"] > 1
        else "links: none (one rank)",
    ]
    ranks = pred["comm"]["ranks"]
    shown = (
        ranks if len(ranks) <= 16 else [r for r in ranks if r["coords"]["dp"] == 0 and r["coords"]["tp"] == 0]
    )
    lines += [
        "",
        "per rank per step"
        + ("" if shown is ranks else " (first rank of each stage; others differ by a few bytes)"),
        f"{'rank':>5} {'pp,dp,tp':>9} | {'data':>9} {'model':>9} {'activation':>10} {'msgs':>6} | "
        f"{'params':>9} {'grads':>9} {'optimizer':>9} {'activations':>11} {'total':>9}",
    ]
    if len(shown) > 12:
        shown = shown[:6] + [None] + shown[-3:]
    for r in shown:
        if r is None:
            lines.append(f"{'...':>5}")
            continue
        c, m = r["coords"], r["memory"]
        lines.append(
            f"{r['rank']:>5} {c['pp']:>5},{c['dp']},{c['tp']} | "
            + " ".join(
                f"{fmt_bytes(r['sent'][k]):>{w}}" for k, w in (("data", 9), ("model", 9), ("activation", 10))
            )
            + f" {sum(r['messages'].values()):>6} | "
            + " ".join(
                f"{fmt_bytes(m[k]):>{w}}"
                for k, w in (("params", 9), ("grads", 9), ("optimizer", 9), ("activations_peak", 11))
            )
            + f" {fmt_bytes(sum(m.values())):>9}"
        )
    if pred["comm"]["total_sent"]:
        tot = pred["comm"]["total_sent"]
        lines.append("all ranks together: " + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in tot.items()))
    lines += ["", "collectives (slowest rank): time = latency (alpha) + bandwidth (beta) + reduction (gamma)"]
    for op, v in sorted(pred["comm"]["by_op_slowest_rank"].items()):
        ts = v["time_s"]
        lines.append(
            f"  {op:<28} {v['link']:<14} {fmt_bytes(v['sent']):>9} {v['messages']:>6} msgs  "
            f"{fmt_time(ts['latency'])} + {fmt_time(ts['bandwidth'])} + {fmt_time(ts['reduction'])}"
            f" = {fmt_time(sum(ts.values()))}"
        )
    mem = pred["memory"]
    verdict = ""
    if limit:
        ratio = mem["max_total"] / limit
        verdict = f"  vs limit {fmt_bytes(limit)}: {'fits' if ratio <= 1 else 'DOES NOT FIT'} ({ratio:.3g}x the limit)"
    lines += [
        "",
        "memory per rank (max): "
        + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in mem["max"].items())
        + f"; total {fmt_bytes(mem['max_total'])}"
        + verdict,
    ]
    if sp["pp"] > 1:
        S, M = sp["pp"], sp["microbatches"]
        formula = (
            f"(S-1)/S = {S - 1}/{S}" if sp["schedule"] == "naive" else f"(S-1)/(M+S-1) = {S - 1}/{M + S - 1}"
        )
        lines.append(f"pipeline bubble ({sp['schedule']}): {formula} = {pred['bubble']:.1%} of the step")
    lines += [
        "",
        f"time per step on {hw.name}: compute {fmt_time(t['compute_s'])} + tp {fmt_time(t['tp_s'])} "
        f"+ pp {fmt_time(t['pp_s'])} + bubble {fmt_time(t['bubble_s'])} + dp/zero exposed "
        f"{fmt_time(t['dp_exposed_s'])} (of {fmt_time(t['dp_s'])}) + data {fmt_time(t['data_s'])}",
        f"  = {fmt_time(t['step_s'])} per step, {t['samples_per_s']:,.0f} samples/s",
    ]
    return "\n".join(lines)


# -- --sweep ---------------------------------------------------------------------------------------------


def _with(spec: cm.Spec, key: str, value: int) -> cm.Spec:
    """A copy of spec with one knob changed; `width` scales every hidden width to `value`."""
    d = dict(spec.__dict__)
    if key == "width":
        d["widths"] = (
            [spec.widths[0]] + [value] * (len(spec.widths) - 2) + [spec.widths[-1]]
            if len(set(spec.widths)) > 1
            else [value] * len(spec.widths)
        )
    else:
        d[key] = value
    return cm.check(cm.Spec(**d))


def parse_sweep(text: str) -> tuple[str, list[int]]:
    key, _, values = (text or "").partition("=")
    key = key.strip().replace("-", "_")
    if key not in SWEEPABLE or not values:
        raise SimparError(f"--sweep {text!r}: expected KEY=V1,V2,... with KEY one of {', '.join(SWEEPABLE)}")
    try:
        vals = [int(float(v)) for v in values.split(",") if v.strip()]
    except ValueError:
        raise SimparError(f"--sweep {text!r}: values must be numbers") from None
    return key, vals


def sweep(spec: cm.Spec, hw, text: str, out: str, as_json: bool, limit: float | None) -> int:
    key, values = parse_sweep(text)
    rows = []
    for v in values:
        try:
            rows.append((v, cm.predict(_with(spec, key, v), hw)))
        except SimparError as exc:
            rows.append((v, str(exc)))
    good = [(v, p) for v, p in rows if isinstance(p, dict)]
    if as_json:
        print(
            json.dumps(
                {"sweep": key, "points": [{"value": v, "prediction": p} for v, p in rows]},
                indent=1,
                default=str,
            )
        )
    else:
        print(f"sweep of {key} on {hw.name} (bytes and memory per rank per step, the largest over ranks)")
        print(
            f"{key:>8} {'layout':<22} {'data':>9} {'model':>9} {'activation':>10} {'memory':>9} {'bubble':>7} {'step':>9}"
        )
        for v, p in rows:
            if isinstance(p, str):
                print(f"{v:>8} not possible: {p}")
                continue
            c, t = p["comm"]["per_rank_max"], p["time"]
            over = "!" if limit and p["memory"]["max_total"] > limit else ""
            print(
                f"{v:>8} {p['layout']:<22} {fmt_bytes(c['data']):>9} {fmt_bytes(c['model']):>9} "
                f"{fmt_bytes(c['activation']):>10} {fmt_bytes(p['memory']['max_total']):>9}{over or ' '}"
                f"{p['bubble']:>6.1%} {fmt_time(t['step_s']):>9}"
            )
        if limit:
            print(f"(! = over the memory limit of {fmt_bytes(limit)})")
    if good:
        from ..report.plots import plot_sweep

        plot_sweep(key, good, out, hw.name, limit)
        if not as_json:
            print(f"plot saved to {out}")
    return 0


def describe_model(pred: dict) -> str:
    """One line naming the planned model: its widths (or the stand-in's shape) and parameter count."""
    w, P = pred["widths"], pred["params"]
    shape = (
        "-".join(map(str, w)) if "..." not in w else f"stand-in, {pred['n_layers']} layers of width {w[1]}"
    )
    kind = "residual MLP" if pred["spec"].get("arch") == "resmlp" else "MLP"
    size = f"{P / 1e9:,.2f} B params" if P >= 1e9 else f"{P / 1e6:,.3g} M params"
    return f"{kind} {shape} ({size})"


def print_compare(spec, hw, world: int | None, limit: float | None, as_json: bool) -> int:
    """`plan --compare`: the ranked table and the explanation."""
    ranked, invalid = rank_layouts(spec, hw, world, limit)
    fits = fits_in(limit)
    if as_json:
        print(json.dumps({"world": world, "memory_limit": limit, "ranked": ranked}, indent=1, default=str))
        return 0
    print(
        f"simpar plan --compare: {describe_model(ranked[0])}, batch {spec.batch}, {world} rank{'s' if world > 1 else ''} on {hw.name}, "
        f"{spec.precision} {spec.optimizer}"
        + (f", memory limit {fmt_bytes(limit)} per rank" if limit else "")
    )
    print(
        f"{'#':>3} {'layout':<24} {'step':>9} {'samples/s':>11} {'mem/rank':>9} {'compute':>9} {'tp':>9} "
        f"{'pp+bubble':>9} {'dp/zero':>9}"
    )
    for i, p in enumerate(ranked[:15], 1):
        t = p["time"]
        print(
            f"{i:>3} {p['layout']:<24} {fmt_time(t['step_s']):>9} {t['samples_per_s']:>11,.0f} "
            f"{fmt_bytes(p['memory']['max_total']):>9}{' ' if fits(p) else '!'}{fmt_time(t['compute_s']):>9} "
            f"{fmt_time(t['tp_s']):>9} {fmt_time(t['pp_s'] + t['bubble_s']):>9} {fmt_time(t['dp_exposed_s']):>9}"
        )
    if len(ranked) > 15:
        print(f"    ... {len(ranked) - 15} more")
    notes = [f"{invalid} factorizations skipped as invalid for this model"] if invalid else []
    if limit:
        over = sum(not fits(p) for p in ranked)
        notes.append(
            f"{over} of {len(ranked)} layouts exceed the memory limit (marked !)"
            if over
            else "every layout fits in memory"
        )
    print("(" + "; ".join(notes) + ")" if notes else "")
    print("\n" + "\n".join(explain(ranked, limit, fits)))
    return 0
