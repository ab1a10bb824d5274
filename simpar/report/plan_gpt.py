"""What `simpar plan --arch gpt` prints: a transformer's parameters, memory per GPU, FLOPs, time, MFU.

    python -m simpar plan --arch gpt --model gpt3-175b --dp 8 --tp 8 --pp 16 --batch 1536 \
        --microbatches 96 --sp --recompute selective --precision mixed --optimizer adam --hardware ib-cluster

The numbers are costmodel/gpt_plan.py's (from gpt.py's formulas); this file only checks the question
and words the answer.
"""

from __future__ import annotations

import json

from ..config import SimparError
from ..config.pipeline import schedule_problem
from ..costmodel import gpt as cg
from ..costmodel import gpt_plan as gp
from ..costmodel import hardware
from ..costmodel.collectives import ALLREDUCE
from ..units import fmt_si, fmt_time


def shape_from_args(a) -> cg.Shape:
    """--model NAME, each of --n-layers --hidden --heads --seq-len --vocab overriding it (or all five
    given without --model)."""
    given = {k: getattr(a, k) for k in ("n_layers", "hidden", "heads", "seq_len", "vocab")}
    if a.model:
        if a.model not in cg.PRESETS:
            raise SimparError(f"unknown --model {a.model!r} (choose from {', '.join(cg.PRESETS)})")
        base = cg.PRESETS[a.model]
    elif None in given.values():
        raise SimparError(
            "plan --arch gpt needs --model (" + ", ".join(cg.PRESETS) + ") or all of --n-layers --hidden "
            "--heads --seq-len --vocab"
        )
    else:
        base = cg.Shape(0, 0, 0, 0, 0, "given on the command line")
    fields = dict(layers=base.layers, hidden=base.hidden, heads=base.heads, seq=base.seq, vocab=base.vocab)
    for key, name in (("n_layers", "layers"), ("hidden", "hidden"), ("heads", "heads")):
        fields[name] = given[key] if given[key] is not None else fields[name]
    fields["seq"] = given["seq_len"] if given["seq_len"] is not None else fields["seq"]
    fields["vocab"] = given["vocab"] if given["vocab"] is not None else fields["vocab"]
    changed = any(v is not None for v in given.values()) and a.model
    return cg.Shape(**fields, source=base.source + (" (changed on the command line)" if changed else ""))


def check_layout(shape: cg.Shape, a) -> None:
    if min(shape.layers, shape.hidden, shape.heads, shape.seq, shape.vocab) < 1:
        raise SimparError("--n-layers, --hidden, --heads, --seq-len and --vocab must be at least 1")
    if min(a.dp, a.tp, a.pp, a.batch, a.microbatches, a.grad_accum) < 1:
        raise SimparError("--dp, --tp, --pp, --batch, --microbatches and --grad-accum must be at least 1")
    if shape.heads % a.tp:
        raise SimparError(f"--tp {a.tp} must divide the {shape.heads} heads (each rank computes whole heads)")
    if a.pp > shape.layers:
        raise SimparError(f"--pp {a.pp} is more stages than the {shape.layers} blocks")
    if a.sp and a.tp == 1 and not a.compare:  # --compare: sp wherever its candidates have tp > 1
        raise SimparError("--sp splits LayerNorm and the residual over the tp group: add --tp > 1")
    if a.recompute not in ("none", "full", "selective"):
        raise SimparError(f"unknown recompute {a.recompute!r} (choose from none, full, selective)")
    if a.zero not in (0, 1, 2, 3):
        raise SimparError(f"--zero must be 0, 1, 2 or 3, got {a.zero}")
    if a.collectives not in ALLREDUCE:
        raise SimparError(f"unknown --collectives {a.collectives!r} (choose from {', '.join(ALLREDUCE)})")
    if a.precision not in ("fp32", "fp64", "mixed") or a.optimizer not in ("sgd", "adam"):
        raise SimparError("plan --arch gpt: --precision fp32|fp64|mixed, --optimizer sgd|adam")
    if a.pp > 1 and a.schedule not in gp.PLANNED_SCHEDULES:
        raise SimparError(
            f"plan --arch gpt plans --schedule {', '.join(gp.PLANNED_SCHEDULES)}, not {a.schedule!r} "
            "(train --arch gpt --clock sim times every schedule simpar runs)"
        )
    problem = schedule_problem(a.schedule, a.pp, a.microbatches, a.virtual_stages, shape.layers)
    if problem and not a.compare:  # --compare: each candidate's pp is checked (gpt_compare.py)
        raise SimparError(problem)
    if a.attention not in gp.ATTENTION:
        raise SimparError(f"unknown --attention {a.attention!r} (choose from {', '.join(gp.ATTENTION)})")
    if a.attention == "flash" and a.cp_algo == "ulysses" and (a.cp > 1 or a.compare):
        raise SimparError(
            "--attention flash with --cp-algo ulysses is not planned yet (Ulysses' heads are priced as "
            "simpar's attention.py computes them); the ring (--cp-algo ring) keeps its blocks on chip already"
        )


