"""The backward of an MoE block (gpt_moe.py) in two halves, for the zero-bubble pipelines (zb-h1, zb-v).

Qi et al. 2023 ("Zero Bubble Pipeline Parallelism", sec. 2) split each layer's backward into B, the
gradient with respect to its input, and W, its weights' gradients, which nobody waits for. gpt_split.py
does it for the dense block; an MoE block is the same chain with the MLP swapped for the routed experts:

  B  each expert e on the rows it received: du = dout W2_e^T, dz = gelu'(du), dx_e = dz W1_e^T -- between
     the two backward all-to-alls (ep-combine-grad, ep-dispatch-grad: both on dL/dx's path, so in B);
     the router's dlogits (moe.router_dlogits) and its dx = dlogits Wr^T; then LN2's dx, the residual,
     do = dx2 Wo^T, the attention core's dq dk dv (the s^2 part), dh1, LN1's dx
  W  dW2_e += u^T dout, dc2_e += sum dout, dW1_e += x_e^T dz, dc1_e += sum dz for each local expert;
     dWr += h2^T dlogits; LayerNorms' gamma and beta, Wo, Wq, Wk, Wv and their biases as gpt_split.py

No message moves in W, so a zero-bubble MoE stage sends exactly the fused backward's bytes. Together the
halves compute what MoEFFN.backward and MoEBlockUnit.backward_moe compute (float64: equal to rounding).
The block queues ONE closure (its experts' and router's W passes inside it), as gpt_split.py's units do.
--clock sim: each half charges its share (moe_charges.charge_attention_half, charge_expert_half, the
router's two matmuls), B when it runs, W inside the closure; the routing passes stay in
MoEFFN.backward (B). Under --tp the attention half is parallel/expert_tensor_split.py's.
"""

from __future__ import annotations

from . import moe_charges as mc
from .gpt_split import _add_weight_grads, _dot, _layernorm_dx
from .mlp import ACTIVATIONS, wide
from .moe import router_dlogits


def expert_backward_input(ffn, e: int, c, dout, weight_passes: list):
    """dL/dx of expert e on its received rows (B); its four gradients queued on `weight_passes` (W)."""
    if c is None:  # no row reached this expert
        return dout[:0]
    W1, _, W2, _ = ffn.views(ffn.experts[e][0])
    half = dout.dtype
    du = _dot(dout, W2.T, half)
    dz = ACTIVATIONS["gelu"][1](wide(du), wide(c.z), wide(c.u))
    dx = _dot(dz, W1.T, half)
    clock = ffn.rt.clock
    if clock is not None:
        mc.charge_expert_half(clock, dout.shape[0], ffn.h, dout.itemsize, False)

    def expert_w():
        dW1, dc1, dW2, dc2 = ffn.views(ffn.experts[e][1])
        fdy = wide(dout)
        pairs = [(dW2, wide(c.u).T @ fdy), (dc2, fdy.sum(0)), (dW1, wide(c.x).T @ dz), (dc1, dz.sum(0))]
        _add_weight_grads(pairs, half)
        if clock is not None:
            mc.charge_expert_half(clock, dout.shape[0], ffn.h, dout.itemsize, True)

    weight_passes.append(expert_w)
    return dx


def router_backward_input(dgates, dp_aux, p, top, gates, x, Wr, dWr, weight_passes: list, clock=None):
    """moe.router_backward's dx now (B), its dWr += x^T dlogits queued (W); in p's type as there (its
    two matmuls charged one a half, as router_backward charges them)."""
    dlogits = router_dlogits(dgates, dp_aux, p, top, gates)
    x, Wr = x.astype(p.dtype, copy=False), Wr.astype(p.dtype, copy=False)
    if clock is not None:
        clock.matmul(x.shape[0], Wr.shape[1], x.shape[1])

    def router_w():
        _add_weight_grads([(dWr, x.T @ dlogits)], dWr.dtype)
        if clock is not None:
            clock.matmul(x.shape[1], x.shape[0], Wr.shape[1])

    weight_passes.append(router_w)
    return dlogits @ Wr.T


def split_backward_moe(unit, dense, gdense, ctx, dy, ffn, pending: list):
    """An MoE block's B half now (its dx returned); its W half appended to `pending` as one closure."""
    kept, fctx = ctx
    g1, _, attn, g2, _, Wr = unit.dense_views(dense)
    dg1, db1, dattn, dg2, db2, dWr = unit.dense_views(gdense)
    Wq, _, Wk, _, Wv, _, Wo, _ = attn
    half = dy.dtype
    inner: list = []  # the experts' and the router's W passes, run inside this block's one closure
    dh2 = ffn.backward(dy, fctx, Wr, dWr, weight_passes=inner)
    dx2 = dy + _layernorm_dx(dh2, kept.xh2, kept.r2, g2, half)
    a = kept.attn
    do = _dot(dx2, Wo.T, half)
    dq, dk, dv = unit.attend_core_backward(do, a)
    dh1 = _dot(dq, Wq.T, half) + _dot(dk, Wk.T, half) + _dot(dv, Wv.T, half)
    dx = dx2 + _layernorm_dx(dh1, kept.xh1, kept.r1, g1, half)
    clock, rows, bpe = unit.rt.clock, dy.shape[0], dy.itemsize
    if clock is not None:
        mc.charge_attention_half(clock, rows, unit.h, unit.a, unit._keys(), bpe, unit.dense, False)

    def block_w():
        for weight_pass in inner:
            weight_pass()
        dWq, dbq, dWk, dbk, dWv, dbv, dWo, dbo = dattn
        f2, f1, fdx2 = wide(dh2), wide(dh1), wide(dx2)
        pairs = [(dg2, (f2 * wide(kept.xh2)).sum(0)), (db2, f2.sum(0))]
        pairs += [(dWo, wide(a.o).T @ fdx2), (dbo, fdx2.sum(0))]
        for dW, db, dpart in ((dWq, dbq, dq), (dWk, dbk, dk), (dWv, dbv, dv)):
            pairs += [(dW, wide(a.x).T @ wide(dpart)), (db, wide(dpart).sum(0))]
        pairs += [(dg1, (f1 * wide(kept.xh1)).sum(0)), (db1, f1.sum(0))]
        _add_weight_grads(pairs, half)
        if clock is not None:
            mc.charge_attention_half(clock, rows, unit.h, unit.a, unit._keys(), bpe, unit.dense, True)

    pending.append(block_w)
    return dx
