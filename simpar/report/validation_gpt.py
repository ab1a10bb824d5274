"""The `gpt-step` points of `simpar validate`: a published end-to-end training run of a GPT against the
step time `simpar plan --arch gpt` predicts for it (costmodel/gpt_plan.py, its collectives priced
by plan_comm.py).

A point names the model (layers, hidden, heads, seq, vocab), the layout (gpus, tp, pp; dp is
gpus / (tp pp)), the global batch and the micro-batch size (in sequences). It is planned as the
source ran it: full activation recomputation (Narayanan et al. 2021, sec. 5.1: their Eq. 3 assumes
it), mixed precision, Adam, no ZeRO, and B / (dp b) micro-batches per step -- streamed through the
pipeline's 1F1B schedule when pp > 1, accumulated one after another when pp = 1 (Megatron-LM's
gradient accumulation), so that each carries b sequences as the source's did.

Which FLOPs on each side (the same count, so that the ratio is a ratio of step times): sources of
this kind print achieved teraFLOP/s per GPU = F / (step time x GPUs), F their Eq. 3,
96 B s l h^2 (1 + s/(6h) + V/(16 l h)): every matmul of the step, the recomputed forward included.
The prediction is F / (plan's step_s x GPUs) with the same F (gpt.flops_per_step, recompute
"full", which is Eq. 3), so predicted / published TFLOP/s = published / predicted step time.
Quantity `time` gives the plan's step_s itself, for a source (or your run) that printed seconds.
"""

from __future__ import annotations

from ..costmodel import gpt, gpt_plan
from ..errors import SimparError

INTS = ("layers", "hidden", "heads", "seq", "vocab", "tp", "pp", "batch", "microbatch")


def layout(point: dict) -> dict:
    """gpt_plan.plan's layout keywords for a point: dp, tp, pp and the micro-batches (see the docstring)."""
    gpus, tp, pp, batch = point["gpus"], point["tp"] or 1, point["pp"] or 1, point["batch"]
    mb = point["microbatch"] or 1
    if gpus < 1 or gpus % (tp * pp):
        raise SimparError(f"point {point['id']}: gpus {gpus} is not a multiple of tp x pp = {tp * pp}")
    dp = gpus // (tp * pp)
    if batch < 1 or batch % (dp * mb):
        raise SimparError(
            f"point {point['id']}: batch {batch} is not a multiple of dp x microbatch = {dp * mb}"
        )
    steps = batch // (dp * mb)  # micro-batches per step on each pipeline
    per_step = {"microbatches": steps} if pp > 1 else {"grad_accum": steps}
    return {"dp": dp, "tp": tp, "pp": pp, **per_step}


def step_values(point: dict, hw) -> tuple[dict, str]:
    """({"time": predicted step seconds, "tflops": Eq. 3 FLOPs / (step x GPUs) in FLOP/s}, how)."""
    missing = [k for k in ("layers", "hidden", "heads", "seq", "vocab", "batch") if not point.get(k)]
    if missing:
        raise SimparError(f"point {point['id']}: a gpt-step point needs {', '.join(missing)}")
    shape = gpt.Shape(point["layers"], point["hidden"], point["heads"], point["seq"], point["vocab"])
    kw = layout(point)
    recompute = point.get("recompute") or "full"
    plan = gpt_plan.plan(
        shape, point["batch"], hw, recompute=recompute, precision="mixed", optimizer="adam", **kw
    )
    step = plan["time"]["step_s"]
    flops = gpt.flops_per_step(point["batch"], shape.seq, shape.layers, shape.hidden, shape.vocab, recompute)
    how = f"plan dp{kw['dp']} tp{kw['tp']} pp{kw['pp']} m{kw.get('microbatches', kw.get('grad_accum'))}"
    return {"time": step, "tflops": flops / (step * point["gpus"])}, how
