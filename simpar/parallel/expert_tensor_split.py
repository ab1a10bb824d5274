"""An MoE block's backward under tensor parallelism (expert_tensor_gpt.py) in two halves, for the
zero-bubble pipelines (--arch gpt --experts E --tp T --pp S --schedule zb-h1 | zb-v).

The block is tensor_gpt_split.py's attention (this rank's heads: Wq, Wk, Wv by columns, Wo by rows) with
the MLP swapped for the MoE part replicated on every tp rank (model/gpt_moe_split.py's halves). As there,
every message lies on dL/dx's path and so runs in B: under --sp the all-gather of dL/dm ("sp-gather"),
the MoE's two backward all-to-alls, (--sp: dL/dx2's all-gather,) then the attention's f all-reduce
("tp-f-allreduce", --sp its reduce-scatter "sp-scatter") after dq Wq_k^T + dk Wk_k^T + dv Wv_k^T. W is local
products alone: the experts' and the router's gradients (gpt_moe_split.py), dWo_k += o^T dx2,
dbo += sum dx2, dWq_k += h1^T dq (k, v), the LayerNorms' gamma and beta. The embedding and the head
split as tensor_gpt_split.py splits them. One closure per unit (pipeline/expert_stage.py runs them).
--clock sim: the attention half charges its share of B and W
(moe_charges.charge_attention_half), the MoE part as gpt_moe_split.py charges it.
"""

from __future__ import annotations

from ..model import moe_charges as mc
from ..model.gpt_split import _add_weight_grads, _dot, _layernorm_dx
from ..model.mlp import wide


def split_moe_backward(stack, blk, flat, gflat, ctx, dy, pending: list):
    """The B half of this rank's share of MoE block `blk` now (its dL/dx returned); its W half queued."""
    kept, fctx = ctx
    g1, _, Wq, _, Wk, _, Wv, _, Wo, _, g2, _, Wr = blk.views(flat)
    dg1, db1, dWq, dbq, dWk, dbk, dWv, dbv, dWo, dbo, dg2, db2, dWr = blk.views(gflat)
    half = dy.dtype
    inner: list = []  # the experts' and the router's W passes
    dm = stack.g_back(dy)  # --sp: every row (sp-gather)
    dh2 = stack.mine(stack.ffns[blk.index].backward(dm, fctx, Wr, dWr, weight_passes=inner))  # no f
    dx2 = dy + _layernorm_dx(dh2, kept.xh2, kept.r2, g2, half)
    dx2g = stack.g_back(dx2)
    a = kept.attn
    do = _dot(dx2g, Wo.T, half)
    dq, dk, dv = stack.attend_core_backward(blk, do, a)  # this rank's heads
    dh1 = stack.f_back(_dot(dq, Wq.T, half) + _dot(dk, Wk.T, half) + _dot(dv, Wv.T, half))
    dx = dx2 + _layernorm_dx(dh1, kept.xh1, kept.r1, g1, half)
    clock = stack.rt.clock  # --clock sim: this rank's share of the attention half, cut in two
    args = (blk.h, blk.unit.a, stack._keys(blk), dy.itemsize, blk.size)
    if clock is not None:
        mc.charge_attention_half(clock, dm.shape[0], *args, False, blk.t, dy.shape[0])

    def block_w():
        for weight_pass in inner:
            weight_pass()
        f2, f1, fx2 = wide(dh2), wide(dh1), wide(dx2g)
        pairs = [(dg2, (f2 * wide(kept.xh2)).sum(0)), (db2, f2.sum(0))]
        pairs += [(dWo, wide(a.o).T @ fx2), (dbo, fx2.sum(0))]
        for dW, db, part in ((dWq, dbq, dq), (dWk, dbk, dk), (dWv, dbv, dv)):
            pairs += [(dW, wide(a.x).T @ wide(part)), (db, wide(part).sum(0))]
        pairs += [(dg1, (f1 * wide(kept.xh1)).sum(0)), (db1, f1.sum(0))]
        _add_weight_grads(pairs, half)
        if clock is not None:
            mc.charge_attention_half(clock, dm.shape[0], *args, True, blk.t, dy.shape[0])

    pending.append(block_w)
    return dx
