"""Vocabulary parallelism for --arch gpt --tp t: the embedding, the LM head and the cross-entropy, each
rank holding V/t of the vocabulary (Megatron-LM, Shoeybi et al. 2019, sec. 3, "input embedding" and
the fused cross-entropy that avoids gathering b s V logits).

Rank k owns tokens v0 = k V/t .. v1 = (k+1) V/t. Per micro-step of R = b s token rows, h wide, with
ring collectives over t ranks (each sends (t-1)/t of an all-gather's or reduce-scatter's N elements
and 2(t-1)/t of an all-reduce's), bytes per rank are, activation category:

  embedding  rows of E_k for the tokens in [v0, v1), zero rows elsewhere; the sum over ranks is E[t]:
               forward  all-reduce R x h              "vocab-embed-allreduce"   2(t-1)/t R h
               (--sp: reduce-scatter to this rank's R/t rows "vocab-embed-scatter" (t-1)/t R h,
                backward all-gather of dL/dx "vocab-embed-gather" (t-1)/t R h). The positions are
               added after the sum; their gradient is a sum over every row's dL/dx, so complete.
  LM head    Wout column-parallel over V: logits_k = LN_f(x) Wout_k, R x V/t, never gathered.
               backward all-reduce of dL/dLN_f  "vocab-head-allreduce"   2(t-1)/t R h
               (--sp: forward all-gather "vocab-head-gather", backward reduce-scatter
                "vocab-head-scatter", (t-1)/t R h each)
  loss       max_v logits: the counted collectives only sum, so each rank's row maxima are
               all-gathered (t R numbers) and the maximum taken locally  "vocab-ce-max" (t-1) R;
             sum_v exp(logit - max) and the label's logit (shifted; 0 on ranks without the label)
               summed in one all-reduce of 2R numbers  "vocab-ce-sums"  2(t-1)/t 2R.
             loss = log(sum) - shifted label logit; dL/dlogits_k = softmax_k - onehot_k, divided by the
             global number of tokens (and multiplied by the loss scale under mixed precision).
The loss is computed in float32 for half logits; the two loss messages carry that type.
"""

from __future__ import annotations

import numpy as np

from .. import collectives
from ..model.gpt import Kept
from ..model.mlp import wide
from ..model.precision import MixedPrecisionOptimizer
from ..model.resmlp import layernorm_backward, layernorm_forward
from .data import DataParallel
from .sharded import Sharded


