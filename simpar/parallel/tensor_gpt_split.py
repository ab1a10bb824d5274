"""The backward of gpt's tensor-parallel units in two halves: --arch gpt --tp t --pp S with the
zero-bubble schedules (--schedule zb-h1, zb-v).

Qi et al. 2023 ("Zero Bubble Pipeline Parallelism", sec. 2) split a layer's backward into B (dL/dx:
the stage below waits for it) and W (the weights' gradients: nobody waits, it fills bubbles).
model/gpt_split.py does it for a whole block; here the block is one tp rank's share of it
(tensor_gpt.py: Wq Wk Wv W1 by columns, Wo W2 by rows, LayerNorms, bo, c2 whole). The rule that
decides where the tp messages go: every conjugate operator lies on the path of dL/dx, so all of a
block's and of the head's tp messages run in B, and W is this rank's local products alone:

  block B  dv = g_back(dy); du = dv W2_k^T; dz = gelu'(du); dh2 = f_back(dz W1_k^T) ("tp-f-allreduce",
           or under --sp the reduce-scatter); dx2 = dy + LN2's dx; dx2g = g_back(dx2); do = dx2g Wo_k^T;
           attention's dq dk dv on this rank's heads; dh1 = f_back(dq Wq_k^T + dk Wk_k^T + dv Wv_k^T);
           returns dx2 + LN1's dx
        W  dW2_k += u^T dv, dc2 += sum dv, dW1_k += h2^T dz, dc1_k += sum dz, dWo_k += o^T dx2g,
           dbo += sum dx2g, dWq_k += h1^T dq (and k, v), the LayerNorms' dgamma = sum dh xh, dbeta = sum dh
  head  B  dhf = f_back(dlogits_k Wout_k^T) ("vocab-head-allreduce", --sp "vocab-head-scatter"); LN_f's dx
        W  dWout_k += hf^T dlogits_k; LN_f's gamma, beta
  embedding  no B (its input is token ids): its whole backward is W, the --sp all-gather of dL/dx
           ("vocab-embed-gather") included. Both tp ranks of a stage run the same schedule, so they
           reach that collective at the same W step.

Under --cp (context_tensor.py, --cp --tp --pp) the attention core is the stack's attend_core_backward:
context_attention.cp_core_backward on this rank's a/T heads, so the ring's K/V hops and dK/dV partial
sums (or Ulysses' all-to-alls) are in B as well, and W is still local products alone.

The halves together compute what tensor_gpt.GptTensorStack.block_backward and vocab_parallel's head
compute fused, and send the same messages (same bytes, same order within B); under half precision each
product is taken in float32 and rounded back as model/gpt_split.py does. The engine's W pass calls one
closure per unit, in backward order (parallel/pipeline/engine.py).

--clock sim: each half charges its share of the fused backward's charge (tensor_gpt._charge,
vocab_parallel's head), cut as gpt.charge_half cuts the serial one: B the dx matmuls (this rank's
q k v o and MLP shards, the attention's four score matmuls on its heads; the head's dlogits Wout_k^T)
and every memory pass; W the dW matmuls of the same shards and accumulating 3 per local parameter. The
tp collectives charge themselves where they run (B; the embedding's --sp all-gather in W).
costmodel/gpt_pipeline_time.py writes the same split.
"""

from __future__ import annotations

from ..model.gpt_split import _add_weight_grads, _dot, _layernorm_dx
from ..model.mlp import ACTIVATIONS, wide
from .vocab_parallel import ShardedEmbedding, ShardedHead


def split_unit_backward(stack, unit, flat, gflat, ctx, dy, pending: list):
    """The B half of this rank's share of `unit` now (its dL/dx returned, None for the embedding);
    its W half appended to `pending` as one closure."""
    if isinstance(unit, ShardedEmbedding):  # (or cp x tp's PositionedShardedEmbedding, context_tensor.py)
        pending.append(lambda: unit.backward(flat, gflat, ctx, dy))  # run outside B: fused, as serial
        return None
    if isinstance(unit, ShardedHead):
        return _head(unit, flat, gflat, ctx, dy, pending)
    return _block(stack, unit, flat, gflat, ctx, dy, pending)


