"""--recompute on an MoE pipeline chunk (parallel/pipeline/expert_stage.MoEChunkStack through
recompute.py), every expert local, float64, capacity dropping tokens:
  full       the re-run forward on the micro-step's N routes every token as the forward did: the same
             (token, slot) pairs kept per expert, so the same tokens dropped -- and a re-run on another
             micro-step's N (another capacity) would not, which is why expert_stage.py sets N first
  selective  each block's softmax output P dropped (a s per token row, 8 bytes) and rebuilt equal
"""

from __future__ import annotations

import numpy as np

from simpar.config.sections import Model
from simpar.model.gpt_moe import LOCAL
from simpar.parallel.base import HeldBytes, NonFiniteWatch
from simpar.parallel.pipeline import recompute
from simpar.parallel.pipeline.expert_stage import MoEChunkStack
from simpar.runtime.context import PLAIN

B, S, H, A, V, E = 3, 4, 8, 2, 11, 4
MODEL = Model(
    arch="gpt", blocks=2, hidden=H, heads=A, seq_len=S, vocab=V, dtype="float64", experts=E, top_k=2
)
MODEL.capacity_factor, MODEL.aux_loss_coef = 1.0, 0.1


def forward(N: int):
    """The whole model as one chunk: (stack, tokens, contexts of one forward on capacity for N tokens)."""
    stack = MoEChunkStack(MODEL, PLAIN, 0, MODEL.blocks + 2, range(E), LOCAL)
    stack.N = stack.B = N
    tokens = np.random.default_rng(7).integers(0, V, (B, S))
    return stack, tokens, stack.forward(tokens, HeldBytes(), NonFiniteWatch())[1]


def kept_pairs(contexts) -> list:
    """Per block, per expert: the (token row, slot) pairs it kept (MoEFFN.forward's `assigned`)."""
    return [[tuple(map(tuple, rows)) for rows in c.ctx[1][5]] for c in contexts[1:-1]]


def test_full_recompute_routes_and_drops_as_the_forward():
    stack, tokens, contexts = forward(B * S)
    routed = sum(len(t) for pairs in kept_pairs(contexts) for t, _ in pairs)
    assert routed < MODEL.blocks * B * S * MODEL.top_k  # tokens dropped by capacity
    saved = recompute.save("full", tokens, contexts)
    assert saved.held == tokens.nbytes
    assert kept_pairs(recompute.restore("full", saved, stack)) == kept_pairs(contexts)
    stack.N = B * S // 2  # another micro-step's capacity: other tokens dropped
    assert kept_pairs(recompute.restore("full", saved, stack)) != kept_pairs(contexts)


def test_selective_drops_each_blocks_softmax_and_rebuilds_it_equal():
    stack, tokens, contexts = forward(B * S)
    full = recompute.context_bytes(contexts)
    probs = [c.attn.probs.copy() for c in contexts[1:-1]]
    saved = recompute.save("selective", tokens, contexts)
    assert saved.held == full - MODEL.blocks * A * S * (B * S) * 8
    rebuilt = recompute.restore("selective", saved, stack)
    assert recompute.context_bytes(rebuilt) == full
    for c, P in zip(rebuilt[1:-1], probs):
        np.testing.assert_array_equal(c.attn.probs, P)
