"""`python -m simpar plan`: what a layout costs, before you run it (no MPI, answers instantly).

    python -m simpar plan --layers 784,4096,4096,10 --batch 1024 --dp 8 --tp 4 --pp 2 \
        --hardware ib-cluster
    python -m simpar plan --params 7e9 --batch 512 --dp 64 --zero 3 --precision mixed --optimizer adam
    python -m simpar plan --params 70e9 --sweep tp=1,2,4,8 --dp 8 -o sweep.png
    python -m simpar plan --params 13e9 --compare --world 64 --hardware ib-cluster --memory-limit 80GB
    python -m simpar plan --pp 4 --microbatches 8 --schedule 1f1b --show-schedule

--params N: a model too big to run is planned as an MLP stand-in of L square layers of width h
(widths [h] * (L+1)). Unless --width/--depth say otherwise, h keeps GPT-3's aspect ratio h/L ~ 128
(Brown et al. 2020, Table 2.1: 175B has h = 12288, L = 96): h = (128 N)^(1/3) rounded to a multiple
of 128, L = N / (h^2 + h) (with only --depth: h = sqrt(N/L), rounded to a multiple of 128, or of
8 below 1024, so that tensor parallelism divides it). It has the right parameter count and layer
widths, so bytes of gradients, ZeRO shards and tensor-parallel activations scale right; its
activation memory is an MLP's (one x and one z per layer), far less than a transformer's attention
and MLP blocks.

--hardware local is this machine as `python -m simpar bench --calibrate` measured it; without that
measurement it is a set of documented defaults, and every text output says so (times are then rough).

(A little over 300 lines: one subcommand, its parser and a short driver per mode -- one layout,
--compare, --sweep, --experts, --show-schedule -- that share the parsed Spec; the longer tables are
in report/plan.py and report/plan_moe.py.)
"""

from __future__ import annotations

import argparse
import json
import math

from .. import costmodel as cm
from ..config import SimparError
from ..costmodel import hardware