def _count(n: float) -> str:
    """175_181_291_520 -> '175.18 billion' (a parameter count, not bytes)."""
    for scale, word in ((1e12, "trillion"), (1e9, "billion"), (1e6, "million")):
        if n >= scale:
            return f"{n / scale:.2f} {word}"
    return f"{n:,.0f}"


def plan_gpt_main(a) -> int:
    shape = shape_from_args(a)
    names = {"mixed-fp16": "mixed", "mixed-bf16": "mixed", "float32": "fp32", "float64": "fp64"}
    a.precision = names.get(a.precision, a.precision)
    check_layout(shape, a)
    hw = hardware.load(a.hardware)
    args = (a.tp, a.pp, a.sp, a.zero, a.microbatches, a.recompute, a.precision, a.optimizer, a.grad_accum)
    args += (a.collectives, a.attention, a.schedule, a.virtual_stages)
    if a.compare:  # every dp x cp x tp x pp of --world GPUs, ranked (costmodel/gpt_compare.py)
        from ..units import parse_bytes
        from .plan_gpt_compare import print_gpt_compare

        limit = parse_bytes(a.memory_limit) if a.memory_limit else (hw.memory_bytes or None)
        q = dict(zip(PLAN_ARGS[3:], args[2:]), cp_algo=a.cp_algo)
        return print_gpt_compare(shape, a.batch, hw, a.world, limit, q, a.json)
    p = without = gp.plan(shape, a.batch, hw, **dict(zip(PLAN_ARGS, (a.dp, *args))))
    if a.cp > 1:  # context parallelism: costmodel/cp.py, worded by plan_cp.py
        from ..costmodel.cp import plan_cp
        from .plan_cp import check_cp

        check_cp(shape, a.cp, a.cp_algo)
        p = plan_cp(shape, a.batch, hw, a.cp, a.cp_algo, **dict(zip(PLAN_ARGS, (a.dp, *args))))
    if a.json:
        print(json.dumps({**p, "model": shape.__dict__}, indent=2, default=str))
        return 0
    print("\n".join(format_gpt_plan(p, shape, a.batch, hw)))
    if a.cp > 1:
        from .plan_cp import cp_lines

        print("\n".join(cp_lines(p, without)))
    return 0


PLAN_ARGS = (
    "dp",
    "tp",
    "pp",
    "sp",
    "zero",
    "microbatches",
    "recompute",
    "precision",
    "optimizer",
    "grad_accum",
    "collectives",
    "attention",
    "schedule",
    "virtual_stages",
)


def _hardware_note(p: dict) -> str:
    """What the hardware's FLOPs count beyond the model's: the scores the layout's attention computes
    (attention.py: all s^2, masked; cp's ring: its causal blocks; a FlashAttention kernel: the causal
    half) and what recomputation adds."""
    scores = p.get("attention_scores", "all s^2, masked")
    ring = not scores.startswith("all")  # cp's ring's causal blocks, or a FlashAttention kernel's half
    flash = p["layout"].get("attention") == "flash" and not scores.startswith("the causal blocks")
    kept = "FlashAttention keeps its log-sum-exp" if flash else "the ring keeps its log-sum-exp"
    redo = {
        "full": "full recomputation: the blocks' forward again",
        "selective": "selective recomputation: "
        + (f"{kept}, nothing again" if ring else "+ 2 B L s^2 h, q k^T again"),
    }.get(p["layout"].get("recompute", "none"))
    return f" (attention scores: {scores}" + (f"; {redo})" if redo else ")")


