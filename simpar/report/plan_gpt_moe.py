"""What `simpar plan --arch gpt --experts E [--ep P] --dp D` prints: a mixture-of-experts transformer's
parameters, memory per rank, FLOPs, all-to-all bytes, step time and MFU, before running it.

    python -m simpar plan --arch gpt --model gpt2-1.5b --experts 8 --top-k 2 --ep 8 --dp 16 \
        --batch 64 --precision mixed --optimizer adam --hardware dgx-h100

The numbers are the closed forms `train` predicts a run with (costmodel/gpt_moe.py, gpt_moe_time.py),
for a BALANCED router: every rank's n tokens spread evenly, n K / E assignments per expert, none
dropped (the real router's histograms make a run's exact prediction; an imbalanced one moves more
bytes through the hottest expert's rank and waits for it). Layouts: what `train --clock sim` runs --
dp x ep, with --cp (cp_moe.py), --tp (gpt_moe_tp.py) or --pp (gpt_moe_pipeline.py) -- checked by the
same rules, so the plan refuses what a simulated run would. With --zero 1-3 (dp x ep, with --cp and
--tp too: what expert_zero.py, context_expert_zero.py and expert_zero_tp.py run) the memory and the
gradient traffic are gpt_moe_zero.py's: the dense states (with --tp the rank's shares) sharded over the
D (x C) ranks of dp (x cp), each rank's experts' over the D/P (x C) ranks of edp (x cp),
reduce-scatters and all-gathers instead of the all-reduces; --zero with --pp is refused as train
refuses it. This file checks the question and words the answer.
"""

from __future__ import annotations

import json

from ..config import RunConfig, SimparError
from ..costmodel import hardware
from ..costmodel.gpt import model_flops_per_step
from ..costmodel.gpt_moe import param_counts
from ..costmodel.gpt_moe_tp import dense_shard
from ..costmodel.predict import predict_from_config
from ..units import fmt_si, fmt_time
from .plan_gpt import _count

PRECISION = {"fp32": ("fp32", "float32"), "fp64": ("fp32", "float64"), "mixed": ("mixed-bf16", "float32")}


def moe_config(a, shape) -> RunConfig:
    """The plan's question as the RunConfig `train` would run, checked by train's own rules
    (config.validate on dp x cp x tp x pp ranks, under --clock sim: the time is the simulated clock's
    closed form), so what a simulated run refuses, plan refuses in the same words."""
    from ..config.core import validate

    if a.precision not in PRECISION or a.optimizer not in ("sgd", "adam"):
        raise SimparError("plan --arch gpt: --precision fp32|fp64|mixed, --optimizer sgd|adam")
    precision, dtype = PRECISION[a.precision]
    cfg = RunConfig(
        arch="gpt",
        dataset="text",
        blocks=shape.layers,
        hidden=shape.hidden,
        heads=shape.heads,
        seq_len=shape.seq,
        vocab=shape.vocab,
        batch=a.batch,
        dp=a.dp,
        tp=a.tp,
        sp=a.sp,
        cp=a.cp,
        cp_algo=a.cp_algo,
        pp=a.pp,
        schedule=a.schedule,
        microbatches=a.microbatches,
        virtual_stages=a.virtual_stages,
        recompute=a.recompute,
        clock="sim",
        zero=a.zero,
        ep=a.ep,
        experts=a.experts,
        top_k=a.top_k,
        capacity_factor=a.capacity_factor,
        grad_accum=a.grad_accum,
        precision=precision,
        dtype=dtype,
        optimizer=a.optimizer,
        momentum=a.momentum,
        collectives=a.collectives,
        alltoall=a.alltoall,
    )
    return validate(cfg, a.dp * a.cp * a.tp * a.pp)