class ShardedEmbedding(Sharded):
    """E by rows (the vocabulary), positions replicated."""

    def __init__(self, unit, t: int, k: int):
        V, s, h = unit.V, unit.s, unit.h
        super().__init__(unit, [((V, h), 0), ((s, h), None)], t, k)
        self.s, self.h, self.v0, self.vl = s, h, k * (V // t), V // t

    def sp_grads(self, gflat) -> list:
        return []  # the positions' gradient sums the all-gathered dL/dx: complete

    def _mine(self, tokens):
        local = tokens.reshape(-1) - self.v0
        mine = (local >= 0) & (local < self.vl)
        return np.where(mine, local, 0), mine

    def forward(self, flat, tokens):
        E, pos = self.views(flat)
        ids, mine = self._mine(tokens)
        partial = E[ids]
        partial[~mine] = 0
        x = self.stack.g(partial, op="vocab-embed-allreduce", sp_op="vocab-embed-scatter")
        first = self.k * x.shape[0] if self.stack.sp else 0  # this rank's first row
        x += pos[(first + np.arange(x.shape[0])) % self.s]
        clock = self.rt.clock
        if clock is not None:  # gather E's rows (all R), read Pos and write x on this rank's rows
            clock.stream((partial.size + 2 * x.size) * x.itemsize)
            clock.layer_call()
        return x, Kept(tokens=tokens)

    def backward(self, flat, gflat, ctx, dy):
        dE, dpos = self.views(gflat)
        dy = self.stack.g_back(dy, op="vocab-embed-gather")  # every row
        ids, mine = self._mine(ctx.tokens)
        np.add.at(dE, ids[mine], dy[mine])
        b, s = ctx.tokens.shape
        dpos[:s] += dy.reshape(b, s, self.h).sum(axis=0)
        if self.rt.clock is not None:  # gpt.py's 4 passes, over every row
            self.rt.clock.stream(4 * dy.size * dy.itemsize)
        return None


class ShardedHead(Sharded):
    """LN_f whole, Wout by columns (the vocabulary)."""

    def __init__(self, unit, t: int, k: int):
        h, V = unit.h, unit.V
        super().__init__(unit, [((h,), None), ((h,), None), ((h, V), 1)], t, k)

    def sp_grads(self, gflat) -> list:
        return self.replicated_grads(gflat)  # LN_f saw this rank's rows only

    def forward(self, flat, x):
        g, b, W = self.views(flat)
        hf, (xh, r) = layernorm_forward(x, g, b)
        hf = self.stack.f(hf, op="vocab-head-gather")
        logits, _ = self.rt.kernels.linear_act_forward(hf, W, None, "none")
        clock = self.rt.clock
        if clock is not None:  # gpt.py's head: the matmul V/t wide, LayerNorm on this rank's rows
            clock.matmul(hf.shape[0], hf.shape[1], W.shape[1])
            clock.stream(8 * x.size * x.itemsize)
            clock.layer_call()
        return logits, Kept(xh=xh, r=r, hf=hf)

    def backward(self, flat, gflat, ctx, dlogits):
        g, _, W = self.views(flat)
        dg, db, dW = self.views(gflat)
        dhf, gW, _ = self.rt.kernels.linear_act_backward(dlogits, ctx.hf, W, dlogits, dlogits, "none", True)
        dhf = self.stack.f_back(dhf, op="vocab-head-allreduce", sp_op="vocab-head-scatter")
        dx, gg, gb = layernorm_backward(dhf, (ctx.xh, ctx.r), g)
        dW += gW
        dg += gg
        db += gb
        clock = self.rt.clock
        if clock is not None:
            clock.matmul(dlogits.shape[0], W.shape[0], W.shape[1])
            clock.matmul(dlogits.shape[0], W.shape[0], W.shape[1])
            clock.stream((10 * dx.size + 3 * self.size) * dx.itemsize)
        return dx


def vocab_parallel_cross_entropy(
    comm, logits, labels, tokens: int, v0: int, scale=1.0, algorithm="ring", clock=None
):
    """(loss share, dL/dlogits) of this rank's vocabulary columns `logits` (R x V/t, columns v0 ..);
    the loss share is the same on every tp rank (the whole loss of these rows / `tokens`)."""
    z = wide(logits)
    rows, vl = z.shape
    maxima = np.zeros((comm.size, rows), z.dtype)
    maxima[comm.rank] = z.max(axis=1)
    m = collectives.allgather(comm, maxima, "activation", "vocab-ce-max").max(axis=0)
    e = np.exp(z - m[:, None])
    local = labels.reshape(-1) - v0
    mine = (local >= 0) & (local < vl)
    where = np.nonzero(mine)[0]
    sums = np.zeros((2, rows), z.dtype)
    sums[0] = e.sum(axis=1)
    sums[1, where] = z[where, local[where]] - m[where]
    collectives.allreduce(comm, sums, "activation", "vocab-ce-sums", algorithm)
    loss = float((np.log(sums[0]) - sums[1]).sum() / tokens)
    d = e / sums[0][:, None]
    d[where, local[where]] -= 1
    d *= z.dtype.type(scale / tokens)
    if clock is not None:  # as model/mlp.softmax_cross_entropy: ~6 sweeps over this rank's R x V/t
        clock.stream(6 * z.size * z.itemsize)
    return loss, d.astype(logits.dtype, copy=False)


def vocab_loss_grad(stack, optimizer, logits, labels, global_batch: int, seq_len: int):
    """(loss share, dL/dlogits) of the stack's head (its last unit, a ShardedHead): the whole loss of
    these rows / the global number of tokens (global_batch x seq_len), the same on every tp rank;
    scaled as the optimizer asks; the all-reduce runs the stack's algorithm (--collectives).
    Used by the tp step below and by the last pipeline stage under --tp (pipeline/engine.py)."""
    head = stack.units[-1]
    scale = optimizer.scale if isinstance(optimizer, MixedPrecisionOptimizer) else 1.0
    v0 = head.k * head.local[2][1]
    return vocab_parallel_cross_entropy(
        stack.comm, logits, labels, global_batch * seq_len, v0, scale, stack.algorithm, stack.rt.clock
    )


class VocabParallelReplicas(DataParallel):
    """DataParallel's step (buckets, overlap, accumulation over dp) with the vocabulary-parallel loss."""

    def _forward_backward(self, x, y, global_batch, communicate) -> float:
        logits, contexts = self.stack.forward(x, self.meter, self.watch)
        loss, grad = vocab_loss_grad(self.stack, self.optimizer, logits, y, global_batch, self.model.seq_len)
        self.stack.backward(contexts, grad, self.meter, self.buckets.grads_ready if communicate else None)
        return loss