# factorizations is not used here: the lessons import it from this module
from ..costmodel.compare import explain, factorizations, fits_in, rank_layouts  # noqa: F401
from ..report.plan import describe_model, format_plan, hardware_note, print_compare, sp_saving  # noqa: F401
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
    g.add_argument(
        "--cp", type=int, default=1, help="with --arch gpt: context-parallel ranks (the sequence split)"
    )
    g.add_argument("--cp-algo", default="ring", help="with --cp: ring | ulysses")
    g.add_argument("--schedule", default="1f1b", help="naive | gpipe | 1f1b | interleaved | zb-h1 | zb-v")
    g.add_argument("--microbatches", type=int, default=4)
    g.add_argument("--virtual-stages", type=int, default=1, help="model chunks per rank (interleaved)")
    g.add_argument("--recompute", default="none", help="none | full | selective")
    g.add_argument(
        "--attention",
        default="materialized",
        help="with --arch gpt: materialized (simpar's attention.py: every s^2 score through memory) | "
        "flash (a FlashAttention kernel: the causal half, on chip)",
    )
    g.add_argument("--grad-accum", type=int, default=1)
    g.add_argument("--stage-layers", default=None, help="layers per stage, e.g. 2,1,1")
    g.add_argument("--collectives", default="ring", help=" | ".join(cm.ALLREDUCE))
    g.add_argument("--bucket-mb", type=float, default=1.0, help="gradient bucket size, MiB")
    g.add_argument("--no-overlap", action="store_true")
    g.add_argument("--data-source", default="local", help="local | root")
    g.add_argument("--precision", default="fp32", help="fp32 | fp64 | mixed (2-byte params/grads, K=12 Adam)")
    g.add_argument("--optimizer", default="sgd", help="sgd | adam")
    g.add_argument(
        "--kernels",
        default="numpy",
        choices=("numpy", "numba", "cuda"),
        help="whose memory passes to charge (bias, activation, optimizer): numpy, the reference (default), "
        "numba's fused sweeps, or cuda's epilogues",
    )
    g.add_argument(
        "--arch", default="mlp", help="mlp | resmlp (pre-LN residual blocks) | gpt (a transformer: --model)"
    )
    g.add_argument("--model", default=None, help="with --arch gpt: gpt3-175b | gpt3-13b | gpt2-1.5b")
    g.add_argument("--n-layers", type=int, default=None, help="with --arch gpt: blocks L (overrides --model)")
    g.add_argument("--hidden", type=int, default=None, help="with --arch gpt: hidden size h")
    g.add_argument("--heads", type=int, default=None, help="with --arch gpt: attention heads a")
    g.add_argument("--seq-len", type=int, default=None, help="with --arch gpt: sequence length s")
    g.add_argument("--vocab", type=int, default=None, help="with --arch gpt: vocabulary V")
    g.add_argument(
        "--sp",
        action="store_true",
        help="sequence parallelism (resmlp with --tp): LN/residual rows split over tp",
    )
    g.add_argument("--momentum", type=float, default=0.9)
    g.add_argument("--experts", type=int, default=0, help="mixture of experts: E experts per hidden layer")
    g.add_argument("--top-k", type=int, default=2, help="with --experts: experts per token")
    g.add_argument(
        "--capacity-factor", type=float, default=1.25, help="with --experts: C (slots ceil(CKB/E))"
    )
    g.add_argument("--ep", type=int, default=1, help="with --experts: expert-parallel ranks inside --dp")
    g.add_argument("--alltoall", default="pairwise", help="with --ep: the all-to-all, pairwise | bruck")
    g.add_argument(
        "--imbalance", type=float, default=1.0, help="with --experts: hottest expert's load / the mean (>= 1)"
    )
    g = p.add_argument_group("hardware and output")
    g.add_argument(
        "--hardware",
        default="local",
        help="local | dgx-h100 | h200 | dgx-a100 | ib-cluster | ethernet-100g | FILE.json",
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
            widths = [int(w) for w in (a.layers or "64,128,128,128,10").split(",")]  # 64,,10: an error
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
        virtual_stages=a.virtual_stages,
        recompute=a.recompute,
        grad_accum=a.grad_accum,
        collectives=a.collectives,
        bucket_mb=a.bucket_mb,
        overlap=not a.no_overlap,
        data_source=a.data_source,
        stage_layers=stage_layers,
        precision=precision,
        optimizer=a.optimizer,
        momentum=a.momentum,
        kernels=a.kernels,
        arch=a.arch,
        sp=a.sp,
        experts=a.experts,
        top_k=a.top_k,
        capacity_factor=a.capacity_factor,
        ep=a.ep,
        alltoall=a.alltoall,
    )
    return cm.check(spec)  # --stage-layers: one count per stage (per chunk if interleaved), as train


# options of `simpar plan` that a dense GPT's plan has no use for: given, they are refused, not ignored
NOT_FOR_GPT = {
    "the MLP's plan takes them": (
        "layers", "params", "width", "depth", "stage_layers", "bucket_mb", "no_overlap", "data_source",
        "kernels", "momentum", "sweep", "out",
    ),
    "they need --experts": ("top_k", "capacity_factor", "alltoall", "imbalance"),
}  # fmt: skip


def check_unused_by_gpt(a) -> None:
    parser = build_parser()
    for why, names in NOT_FOR_GPT.items():
        given = [name for name in names if getattr(a, name) != parser.get_default(name)]
        if given:
            flags = ", ".join("--" + name.replace("_", "-") for name in given)
            raise SimparError(f"plan --arch gpt does not use {flags} ({why})")


# -- the main command -------------------------------------------------------------------------------------