def format_gpt_plan(p: dict, shape: cg.Shape, batch: int, hw) -> list[str]:
    L, h, a, s, V = shape.layers, shape.hidden, shape.heads, shape.seq, shape.vocab
    lay, mem, t, prec = p["layout"], p["memory_per_gpu"], p["time"], p["precision"]
    parts = [f"dp {lay['dp']}", f"tp {lay['tp']}" + (" + sp" if lay["sp"] else ""), f"pp {lay['pp']}"]
    extra = (f", ZeRO-{lay['zero']}" if lay["zero"] else "") + (
        f", {lay['microbatches']} micro-batches" if lay["pp"] > 1 else ""
    )
    if lay["pp"] > 1:
        v = lay.get("virtual_stages", 1)
        extra += {"gpipe": ", GPipe", "interleaved": f", interleaved 1F1B ({v} chunks a GPU)"}.get(
            lay.get("schedule"), ", 1F1B"
        )
    extra += ", FlashAttention" if lay.get("attention") == "flash" else ""
    b = batch / (lay["dp"] * lay["microbatches"] * lay["grad_accum"])
    limit = f" of {fmt_si(hw.memory_bytes)}" if hw.memory_bytes else ""
    return [
        f"model: L={L} h={h} a={a} s={s} V={V}  [{shape.source}]",
        f"parameters: {_count(p['params'])} as simpar builds it (untied LM head, final LayerNorm); "
        f"tied as GPT-2/3: {_count(p['params_tied'])}; Narayanan et al. 2021 sec. 5.1: "
        f"{_count(p['params_narayanan'])}",
        f"layout: {' x '.join(parts)} = {p['world']} GPUs on {hw.name}{extra}; batch {batch} sequences "
        f"({b:g} per micro-batch)",
        f"memory per GPU (the first stage, the fullest): {fmt_si(mem['total'])}{limit} = params "
        f"{fmt_si(mem['params'])} + grads {fmt_si(mem['grads'])} + optimizer {fmt_si(mem['optimizer'])} + "
        f"activations {fmt_si(mem['activations'])}",
        f"  activations per layer per micro-batch {fmt_si(p['activation_per_layer'])} (Korthikanti et al. "
        "2022, Table 2), x ceil(L/pp) layers x min(pp, M) micro-batches in flight (1F1B)",
        f"FLOPs per step: {p['flops_per_step']:.3e} = 72 B s L h^2 (1 + s/12h + V/12Lh) (Narayanan et al. "
        f"2021 sec. 5.1, the causal half of the scores as Megatron-LM counts them); the hardware does "
        f"{p['hardware_flops_per_step']:.3e}" + _hardware_note(p),
        f"step time: {fmt_time(t['step_s'])} (compute incl. bubble {fmt_time(t['compute_s'])}, memory-bound "
        f"work {fmt_time(t['memory_s'])}, "
        + (f"slowest stage +{fmt_time(t['imbalance_s'])}, " if lay["pp"] > 1 else "")
        + "tp "
        f"all-reduces {fmt_time(t['tp_s'])}, "
        + (f"pipeline sends {fmt_time(t['pp_s'])}, " if lay["pp"] > 1 else "")
        + f"dp gradients {fmt_time(t['dp_s'])}, not overlapped; "
        f"--collectives {lay['collectives']}"
        + (f"; cp transfers exposed {fmt_time(t['cp_s'])})" if "cp_s" in t else ")"),
        f"MFU: {p['mfu']:.1%} of the dense peak (model FLOPs / (step time x GPUs x peak); {hw.name}'s "
        f"achievable GEMM rate is {hw.flop_rate(prec) / hw.peak_rate(prec):.1%} of its peak, so compute "
        "alone reaches at most that)",
    ]
