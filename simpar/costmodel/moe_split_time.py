"""The zero-bubble halves of MoE blocks on pipeline stages (--schedule zb-h1, zb-v; with --tp T [--sp] or
--cp C [--tp T]) as the simulated clock charges them (model/moe_charges.py's charge_attention_half and
charge_expert_half, model/gpt_moe_split.py, parallel/expert_tensor_split.py): what
gpt_moe_pipeline_time.py runs for a chunk's B and W steps. Under --tp the attention's matmuls and
passes are this rank's share (h/T wide, a/T heads), the MoE part whole on every tp rank, and B ends each
unit with its blocking tp collective (the head's f, each block's attention f).

Qi et al. 2023 ("Zero Bubble Pipeline Parallelism", sec. 2): B is the gradient with respect to the
input, W the weights' gradients. Per MoE block on a rank of n token rows, A kept assignments sent and
r_e rows received by each of its experts (matmuls at the FLOP rate, m = bytes per element x the
stream's seconds per byte):
  B  4h A m (the gates' gradients), ep-combine-grad, each expert 16 r_e h^2 + 17 r_e h m,
     ep-dispatch-grad, 3h A m (adding dx back) + the router's dlogits Wr^T 2 n E h,
     the attention's dx 8 n h^2 + scores 8 n s h + its memory passes (moe_charges' backward elements)
  W  each expert that received rows 16 r_e h^2 + 3 (8h^2 + 5h) m, the router's x^T dlogits 2 n h E,
     the attention's dW 8 n h^2 + 3 m per dense parameter of the block
the head: B 2 n h V + 10 n h m, W 2 n h V + 3 m per parameter (gpt.HeadUnit.charge_half); the
embedding: no B, its whole backward in W (model/gpt_split.py). The all-to-alls stay in B: a W step
sends nothing and waits for nothing. With --cp the attention core's hops stay in B too (context.py's
attend_core_backward: the ring's K/V hops and dK/dV sums, or Ulysses' all-to-alls; MoEWork.cp_attention,
after the router's dlogits, before the attention's own dx), its score terms priced hop by hop there.
"""

from __future__ import annotations

from .gpt_moe_time import (  # model/moe_charges.py's, written again there
    ACCUMULATE,
    ATTN_BWD_BIAS,
    ATTN_BWD_SCORES,
    ATTN_BWD_SHARD,
    ATTN_BWD_WHOLE,
    EXPERT_BWD_ELEMS,
    GATE_GRAD_ELEMS,
    SCATTER_ELEMS,
)
from .gpt_time import HEAD_BWD_ELEMS
from .moe_tp_rounds import tp_sync


def _charge(now, compute, w, seconds):
    now[w] += seconds
    compute[w] += seconds


def backward_input(work, now, compute, ms, lo: int, hi: int) -> None:
    """B of units hi-1..lo on every rank of the stage: the all-to-alls between its pieces, tp's blocking
    collectives (the head's f, each block's attention f) after its compute."""
    cfg, W, L, T = work.cfg, work.lay.W, work.cfg.blocks, work.lay.T
    h, E, a, keys, r = cfg.hidden, cfg.experts, cfg.heads, work.keys, work.rate
    hl, al, m = h // T, a // T, work.bpe * work.stream
    for u in reversed(range(lo, hi)):
        if u == 0:  # the embedding: no B
            continue
        if u == L + 1:  # the head: dlogits Wout^T, LN_f's backward
            for w in range(W):
                n = ms["n"][w]
                Rl = n // T if cfg.sp else n  # LN_f's rows: --sp the row shard
                _charge(now, compute, w, 2 * n * h * (cfg.vocab // T) / r + HEAD_BWD_ELEMS * Rl * h * m)
            tp_sync(work, now, ms, "head-backward")  # the head's f (vocab_parallel.py)
            continue
        A, received = work.routed(ms, u - 1)
        kept = ms["kept"][u - 1]
        for w in range(W):
            _charge(now, compute, w, GATE_GRAD_ELEMS * A[w] * h * m)
        work.all_to_all(now, kept, False)  # ep-combine-grad
        for w in range(W):
            experts = sum(16 * x * h * h / r + EXPERT_BWD_ELEMS * x * h * m for x in received[w] if x)
            _charge(now, compute, w, experts)
        work.all_to_all(now, kept, True)  # ep-dispatch-grad
        for w in range(W):
            _charge(now, compute, w, SCATTER_ELEMS * A[w] * h * m + 2 * ms["n"][w] * E * h / r)
        work.cp_attention(now, ms["b"], True)  # --cp: the core's hops (attend_core_backward), in B
        for w in range(W):
            n = ms["n"][w]
            whole = n // T if cfg.sp else n  # LayerNorms and residuals: --sp the row shard
            per_row = ATTN_BWD_BIAS * h + ATTN_BWD_SHARD * hl + ATTN_BWD_SCORES * al * keys
            elems = ATTN_BWD_WHOLE * h * whole + per_row * n
            attention = 2 * n * (4 * h * hl + 4 * hl * keys) / r + elems * m
            _charge(now, compute, w, attention)
        tp_sync(work, now, ms, "block")  # attention's f


def weight(work, now, compute, ms, lo: int, hi: int) -> None:
    """W of units hi-1..lo on every rank: compute only, no message."""
    cfg, W, L, T = work.cfg, work.lay.W, work.cfg.blocks, work.lay.T
    h, E, r, m = cfg.hidden, cfg.experts, work.rate, work.bpe * work.stream
    for u in reversed(range(lo, hi)):
        if u == 0:  # the embedding's whole backward (and its tp collective, none without --sp)
            for w in range(W):
                _charge(now, compute, w, ms["units"][w][1][0])
            tp_sync(work, now, ms, "embed-backward")
            continue
        for w in range(W):
            n = ms["n"][w]
            if u == L + 1:
                _charge(now, compute, w, 2 * n * h * (cfg.vocab // T) / r + ACCUMULATE * work.edge[1] * m)
            else:
                _, received = work.routed(ms, u - 1)
                experts = sum(
                    16 * x * h * h / r + ACCUMULATE * (8 * h * h + 5 * h) * m for x in received[w] if x
                )
                dense = 2 * n * h * E / r + 8 * n * h * (h // T) / r + ACCUMULATE * work.dense_block * m
                _charge(now, compute, w, experts + dense)
