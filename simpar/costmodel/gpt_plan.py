"""`simpar plan --arch gpt`: memory per GPU, FLOPs, step time and MFU of a published shape on any layout.

    python -m simpar plan --arch gpt --model gpt3-175b --dp 8 --tp 8 --pp 16 --batch 1536 \
        --microbatches 96 --sp --recompute selective --precision mixed --optimizer adam \
        --hardware ib-cluster [--attention flash] [--schedule interleaved --virtual-stages 2]

gpt.py holds the transformer's formulas (parameters, FLOPs, Korthikanti's activation bytes, each with its
source); this file puts them together for one layout, with the collectives priced by plan_comm.py and
the memory-bound work (and what the slowest pipeline stage adds) by plan_passes.py. cp.py's plan_cp and
gpt_compare.py build on `plan`.
"""

from __future__ import annotations

import math

from . import plan_comm, plan_passes
from .gpt import (
    Shape,
    flops_per_step,
    korthikanti_layer_bytes,
    model_flops_per_step,
    narayanan_params,
    param_count,
)
from .spec import PRECISIONS

# plan --attention: simpar's attention.py, or a FlashAttention kernel
ATTENTION = ("materialized", "flash")
# plan --schedule with --arch gpt
PLANNED_SCHEDULES = ("1f1b", "gpipe", "interleaved")


def score_flops_per_step(B: int, s: int, L: int, h: int, recompute: str, attention: str) -> float:
    """The score products (q k^T and P v, forward and backward) inside the hardware's FLOPs: every
    score, as attention.py computes them, 4 s^2 h per sequence and block forward and 8 backward (12;
    selective recomputation 14, q k^T again; full 16, the forward again); or a FlashAttention kernel's
    causal half (Dao 2023, FlashAttention-2; its benchmark_flash_attention.py: a causal forward of
    4 s^2 h / 2, the backward 2.5x it: S and P rebuilt from the log-sum-exp, then dV, dP, dQ, dK), 7,
    or 9 with full recomputation's second forward -- selective recomputation has nothing left to redo."""
    if attention == "flash":
        return (9 if recompute == "full" else 7) * B * s * s * L * h
    return {"full": 16, "selective": 14}.get(recompute, 12) * B * s * s * L * h


def flash_flops_per_step(B: int, s: int, L: int, h: int, V: int, recompute: str = "none") -> float:
    """The hardware's FLOPs with a FlashAttention kernel: flops_per_step's score products exchanged for
    the kernel's (score_flops_per_step)."""
    whole = score_flops_per_step(B, s, L, h, recompute, "materialized")
    return (
        flops_per_step(B, s, L, h, V, recompute)
        - whole
        + score_flops_per_step(B, s, L, h, recompute, "flash")
    )


# -- a plan for a published shape ---------------------------------------------------------------------


def model_states_per_param(precision: str, optimizer: str, momentum: bool = True) -> tuple[int, int, int]:
    """(param, grad, optimizer) bytes per parameter (spec.PRECISIONS: mixed Adam 2, 2, 12)."""
    prec = PRECISIONS[precision]
    return prec.param, prec.grad, prec.optimizer[(optimizer, momentum)]


