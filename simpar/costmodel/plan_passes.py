"""The memory-bound work of `simpar plan --arch gpt` (gpt_plan.plan): what a GPU does besides its matmuls --
LayerNorms, residual adds, GeLU, the scale-mask-softmax over every layer's a s^2 scores, the loss over
b s V logits, accumulating gradients, the optimizer's sweeps -- at the profile's memory bandwidth, plus
a call overhead per unit.

The counts are the ones the simulated clock charges simpar's own run of the same model (gpt_time.py's
unit_seconds and optimizer_seconds, whose docstring lists them per unit: e.g. a block's forward reads
and writes 50 R h + 6 R a s elements, R = b s rows), called here with an infinite FLOP rate so that
only the memory passes and the calls are left: one set of counts, so that the plan of a layout simpar
can run agrees with its simulated step. They are simpar's unfused NumPy block's; Megatron-LM fuses
bias + GeLU and scale + mask + softmax (fewer bytes) but runs dropout (more), so at scale they are an
estimate. Held to Narayanan et al. 2021's Table 1 by `simpar validate` (docs/validation.md): without
them the plan's step was 0.52-0.74 of Megatron-LM's published ones.

Per step, on the average stage: each micro-batch's forward, loss and backward (the forward twice
under full recomputation, the loss once), over the L blocks, the embedding and the head divided by
the pp stages, every one of the K M micro-batches stretched by 1F1B's bubble (M + pp - 1)/M like the
matmuls; then the optimizer once over the parameters this GPU updates (its ZeRO shard).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

from .gpt_time import clock_rates, optimizer_seconds, unit_seconds


def unit_passes(shape, b: float, hw, dp: int, tp: int, pp: int, sp: bool, precision: str, bpe: int,
                recompute: str, scores: bool = True, optimizer: str = "sgd"):  # fmt: skip
    """Each unit's memory passes and calls per micro-batch on one GPU (the embedding, the L blocks, the
    head: the forward twice under full recomputation, and the backward), the loss's, and the config and
    stream rate they were priced with -- gpt_time.unit_seconds at an infinite FLOP rate. b: sequences
    per micro-batch, bpe: bytes per activation. `scores`: the attention's a s^2 scores go through
    memory (simpar's attention.py, Megatron-LM's softmax kernels); False where they stay on chip (cp's
    ring, blockwise like FlashAttention: cp.py) -- unit_seconds then gets no heads, which leaves
    exactly its per-score terms out."""
    L, h, s, V = shape.layers, shape.hidden, shape.seq, shape.vocab
    cfg = SimpleNamespace(
        hidden=h, heads=shape.heads if scores else 0, seq_len=s, vocab=V, tp=tp, sp=sp, blocks=L,
        optimizer=optimizer, momentum=True, kernels="numpy",
    )  # fmt: skip
    _, stream, overhead = clock_rates(hw, precision, min(dp * tp * pp, hw.devices_per_node))
    block = 12 * h * h // tp + 7 * h // tp + 6 * h  # one tp rank's share of a block (gpt_plan.stage_params)
    sizes = [V * h // tp + s * h] + [block] * L + [2 * h + V * h // tp]
    fwd, bwd, loss_s = unit_seconds(cfg, max(1, round(b * s)), sizes, bpe, math.inf, stream, overhead)
    twice = 2 if recompute == "full" else 1
    return [f * twice + g for f, g in zip(fwd, bwd)], loss_s, cfg, stream


def memory_bound_seconds(
    shape, b: float, hw, dp: int, tp: int, pp: int, sp: bool, zero: int, microbatches: int,
    recompute: str, precision: str, optimizer: str, grad_accum: int, bpe: int, rank_params: int,
    scores: bool = True, stretch: float | None = None,
) -> float:  # fmt: skip
    """Seconds of memory passes and calls in one step on one GPU (module docstring; unit_passes says
    what b, bpe and `scores` are); rank_params: the parameters of this GPU's stage shard. `stretch`:
    the schedule's bubble, (M + pp - 1)/M (1F1B) unless given."""
    passes, loss_s, cfg, stream = unit_passes(shape, b, hw, dp, tp, pp, sp, precision, bpe, recompute,
                                              scores, optimizer)  # fmt: skip
    M = microbatches if pp > 1 else 1
    stretch = (M + pp - 1) / M if stretch is None else stretch  # the schedule's bubble (gpt_plan.plan)
    passes_s = (sum(passes) + loss_s) / pp * M * grad_accum * stretch
    updated = rank_params / (dp if zero >= 1 else 1)
    return passes_s + optimizer_seconds(cfg, updated, bpe, stream)


def stage_imbalance_seconds(
    shape, b: float, hw, dp: int, tp: int, pp: int, sp: bool, microbatches: int, recompute: str,
    precision: str, grad_accum: int, bpe: int, block_s: float, head_s: float, scores: bool = True,
) -> float:  # fmt: skip
    """What 1F1B's slowest stage adds to the average stage's step (gpt_plan.plan prices the average):
    with per-micro-batch work w_s on stage s (its blocks' matmuls and memory passes; the first stage's
    embedding; the last stage's head, loss and their passes), the pipeline's step is about
    sum_s w_s + (M - 1) max_s w_s -- fill and drain pass every stage once, the steady state runs at the
    slowest one's pace (Narayanan et al. 2021, sec. 2.2, with unequal stages) -- against the average's
    mean(w) (M + p - 1): K (M - 1) (max w - mean w) more. The L blocks are split evenly, the first
    L mod p stages taking one more (Megatron-LM's layers per stage); `block_s` and `head_s` are one
    block's and the head's matmul seconds per micro-batch on one GPU."""
    M = microbatches if pp > 1 else 1
    if pp == 1 or M == 1:
        return 0.0
    L = shape.layers
    passes, loss_s, _, _ = unit_passes(shape, b, hw, dp, tp, pp, sp, precision, bpe, recompute, scores)
    work, first = [], 1
    for stage in range(pp):
        n = L // pp + (1 if stage < L % pp else 0)
        w = sum(passes[first : first + n]) + n * block_s
        w += passes[0] if stage == 0 else 0.0
        w += passes[-1] + loss_s + head_s if stage == pp - 1 else 0.0
        work.append(w)
        first += n
    return grad_accum * (M - 1) * (max(work) - sum(work) / pp)
