"""Which transformer layout, and why: every way to split N GPUs into dp x cp x tp x pp for a gpt shape,
planned (gpt_plan.plan, and cp.plan_cp for cp > 1) and ranked -- layouts that fit the memory limit first,
then by step time. `simpar plan --arch gpt --compare --world N` prints it (report/plan_gpt_compare.py).

A candidate is kept when the shape allows it as `plan` would: tp divides the heads, pp is at most the
blocks, cp cuts the sequence into 2 cp equal chunks (and, for Ulysses, the a/tp heads of a tp rank
divide by cp), and the batch splits evenly over dp x micro-batches x accumulation steps (a rank gets
whole sequences). --sp, --zero, --recompute and the micro-batch count are the question's, for every
candidate (sp only where tp > 1, zero only without tp and pp, as `plan` and `train` allow them).
"""

from __future__ import annotations

from ..config import SimparError
from ..config.pipeline import schedule_problem
from .cp import plan_cp
from .gpt_plan import plan as gpt_plan


def gpt_factorizations(world: int) -> list[tuple[int, int, int, int]]:
    """Every (dp, cp, tp, pp) with dp cp tp pp = world."""
    divisors = [d for d in range(1, world + 1) if world % d == 0]
    return [
        (dp, cp, tp, world // (dp * cp * tp))
        for dp in divisors
        for cp in divisors
        for tp in divisors
        if world % (dp * cp * tp) == 0
    ]


def layout_problem(shape, batch: int, dp: int, cp: int, tp: int, pp: int, q: dict) -> str | None:
    """Why this split cannot run the question (None: it can); the module docstring's rules."""
    M = q["microbatches"] if pp > 1 else 1
    if shape.heads % tp:
        return "tp does not divide the heads"
    if pp > shape.layers:
        return "more stages than blocks"
    if cp > 1 and shape.seq % (2 * cp):
        return "cp does not cut the sequence into 2 cp equal chunks"
    if cp > 1 and q["cp_algo"] == "ulysses" and (shape.heads // tp) % cp:
        return "Ulysses: cp does not divide a tp rank's heads"
    if batch % (dp * M * q["grad_accum"]):
        return "the batch does not split into whole sequences"
    if q["zero"] and (tp > 1 or pp > 1):
        return "ZeRO with tp or pp"
    sched = q.get("schedule", "1f1b")
    if pp > 1 and schedule_problem(sched, pp, M, q.get("virtual_stages", 1), shape.layers):
        return f"--schedule {sched} cannot cut this model or batch over pp"
    return None


def rank_gpt_layouts(shape, batch: int, hw, world: int, limit: float | None, q: dict) -> tuple[list, int]:
    """(ranked plans, how many splits were invalid). `q`: sp, zero, microbatches, recompute, precision,
    optimizer, grad_accum, cp_algo, collectives, attention -- the question's knobs, the same for every
    candidate."""
    if not world or world < 1:
        raise SimparError("--compare needs --world N (the number of GPUs to split)")
    if world > 1 << 16:
        raise SimparError(f"--world {world} is too large for --arch gpt --compare (at most {1 << 16})")
    plans, invalid = [], 0
    for dp, cp, tp, pp in gpt_factorizations(world):
        if layout_problem(shape, batch, dp, cp, tp, pp, q):
            invalid += 1
            continue
        kw = dict(
            tp=tp,
            pp=pp,
            sp=q["sp"] and tp > 1,
            zero=q["zero"],
            microbatches=q["microbatches"],
            recompute=q["recompute"],
            precision=q["precision"],
            optimizer=q["optimizer"],
            grad_accum=q["grad_accum"],
            collectives=q.get("collectives", "ring"),
            attention=q.get("attention", "materialized"),
            schedule=q.get("schedule", "1f1b"),
            virtual_stages=q.get("virtual_stages", 1),
        )
        if cp > 1:
            plans.append(plan_cp(shape, batch, hw, cp, q["cp_algo"], dp=dp, **kw))
        else:
            p = gpt_plan(shape, batch, hw, dp, **kw)
            plans.append({**p, "layout": dict(p["layout"], cp=1), "cp_bytes_per_gpu": 0})
    if not plans:
        raise SimparError(
            f"no split of {world} GPUs into dp x cp x tp x pp fits this model and batch (tp must divide the "
            f"{shape.heads} heads, pp <= {shape.layers} blocks, the batch whole sequences per rank)"
        )

    def fits(p):
        return not limit or p["memory_per_gpu"]["total"] <= limit

    return sorted(plans, key=lambda p: (not fits(p), p["time"]["step_s"])), invalid