def stage_params(shape: Shape, t: int, p: int) -> int:
    """Parameters on the fullest GPU: the first stage's ceil(L/p) blocks under tp (12h^2/t + 7h/t
    sharded, 4 LN + 2 row-parallel biases 6h replicated) and the vocab-parallel embedding V h/t +
    positions s h; the head (2h + V h/t) too when p = 1."""
    L, h, s, V = shape.layers, shape.hidden, shape.seq, shape.vocab
    block = 12 * h * h // t + 7 * h // t + 6 * h
    first = math.ceil(L / p) * block + V * h // t + s * h
    return first + (2 * h + V * h // t if p == 1 else 0)


def plan(
    shape: Shape,
    batch: int,
    hw,
    dp: int = 1,
    tp: int = 1,
    pp: int = 1,
    sp: bool = False,
    zero: int = 0,
    microbatches: int = 1,
    recompute: str = "none",
    precision: str = "mixed",
    optimizer: str = "adam",
    grad_accum: int = 1,
    collectives: str = "ring",
    materialized_scores: bool = True,
    attention: str = "materialized",
    schedule: str = "1f1b",
    virtual_stages: int = 1,
) -> dict:
    """Memory per GPU, FLOPs per step, step time and MFU of `shape` on dp x tp x pp GPUs of `hw`.

    Time: each GPU's share of the step's matmul FLOPs at the profile's rate, stretched by the pipeline
    bubble (M + p - 1)/M (1F1B, Narayanan et al. 2021 sec. 2.2); its memory-bound work (LayerNorms,
    softmax, GeLU, the loss, the optimizer: plan_passes.py), stretched alike -- both on the average
    stage, plus what the slowest stage adds (the last, with the head and the loss:
    plan_passes.stage_imbalance_seconds); plus, not overlapped, tensor
    parallelism's 4 all-reduces of b s h per layer per micro-batch (6 under full recomputation), the
    pipeline's sends of b s h each way per micro-batch (stretched by the bubble too), and the stage's
    gradient traffic over dp (an all-reduce by `collectives`, or ZeRO's halves), each priced as a
    run's collectives are (plan_comm.py). Activations: the first stage holds min(p, M) micro-batches of
    its ceil(L/p) layers under 1F1B (Korthikanti et al. 2022, sec. 4.2.3).

    `schedule` (pp > 1): 1f1b; gpipe, the same bubble with all M micro-batches' activations in flight
    (Huang et al. 2019); interleaved with v = `virtual_stages` chunks a GPU, the bubble (p - 1)/(v M)
    and v times the sends (Narayanan et al. 2021, sec. 2.2.2), the first stage holding
    1 + (p - 1)/(p v) times 1F1B's activations (Korthikanti et al. 2022, sec. 4.2.3).

    `attention` "flash": a FlashAttention kernel in place of simpar's attention.py -- the causal half of
    the scores computed (flash_flops_per_step), none kept (korthikanti_layer_bytes' flash) and none
    through memory (materialized_scores off): what Megatron-LM and most trainers run today, for
    what-ifs simpar's own run does not make."""
    L, h, a, s, V = shape.layers, shape.hidden, shape.heads, shape.seq, shape.vocab
    world = dp * tp * pp
    M = microbatches if pp > 1 else 1
    b = batch / (dp * M * grad_accum)  # sequences per micro-batch
    pb, gb, kb = model_states_per_param(precision, optimizer)
    P_gpu = stage_params(shape, tp, pp)
    weights = P_gpu * pb / (dp if zero >= 3 else 1)
    grads = P_gpu * gb / (dp if zero >= 2 else 1)
    opt = P_gpu * kb / (dp if zero >= 1 else 1)
    if pp > 1 and schedule not in PLANNED_SCHEDULES:
        raise ValueError(f"schedule {schedule!r}: one of {', '.join(PLANNED_SCHEDULES)}")
    v = virtual_stages if schedule == "interleaved" and pp > 1 else 1
    in_flight = M if schedule == "gpipe" else min(pp, M) * (1 + (pp - 1) / (pp * v) if v > 1 else 1)
    if attention not in ATTENTION:
        raise ValueError(f"attention {attention!r}: one of {', '.join(ATTENTION)}")
    flash = attention == "flash"
    materialized_scores = materialized_scores and not flash
    act_layer = korthikanti_layer_bytes(s, b, h, a, tp, sp, recompute, flash)
    activations = math.ceil(L / pp) * in_flight * act_layer * PRECISIONS[precision].act / 2
    model_flops = model_flops_per_step(batch, s, L, h, V)  # causal: the same for every layout
    hw_flops = (flash_flops_per_step if flash else flops_per_step)(batch, s, L, h, V, recompute)
    rate = hw.flop_rate(precision) * hw.compute_share(min(world, hw.devices_per_node))  # local: shared cores
    stretch = (v * M + pp - 1) / (v * M)  # the bubble: (M + p - 1)/M, interleaved (p - 1)/(v M) over 1
    compute_s = hw_flops / world / rate * stretch  # the bubble stretches each pass
    # tp's activation all-reduces and dp's gradient traffic, as a run's are priced (plan_comm.py)
    # per micro-batch on the first stage: its blocks' f and g, the embedding's (twice under full
    # recomputation); with pp 1 the head's and the loss's too (plan_comm.py's docstring)
    full = recompute == "full"
    per_micro = (6 if full else 4) * math.ceil(L / pp) + (2 if full else 1) + (1 if pp == 1 else 0)
    elems, rows = max(1, round(b * s * h)), max(1, round(b * s)) if pp == 1 else 0
    tp_s = (
        M
        * grad_accum
        * plan_comm.tp_seconds(
            hw, dp, tp, pp, elems, PRECISIONS[precision].act, per_micro, sp, collectives, rows
        )
    )
    if sp:  # the stage's LayerNorm gradients, summed over tp once a step (plan_comm.sp_sync_seconds)
        tp_s += plan_comm.sp_sync_seconds(
            hw, dp, tp, pp, h, math.ceil(L / pp), pp == 1, PRECISIONS[precision].act, collectives
        )
    # pipeline sends chain through fill and drain as the passes do; interleaved: v boundaries a stage
    sends = v * plan_comm.pp_seconds(hw, dp, tp, pp, elems, PRECISIONS[precision].act, sp)
    pp_s = M * grad_accum * sends * stretch
    dp_s = plan_comm.dp_seconds(hw, dp, tp, pp, P_gpu, gb, pb, zero, grad_accum, collectives)
    # the memory passes between the matmuls, as the simulated clock charges simpar's run (plan_passes.py)
    memory_s = plan_passes.memory_bound_seconds(
        shape, b, hw, dp, tp, pp, sp, zero, microbatches, recompute, precision, optimizer, grad_accum,
        PRECISIONS[precision].act, P_gpu, materialized_scores, stretch,
    )  # fmt: skip
    # 1F1B runs at its slowest stage's pace: the head and the loss make the last one heavier
    micro_gpu = dp * tp * M * grad_accum  # micro-batches a step, times the tp shards of each
    head_s = 6 * batch * s * h * V / micro_gpu / rate  # the head's matmuls, forward and backward
    imbalance_s = plan_passes.stage_imbalance_seconds(
        shape, b, hw, dp, tp, pp, sp, microbatches, recompute, precision, grad_accum,
        PRECISIONS[precision].act, (hw_flops - 6 * batch * s * h * V) / L / micro_gpu / rate, head_s,
        materialized_scores,
    )  # fmt: skip
    step_s = compute_s + memory_s + imbalance_s + tp_s + pp_s + dp_s
    peak = hw.peak_rate(precision)  # the datasheet's dense peak (local: its measured rate)
    return {
        "model": shape,
        "layout": {
            "dp": dp,
            "tp": tp,
            "pp": pp,
            "sp": sp,
            "zero": zero,
            "microbatches": M,
            "grad_accum": grad_accum,
            "recompute": recompute,
            "collectives": collectives,
            "attention": attention,
            "schedule": schedule if pp > 1 else "none",
            "virtual_stages": v,
        },
        "bubble_stretch": stretch,
        "world": world,
        "params": param_count(L, h, s, V),
        "params_tied": param_count(L, h, s, V, tied=True),
        "params_narayanan": narayanan_params(L, h, s, V),
        "params_per_gpu": P_gpu,
        "memory_per_gpu": {
            "params": weights,
            "grads": grads,
            "optimizer": opt,
            "activations": activations,
            "total": weights + grads + opt + activations,
        },
        "activation_per_layer": act_layer,
        "flops_per_step": model_flops,
        "hardware_flops_per_step": hw_flops,
        # attention.py's; a FlashAttention kernel's; cp's ring: its causal blocks (cp.py)
        "attention_scores": "the causal half, on chip (FlashAttention)" if flash else "all s^2, masked",
        "time": {
            "step_s": step_s,
            "compute_s": compute_s,
            "memory_s": memory_s,
            "imbalance_s": imbalance_s,
            "tp_s": tp_s,
            "pp_s": pp_s,
            "dp_s": dp_s,
        },
        "mfu": model_flops / (step_s * world * peak),
        "precision": precision,
        "hardware": hw.name,
    }
