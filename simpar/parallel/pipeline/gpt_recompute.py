"""--recompute selective for --arch gpt's units: drop the attention's s^2 part, rebuild it in backward.

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", sec. 4.2)
observe that in a transformer block the attention's softmax output (and its dropout) is a s^2 b per
layer -- 5 a s / h of the 34 + 5 a s / h bytes per s b h of Table 2 -- yet cheap to compute again
from Q and K. So: keep every unit's context as it is, except each block's P = softmax(q k^T / sqrt(d)),
and in the backward compute P again from the kept q and k with the forward's own function
(softmax_probs, written as attention.attention_core_forward computes it: float32 inside under mixed
precision, rounded as the forward rounded it), so the numbers are those of the forward and every
layout still equals the serial run.
What this costs: one q k^T per block, 2 s^2 h FLOPs a sequence (causal, counted in full as
Narayanan et al. 2021 count it); attention over V is not redone (o is kept).
The embedding and the head keep everything (their contexts hold no s^2 term).
A cp block (parallel/context.py, --cp with --pp; with --tp its stack, context_tensor.py, on the tp
rank's a/T heads) drops its softmax part and rebuilds it itself
(context_attention.CPAttentionContext.drop_softmax, rebuild_softmax): the ring's log-sum-exp by running
the ring's forward again (its K/V hops are real messages again), Ulysses' P locally.
"""

from __future__ import annotations

import math

import numpy as np

from ...model.attention import causal_softmax
from ...model.mlp import wide


def softmax_probs(q, k):
    """P of attention.attention_core_forward, written the same way (float32 inside for half q, k;
    rounded back to their type), so the recomputed P equals the forward's bit for bit."""
    half = q.dtype
    qf, kf = wide(q), wide(k)
    scale = qf.dtype.type(1 / math.sqrt(q.shape[-1]))
    return causal_softmax((qf @ kf.transpose(0, 1, 3, 2)) * scale).astype(half, copy=False)


def save_selective(contexts: list) -> tuple[list, int]:
    """(the contexts with each block's P dropped, bytes they still hold). The dropped P is freed with
    the forward's scratch meter; the kept arrays are the forward's own (no copies)."""
    held = 0
    for ctx in contexts:
        attn = getattr(ctx, "attn", None)
        if attn is not None and hasattr(attn, "drop_softmax"):  # a cp block's (context_attention.py)
            attn.drop_softmax()
        elif attn is not None:
            attn.probs = np.empty(0, attn.q.dtype)  # dropped: 0 bytes (AttentionContext.nbytes)
        held += ctx.nbytes
    return contexts, held


def restore_selective(contexts: list, stack) -> list:
    """The contexts again, each block's P recomputed from its q and k (the clock charged for q k^T)."""
    for unit, ctx in zip(stack.units, contexts):
        attn = getattr(ctx, "attn", None)
        if attn is None:
            continue
        # a cp block (context.py), or a cp x tp stack's block (context_tensor.py: the stack holds the
        # cp group): the ring runs again, or Ulysses' P locally
        rebuild = getattr(unit, "rebuild_softmax", None) or getattr(stack, "rebuild_softmax", None)
        if rebuild is not None:
            rebuild(attn)
            continue
        attn.probs = softmax_probs(attn.q, attn.k)
        clock = unit.rt.clock
        if clock is not None:  # q k^T per head: (s x d) @ (d x s), batch * heads of them
            b, heads, s, d = attn.q.shape
            for _ in range(b * heads):
                clock.matmul(s, d, s)
    return contexts
