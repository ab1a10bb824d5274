"""The collectives of `simpar plan --arch gpt` (gpt_plan.plan, cp.plan_cp, --compare): tensor parallelism's
activation all-reduces and data parallelism's gradient traffic, priced as the closed form prices a
run's (chunktime.op_time: on GPU profiles NCCL's protocols, NVLink SHARP under --collectives auto,
the reduction inside the copy; alpha-beta-gamma for the other algorithms and on `local`).

Per step, on each GPU, none of it overlapped with compute (an upper bound, as the plan says):

  tp   per layer of a stage and per micro-batch, 4 all-reduces of b s h activations -- f and g of the
       attention and of the MLP, forward and backward (Megatron-LM, Shoeybi et al. 2019, sec. 3,
       Fig. 4) -- and 2 more under full recomputation, whose second forward runs f and g again
       (Korthikanti et al. 2022, sec. 5: selective recomputation re-runs only the attention core,
       which needs no communication); the vocabulary-parallel embedding's one (its forward; again
       under full recomputation) and, on the stage with the head, the head's one (its backward) and
       the loss's all-gather and all-reduce (as simpar's run: gpt_tp.py, gpt_time.tp_collectives).
       With --sp each all-reduce is a ring reduce-scatter plus a ring all-gather (Korthikanti et al.
       sec. 4.2.2: the same bytes), and once a step, after each unit's last backward, its LayerNorms'
       gradients are summed over tp by --collectives (sp replicates them but each rank saw only its
       part of the sequence: 4h a block, 2h for the head's LN_f; one all-reduce per unit, as simpar's
       run: gpt_time.sp_sync_ops; Megatron-LM coalesces them into one, a few latencies less).
  dp   without ZeRO one all-reduce of the stage's gradients (--collectives picks the algorithm; one
       call, as one bucket: a real run's buckets add a latency each, small beside the bytes at scale);
       ZeRO-1 and -2 a ring reduce-scatter of the gradients and a ring all-gather of the updated
       parameters (Rajbhandari et al. 2020, sec. 5: the all-reduce's bytes); ZeRO-3 the
       reduce-scatter on every accumulation step and the all-gather twice on each, for the forward and
       again for the backward (sec. 5.3: 1.5x the all-reduce's bytes per step) -- as simpar's own
       --zero 3 runs (parallel/zero.py, costmodel/gpt.py's predict_run).

  pp   per micro-batch on a stage, its activations sent on to the next stage and its input gradient
       back, b s h each, point to point over the pp link (alpha + bytes x beta, as the simulated
       clock sends them: steptime.py); under tp each rank sends 1/t of it and the receiving stage
       all-gathers the rows over tp (Megatron-LM's scatter/gather, Narayanan et al. 2021 sec. 4.1;
       with --sp the rows are sharded already and stay so -- simpar's own run without --sp sends all
       b s h from every tp rank instead). Not overlapped, and stretched by 1F1B's bubble like the
       passes: fill and drain are chains of sends too.

Every collective is priced once, on the critical path its algorithm's Cost gives (collectives.py: the
same for every rank of the group), over the group's link (hardware.group_link).
"""

from __future__ import annotations

from types import SimpleNamespace

from .chunktime import collective_gamma, ring_algorithm, seconds
from .collectives import ALLREDUCE, ring_allgather, ring_reduce_scatter, to_bytes
from .hardware import group_link


def allreduce_seconds(hw, link, collectives: str, n: int, p: int, bpe: int) -> float:
    """One all-reduce of n elements of bpe bytes over p ranks by `collectives`, on `link`."""
    if p == 1 or n < 1:
        return 0.0
    cost = to_bytes(ALLREDUCE[collectives](n, p, 0), bpe)
    ring = ring_algorithm(SimpleNamespace(collectives=collectives))
    return seconds(cost, link, collective_gamma(hw), ring=ring, nvls=collectives == "auto")


def ring_half_seconds(hw, link, n: int, p: int, bpe: int, gather: bool) -> float:
    """One ring all-gather (`gather`) or reduce-scatter of n elements over p ranks (NCCL's ring)."""
    if p == 1 or n < 1:
        return 0.0
    cost = to_bytes((ring_allgather if gather else ring_reduce_scatter)(n, p, 0), bpe)
    return seconds(cost, link, collective_gamma(hw), ring=True)


def tp_seconds(
    hw, dp: int, tp: int, pp: int, elems: int, bpe: int, calls: int, sp: bool, coll: str, loss_rows: int = 0
) -> float:
    """`calls` tensor-parallel all-reduces of `elems` elements (or, with sp, reduce-scatter +
    all-gather pairs) on the tp group's link; with `loss_rows` R, the vocabulary-parallel loss's too
    (an all-gather of t R and an all-reduce of 2 R numbers, float32 under mixed precision: gpt_tp.py)."""
    if tp == 1:
        return 0.0
    link = group_link(hw, "tp", dp, tp, pp)
    if sp:  # each all-reduce as Korthikanti's reduce-scatter + all-gather pair
        one = sum(ring_half_seconds(hw, link, elems, tp, bpe, gather) for gather in (False, True))
    else:
        one = allreduce_seconds(hw, link, coll, elems, tp, bpe)
    loss = 0.0
    if loss_rows:
        wide = 4 if bpe == 2 else bpe
        loss = ring_half_seconds(hw, link, tp * loss_rows, tp, wide, True)
        loss += allreduce_seconds(hw, link, coll, 2 * loss_rows, tp, wide)
    return calls * one + loss


def sp_sync_seconds(
    hw, dp: int, tp: int, pp: int, h: int, blocks: int, head: bool, bpe: int, coll: str
) -> float:
    """--sp's once-a-step LayerNorm-gradient all-reduces on a stage (the module docstring's tp line):
    4h elements for each of its `blocks`, 2h for the head's LN_f when the stage holds it."""
    if tp == 1:
        return 0.0
    link = group_link(hw, "tp", dp, tp, pp)
    one_block = allreduce_seconds(hw, link, coll, 4 * h, tp, bpe)
    return blocks * one_block + (allreduce_seconds(hw, link, coll, 2 * h, tp, bpe) if head else 0.0)


def pp_seconds(hw, dp: int, tp: int, pp: int, elems: int, bpe: int, sp: bool) -> float:
    """One micro-batch's two pipeline transfers on a stage (the module docstring's pp line): the
    activations of `elems` = b s h elements forward and their gradient backward."""
    if pp == 1 or elems < 1:
        return 0.0
    link = group_link(hw, "pp", dp, tp, pp)
    one = link.alpha + -(-elems // tp) * bpe * link.beta
    if tp > 1 and not sp:  # Megatron's gather of the scattered rows, inside the receiving stage
        one += ring_half_seconds(hw, group_link(hw, "tp", dp, tp, pp), elems, tp, bpe, True)
    return 2 * one


def dp_seconds(hw, dp: int, tp: int, pp: int, params: int, grad_bpe: int, param_bpe: int, zero: int,
               accum: int, coll: str) -> float:  # fmt: skip
    """A stage's gradient traffic over its dp group per step (the module docstring's dp line)."""
    if dp == 1:
        return 0.0
    link = group_link(hw, "dp", dp, tp, pp)
    if zero == 0:
        return allreduce_seconds(hw, link, coll, params, dp, grad_bpe)
    scatter = ring_half_seconds(hw, link, params, dp, grad_bpe, False)
    gather = ring_half_seconds(hw, link, params, dp, param_bpe, True)
    if zero < 3:
        return scatter + gather
    return accum * (scatter + 2 * gather)
