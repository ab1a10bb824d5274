"""An MoE block's backward in two halves (model/gpt_moe_split.py, the zero-bubble pipelines' B and W)
against the fused one (gpt_moe.MoEBlockUnit.backward_moe) in float64, with capacity dropping tokens:
B alone returns the same dL/dx and touches no gradient; its queued W then adds the same gradients
(attention, LayerNorms, router, every expert)."""

from __future__ import annotations

import numpy as np

from simpar.model.gpt_build import gpt_units
from simpar.model.gpt_moe import LOCAL, MoEFFN
from simpar.model.mlp import deferred_weight_grads

B, S, H, A, V, E = 3, 4, 8, 2, 11, 4


class Cfg:
    blocks, hidden, heads, seq_len, vocab = 2, H, A, S, V
    experts, top_k, capacity_factor, aux_loss_coef = E, 2, 1.0, 0.1


def block_pass(split: bool):
    """(dx, the block's gradient vector, tokens dropped) of one forward and backward of block 1."""
    unit = gpt_units(Cfg)[1]
    flat = unit.init(3, np.float64)
    grad = np.zeros_like(flat)
    experts = dict(enumerate(zip(unit.expert_flats(flat), unit.expert_flats(grad))))
    ffn = MoEFFN(H, E, Cfg.top_k, Cfg.capacity_factor, Cfg.aux_loss_coef, experts, LOCAL)
    routed = []
    ffn.record = lambda H_, kept: routed.append(int(H_.sum() - kept.sum()))
    rng = np.random.default_rng(5)
    x, dy = rng.standard_normal((B * S, H)), rng.standard_normal((B * S, H))
    N = B * S
    _, _, ctx, _ = unit.forward_moe(flat[: unit.dense], x, ffn, N, N)
    dense, gdense = flat[: unit.dense], grad[: unit.dense]
    if not split:
        return unit.backward_moe(dense, gdense, ctx, dy, ffn), grad, routed[0]
    with deferred_weight_grads() as pending:
        dx = unit.backward_moe(dense, gdense, ctx, dy, ffn)
    assert len(pending) == 1 and not grad.any()  # one closure for the block; B added no gradient
    pending[0]()
    return dx, grad, routed[0]


def test_b_then_w_equals_the_fused_backward_with_tokens_dropped():
    dx, grad, dropped = block_pass(split=False)
    dx_split, grad_split, _ = block_pass(split=True)
    assert dropped > 0
    np.testing.assert_allclose(dx_split, dx, rtol=0, atol=1e-12 * np.abs(dx).max())
    np.testing.assert_allclose(grad_split, grad, rtol=0, atol=1e-12 * np.abs(grad).max())
    unit = gpt_units(Cfg)[1]
    router = slice(unit.dense - H * E, unit.dense)
    assert grad_split[router].any() and grad_split[unit.dense :].any()  # router and experts reached