def plan_gpt_moe(cfg, hw) -> dict:
    """The balanced prediction of one step, and the figures the plan prints."""
    world = cfg.dp * cfg.cp * cfg.tp * cfg.pp
    p = predict_from_config(cfg, world, steps=1, hw=hw)  # no routing: a balanced router
    dense, mine = param_counts(cfg)
    dense = dense_shard(cfg) if cfg.tp > 1 else dense  # a tp rank's shards
    if cfg.pp > 1:  # the fullest stage's chunks
        from ..costmodel.gpt_moe_pipeline import stage_bounds, unit_params
        from ..costmodel.order import stage_chunks

        units, bounds = unit_params(cfg, cfg.tp), stage_bounds(cfg)
        V = cfg.virtual_stages if cfg.schedule == "interleaved" else 1
        stages = [
            [
                sum(units[u][i] for c in stage_chunks(cfg.schedule, cfg.pp, V, st) for u in range(*bounds[c]))
                for i in (0, 1)
            ]
            for st in range(cfg.pp)
        ]
        dense, mine = max(stages, key=sum)
    ranks = p["comm"]["ranks"]
    # the gradient traffic, op by op (ring all-reduces, or ZeRO's reduce-scatters and all-gathers): the
    # most any rank sends in one step (steps=1)
    model_ops = {op for r in ranks for op in r["by_op"] if op.startswith("model/")}
    grads = {op[6:]: max(r["by_op"].get(op, {"sent": 0})["sent"] for r in ranks) for op in sorted(model_ops)}
    a2a = max(sum(v["sent"] for k, v in r["by_op"].items() if k.startswith("activation/ep-")) for r in ranks)
    prec = "mixed" if cfg.precision != "fp32" else {"float64": "fp64"}.get(cfg.dtype, "fp32")
    step = p["time"]["step_s"]
    # MFU's numerator: the causal count of the dense model (model_flops_per_step, as plan --arch gpt
    # and the tour count it), the MLP K times and the router (what flops_per_step adds)
    L, h, s, V, E, K, B = cfg.blocks, cfg.hidden, cfg.seq_len, cfg.vocab, cfg.experts, cfg.top_k, cfg.batch
    useful = model_flops_per_step(B, s, L, h, V) + (K - 1) * 48 * B * s * L * h * h + 6 * B * s * L * h * E
    return {
        **p,
        "params_total": dense + cfg.blocks * cfg.experts * (8 * cfg.hidden**2 + 5 * cfg.hidden),
        "params_per_rank": {"non_expert": dense, "experts": mine},
        "alltoall_per_rank_per_step": a2a,
        "model_per_rank_per_step": p["comm"]["per_rank_per_step_max"]["model"],
        "model_by_op_per_rank_per_step": grads,
        # ZeRO's groups (gpt_moe_zero.groups): the dense states over dp x cp, the experts' over edp x cp
        "zero_groups": (
            {"non_expert": cfg.dp * cfg.cp, "experts": cfg.dp // cfg.ep * cfg.cp} if cfg.zero else {}
        ),
        "world": world,
        "model_flops_per_step": useful,
        "mfu": useful / (step * world * hw.peak_rate(prec)) if step > 0 else 0.0,
    }


def format_gpt_moe_plan(p: dict, cfg, shape, hw) -> list[str]:
    L, h, E, K, P, D = cfg.blocks, cfg.hidden, cfg.experts, cfg.top_k, cfg.ep, cfg.dp
    axes = "".join(f" x {name} {n}" for name, n in (("cp", cfg.cp), ("tp", cfg.tp), ("pp", cfg.pp)) if n > 1)
    axes = axes.replace(f"tp {cfg.tp}", f"tp {cfg.tp} + sp") if cfg.sp else axes
    mem = p["memory"]["max"]
    total = mem["params"] + mem["grads"] + mem["optimizer"] + mem["activations_peak"]
    limit = f" of {fmt_si(hw.memory_bytes)}" if hw.memory_bytes else ""
    t, per = p["time"], p["params_per_rank"]
    replicated = f"replicated{', its tp shards' if cfg.tp > 1 else ''}"
    if cfg.zero:  # which of the model states ZeRO-N shards (Rajbhandari et al. 2020, sec. 5)
        states = {1: "optimizer state", 2: "optimizer state and grads", 3: "optimizer state, grads, params"}
        g = p["zero_groups"]
        cp = " x cp" if cfg.cp > 1 else ""
        shards = "its tp shards; " if cfg.tp > 1 else ""
        replicated = (
            f"{shards}ZeRO-{cfg.zero}: {states[cfg.zero]} sharded over the {g['non_expert']} dp{cp} ranks"
        )
        experts = f", the experts' over their {g['experts']} edp{cp} ranks"
    else:
        experts = ""
    lines = [
        f"model: L={L} h={h} a={cfg.heads} s={cfg.seq_len} V={cfg.vocab}, every block's MLP swapped for "
        f"{E} experts (top-{K}, capacity factor {cfg.capacity_factor:g})  [{shape.source}]",
        f"parameters: {_count(p['params_total'])} in all; a token passes through {K} of {E} experts",
        f"layout: dp {D} x ep {P} (ep inside dp){axes} = {p['world']} ranks on {hw.name}"
        + (f", ZeRO-{cfg.zero}" if cfg.zero else "")
        + f"; batch {cfg.batch} sequences"
        + (f", {cfg.grad_accum} micro-steps" if cfg.grad_accum > 1 else ""),
        f"memory per rank: {fmt_si(total)}{limit} = params {fmt_si(mem['params'])} + grads "
        f"{fmt_si(mem['grads'])} + optimizer {fmt_si(mem['optimizer'])} + activations "
        f"{fmt_si(mem['activations_peak'])}; per rank {_count(per['non_expert'])} non-expert parameters "
        f"({replicated}) + {_count(per['experts'])} of its {E // P} experts per block{experts}"
        + (" (the fullest stage)" if cfg.pp > 1 else ""),
        f"FLOPs per step: {p['flops_per_step']:.3e} = the dense model's with the MLP's counted {K} times "
        f"(top-{K}) + the router's 6 B s L h E",
        f"all-to-all per rank per step: {fmt_si(p['alltoall_per_rank_per_step'])} (4 per block: dispatch, "
        f"combine and their gradients, (P-1)/P x n K h bytes each for a balanced router)",
        f"gradients per rank per step: {fmt_si(p['model_per_rank_per_step'])} ("
        + ", ".join(f"{op} {fmt_si(b)}" for op, b in p["model_by_op_per_rank_per_step"].items())
        + (
            "; ZeRO-3 gathers the params twice and reduce-scatters the grads once per micro-step"
            if cfg.zero == 3
            else "; as an all-reduce's bytes, in two halves"
            if cfg.zero
            else ""
        )
        + ")",
        f"step time: {fmt_time(t['step_s'])} (compute {fmt_time(t['compute_s'])}, all-to-alls, "
        f"gradient {'collectives' if cfg.zero else 'all-reduces'} "
        f"and waiting {fmt_time(t['comm_s'])}; balanced router, none dropped, as "
        "--clock sim would charge it)",
        f"MFU: {p['mfu']:.1%} of the dense peak (active FLOPs, the scores' causal half, / (step time x "
        "ranks x peak))",
    ]
    if cfg.capacity_factor < 1:
        lines.append(
            f"(capacity factor {cfg.capacity_factor:g} < 1: even a balanced router drops "
            f"{1 - cfg.capacity_factor:.0%} of the assignments; counted here as kept)"
        )
    return lines


def plan_gpt_moe_main(a, shape) -> int:
    names = {"mixed-fp16": "mixed", "mixed-bf16": "mixed", "float32": "fp32", "float64": "fp64"}
    a.precision = names.get(a.precision, a.precision)
    if a.compare or a.sweep:
        raise SimparError("--compare and --sweep do not cover --experts yet; plan one layout at a time")
    cfg = moe_config(a, shape)
    hw = hardware.load(a.hardware)
    p = plan_gpt_moe(cfg, hw)
    if a.json:
        print(json.dumps({**p, "model": shape.__dict__}, indent=2, default=str))
    else:
        print("\n".join(format_gpt_moe_plan(p, cfg, shape, hw)))
    return 0