def plan_main(argv: list[str]) -> int:
    a = build_parser().parse_args(argv)
    if a.show_schedule:
        return show_schedule(a)
    if a.cp != 1 and a.arch != "gpt":
        raise SimparError("plan --cp splits a token sequence over ranks: use it with --arch gpt")
    if a.attention != "materialized" and (a.arch != "gpt" or a.experts or a.ep != 1):
        raise SimparError(
            "plan --attention picks a dense GPT's attention kernel: use it with --arch gpt, without --experts"
        )
    if a.arch == "gpt" and (a.experts or a.ep != 1):  # ep inside dp, a balanced router (plan_gpt_moe.py)
        from ..report.plan_gpt import shape_from_args
        from ..report.plan_gpt_moe import plan_gpt_moe_main

        return plan_gpt_moe_main(a, shape_from_args(a))
    if a.arch == "gpt":  # a transformer's closed forms (costmodel/gpt_plan.py), one layout
        from ..report.plan_gpt import plan_gpt_main

        check_unused_by_gpt(a)
        return plan_gpt_main(a)
    spec = spec_from_args(a)
    hw = hardware.load(a.hardware)
    limit = parse_bytes(a.memory_limit) if a.memory_limit else None
    if spec.experts:
        return plan_moe(spec, hw, a)
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
        print(format_plan(pred, hw, limit, spec.widths))
        if spec.arch == "resmlp" and spec.tp > 1:  # --sp or not, side by side (also under --pp)
            print(sp_saving(spec, pred, cm.predict(cm.Spec(**dict(spec.__dict__, sp=not spec.sp)), hw)))
    return 0


def plan_moe(spec: cm.Spec, hw, a) -> int:
    """--experts: the MoE what-if (costmodel/moe.py) for balanced routing times --imbalance."""
    from ..costmodel.moe import predict_moe
    from ..report.plan_moe import format_moe_plan

    if a.compare or a.sweep:
        raise SimparError("--compare and --sweep do not cover --experts yet; plan one layout at a time")
    if not (a.imbalance >= 1 and math.isfinite(a.imbalance)):
        raise SimparError(
            f"--imbalance must be a number >= 1 (the hottest expert's load / the mean), got {a.imbalance}"
        )
    pred = predict_moe(spec, hw, imbalance=a.imbalance)
    if a.json:
        print(json.dumps(pred, indent=1, default=str))
    else:
        print(format_moe_plan(spec, pred, hw, from_params=bool(a.params)))
    return 0


def show_schedule(a) -> int:
    from ..parallel.pipeline.check import show_schedule_main as fn

    if a.pp < 1 or a.microbatches < 1:
        raise SimparError("--show-schedule needs --pp >= 1 and --microbatches >= 1")
    from ..config import SCHEDULES
    from ..config.pipeline import schedule_problem
    from ..parallel.pipeline.check import load_schedule_file

    schedule = a.schedule
    if schedule.endswith(".json"):  # a hand-made schedule: checked like the built-in ones
        schedule = load_schedule_file(schedule)
    elif schedule not in SCHEDULES:
        raise SimparError(
            f"unknown schedule {schedule!r} (choose from {', '.join(SCHEDULES)}, or a FILE.json)"
        )
    else:
        problem = schedule_problem(schedule, a.pp, a.microbatches, a.virtual_stages)
        if problem:
            raise SimparError(problem)
    try:
        text = fn(schedule, a.pp, a.microbatches, V=a.virtual_stages)
    except ValueError as exc:
        raise SimparError(str(exc)) from None
    if text:
        print(text)
    return 0


# -- the readable table -------------------------------------------------------------------------------------


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
        for line in hardware_note(hw):
            print(line)
        print(
            f"{key:>8} {'layout':<22} {'data':>9} {'model':>9} {'activation':>10} {'memory':>9} "
            f"{'bubble':>7} {'step':>9}"
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
        from ..report.sweep import plot_sweep

        plot_sweep(key, good, out, hw.name, limit)
        if not as_json:
            print(f"plot saved to {out}")
    return 0