def _head(head, flat, gflat, ctx, dlogits, pending: list):
    g, _, W = head.views(flat)
    half = dlogits.dtype
    partial = _dot(dlogits, W.T, half)  # this rank's vocabulary columns' share of dL/dhf
    dhf = head.stack.f_back(partial, op="vocab-head-allreduce", sp_op="vocab-head-scatter")
    dx = _layernorm_dx(dhf, ctx.xh, ctx.r, g, half)
    clock = head.rt.clock
    if clock is not None:  # B: dlogits Wout_k^T, LN_f's backward on this rank's rows
        clock.matmul(dlogits.shape[0], W.shape[0], W.shape[1])
        clock.stream(10 * dx.size * dx.itemsize)

    def head_w():
        dg, db, dW = head.views(gflat)
        f = wide(dhf)
        pairs = ((dW, wide(ctx.hf).T @ wide(dlogits)), (dg, (f * wide(ctx.xh)).sum(0)), (db, f.sum(0)))
        _add_weight_grads(pairs, half)
        if clock is not None:  # W: hf^T dlogits_k, accumulating the local gradients
            clock.matmul(dlogits.shape[0], W.shape[0], W.shape[1])
            clock.stream(3 * head.size * dx.itemsize)

    pending.append(head_w)
    return dx


def _block(stack, blk, flat, gflat, ctx, dy, pending: list):
    g1, _, Wq, _, Wk, _, Wv, _, Wo, _, g2, _, W1, _, W2, _ = blk.views(flat)
    half = dy.dtype
    dv = stack.g_back(dy)  # every row (--sp: gathered)
    du = _dot(dv, W2.T, half)
    dz = ACTIVATIONS["gelu"][1](wide(du), wide(ctx.z), wide(ctx.u))
    dh2 = stack.f_back(_dot(dz, W1.T, half))  # summed over the ranks' columns of W1
    dx2 = dy + _layernorm_dx(dh2, ctx.xh2, ctx.r2, g2, half)  # the residual around the MLP
    dx2g = stack.g_back(dx2)
    a = ctx.attn
    do = _dot(dx2g, Wo.T, half)
    dq, dk, dvv = stack.attend_core_backward(blk, do, a)  # this rank's heads (under --cp: over cp)
    dh1 = stack.f_back(_dot(dq, Wq.T, half) + _dot(dk, Wk.T, half) + _dot(dvv, Wv.T, half))
    dx = dx2 + _layernorm_dx(dh1, ctx.xh1, ctx.r1, g1, half)  # the residual around attention
    _charge_half(stack, blk, dv.shape[0], dy.shape[0], dy.itemsize, weights=False)

    def block_w():
        dg1, db1, dWq, dbq, dWk, dbk, dWv, dbv, dWo, dbo, dg2, db2, dW1, dc1, dW2, dc2 = blk.views(gflat)
        f2, f1, fv, fx2 = wide(dh2), wide(dh1), wide(dv), wide(dx2g)
        pairs = [(dW2, wide(ctx.u).T @ fv), (dc2, fv.sum(0)), (dW1, wide(ctx.h2).T @ dz), (dc1, dz.sum(0))]
        pairs += [(dg2, (f2 * wide(ctx.xh2)).sum(0)), (db2, f2.sum(0))]
        pairs += [(dWo, wide(a.o).T @ fx2), (dbo, fx2.sum(0))]
        for dW, db, part in ((dWq, dbq, dq), (dWk, dbk, dk), (dWv, dbv, dvv)):
            pairs += [(dW, wide(a.x).T @ wide(part)), (db, wide(part).sum(0))]
        pairs += [(dg1, (f1 * wide(ctx.xh1)).sum(0)), (db1, f1.sum(0))]
        _add_weight_grads(pairs, half)
        _charge_half(stack, blk, dv.shape[0], dy.shape[0], dy.itemsize, weights=True)

    pending.append(block_w)
    return dx


def _charge_half(stack, blk, R: int, Rl: int, bpe: int, weights: bool) -> None:
    """One half of tensor_gpt._charge's backward (R gathered rows, Rl this rank's): the six weight
    shards' matmuls in each half, the four score matmuls and every memory pass in B, accumulating the
    local gradients (3 per parameter) in W."""
    clock = stack.rt.clock
    if clock is None:
        return
    h, hl, s, t = blk.h, blk.h // blk.t, blk.score_keys, blk.t
    for _ in range(3):
        clock.matmul(R, h, hl)
    clock.matmul(R, hl, h)
    for _ in range(0 if weights else 2):  # q k^T and P v, each for both inputs' gradients
        clock.matmul(R, hl, s)
        clock.matmul(R, s, hl)
    clock.matmul(R, h, 4 * h // t)
    clock.matmul(R, 4 * h // t, h)
    if weights:
        clock.stream(3 * blk.size * bpe)
    else:  # LN' 20h, residuals 4h on Rl; bo, c2 sums 2h and 25h/t on R; softmax' 4 a s / t
        clock.stream((24 * Rl * h + 2 * R * h + 25 * R * hl + 4 * R * blk.heads * s) * bpe)
