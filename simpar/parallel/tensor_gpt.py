"""The transformer (--arch gpt) under tensor parallelism, and sequence parallelism (--sp).

Tensor parallelism splits every block as Megatron-LM does (Shoeybi et al. 2019, sec. 3, Fig. 3):

  attention  Wq, Wk, Wv (and bq, bk, bv) column-parallel BY HEADS: rank k of t holds heads
             k a/t .. (k+1) a/t, i.e. columns k h/t .. (k+1) h/t of each, and runs attention on its
             heads alone (heads never mix); Wo row-parallel (the same rows), bo added once after g.
  MLP        W1, c1 column-parallel, W2 row-parallel, c2 after g -- as resmlp (tensor_resmlp.py).
  f, g       before each column-parallel group and after each row-parallel matmul:
             f forward identity, backward all-reduce of dL/dh        op "tp-f-allreduce"
             g forward all-reduce of the partial products, backward identity   "tp-g-allreduce"
  replicated the two LayerNorms of every block, bo and c2: every rank holds the whole residual stream
             and the same dL/dy, so their gradients agree without communication.

The embedding and the LM head are sharded over the vocabulary (vocab_parallel.py: the lookup, the
head's f and the cross-entropy that never gathers the logits), so the V h matrices are split by t too.
A rank's block holds 12h^2/t + 7h/t + 6h parameters (costmodel/gpt.py's stage_params).

Sequence parallelism (Korthikanti et al. 2022, sec. 4.2.2): the rows (tokens, batch*s of them) of the
residual stream are split in t contiguous shards; LayerNorm, the residual adds, bo and c2 run on this
rank's rows, and f, g become f-bar (forward all-gather "sp-gather", backward reduce-scatter
"sp-scatter") and g-bar (forward reduce-scatter "sp-scatter", backward all-gather "sp-gather"). A ring
reduce-scatter and a ring all-gather move together what one ring all-reduce moves: the same bytes.
What LayerNorm keeps (xh, 1/sigma) shrinks by t; the gathered LN outputs that Wq/Wk/Wv and W1 need for
their gradients are kept whole, as tensor_resmlp.py does. The LayerNorm gammas and betas (and the
head's, and the positions) see only this rank's rows, so their gradients are summed over tp after the
last micro-step: op "sp-grad-allreduce", category "model", as resmlp.

Under --pp a chunk's units are a GptTensorStack over their indices (pipeline/engine.py): the residual
stream arriving from the previous stage is this tp rank's copy (or under --sp its row shard, sent by
the same tp rank there); the embedding runs only on the chunk that holds it, the head on the last.
"""

from __future__ import annotations

import numpy as np

from .. import collectives
from ..model.attention import (
    attention_core_backward,
    merge_heads,
    self_attention_backward,
    self_attention_forward,
    split_heads,
)
from ..model.gpt import BlockUnit, EmbeddingUnit, Kept
from ..model.gpt_build import gpt_units
from ..model.mlp import pending_weight_passes
from ..model.resmlp import layernorm_backward, layernorm_forward
from .base import HeldBytes, NonFiniteWatch, Strategy
from .resmlp_stack import unit_store
from .sharded import Sharded, gather_rows, scatter_rows
from .tensor import TensorParallel, f_backward, g_forward
from .tensor_gpt_split import split_unit_backward
from .vocab_parallel import ShardedEmbedding, ShardedHead, VocabParallelReplicas


class ShardedBlock(Sharded):
    """A BlockUnit's share: LayerNorms, bo, c2 whole; Wq Wk Wv W1 by columns, Wo W2 by rows."""

    def __init__(self, unit: BlockUnit, t: int, k: int):
        h = unit.h
        pieces = [((h,), None)] * 2
        pieces += [((h, h), 1), ((h,), 0)] * 3 + [((h, h), 0), ((h,), None)]
        pieces += [((h,), None)] * 2 + [((h, 4 * h), 1), ((4 * h,), 0), ((4 * h, h), 0), ((h,), None)]
        super().__init__(unit, pieces, t, k)
        self.h, self.s, self.heads = h, unit.s, unit.a // t
        self.score_keys = unit.s  # keys the scores span in _charge; 0 under --cp (context_tensor.py)

    def sp_grads(self, gflat) -> list:
        """The LayerNorms' gammas and betas: bo's and c2's gradients are row sums taken after g-bar's
        all-gather, complete on every rank already."""
        v = self.views(gflat)
        return [v[0], v[1], v[10], v[11]]


class GptTensorStack:
    """gpt's units over mesh.tp_comm, tensor- (and with layout.sp sequence-) parallel; the interface of
    base.SerialStack. forward takes the whole micro-batch's tokens on every tp rank and returns this
    rank's vocabulary columns of the logits for every token (vocab_parallel.py's loss takes those).
    `model`, `layout`: the config's sections; `indices`: only these units (one pipeline chunk's,
    parallel/pipeline/engine.py), default all."""

    def __init__(self, model, layout, mesh, indices=None):
        self.comm, self.algorithm, self.sp = mesh.tp_comm, layout.collectives, layout.sp
        t, k = self.comm.size, self.comm.rank
        dtype = model.compute_dtype()
        self.rt = mesh.world.runtime
        wrap = {EmbeddingUnit: ShardedEmbedding, BlockUnit: ShardedBlock}
        units = [u for u in gpt_units(model, self.rt) if indices is None or u.index in indices]
        self.units = [wrap.get(type(u), ShardedHead)(u, t, k) for u in units]
        for u in self.units:
            u.stack = self  # the units call the stack's conjugate operators
        seed = model.seed
        self.store, self.flats = unit_store(self.units, dtype, lambda u: u.cut(u.unit.init(seed, dtype)))

    # -- the conjugate operators: f and g, or under --sp f-bar and g-bar ----------------------------
    def f(self, h, op="sp-gather"):
        return gather_rows(self.comm, h, op) if self.sp else h

    def f_back(self, dh, op="tp-f-allreduce", sp_op="sp-scatter"):
        if self.sp:
            return scatter_rows(self.comm, dh, sp_op)
        if op == "tp-f-allreduce":
            return f_backward(dh, self.comm, self.algorithm)
        return collectives.allreduce(self.comm, np.ascontiguousarray(dh), "activation", op, self.algorithm)

    def g(self, partial, op="tp-g-allreduce", sp_op="sp-scatter"):
        if self.sp:
            return scatter_rows(self.comm, partial, sp_op)
        if op == "tp-g-allreduce":
            return g_forward(partial, self.comm, self.algorithm)
        return collectives.allreduce(
            self.comm, np.ascontiguousarray(partial), "activation", op, self.algorithm
        )

    def g_back(self, dy, op="sp-gather"):
        return gather_rows(self.comm, dy, op) if self.sp else dy

    # -- one block ----------------------------------------------------------------------------------
    def attend(self, blk: ShardedBlock, h1, params, batch: int):
        """The attention of this rank's heads over every row's sequence (context_tensor.py: over cp)."""
        return self_attention_forward(h1, params, batch, blk.s, blk.heads, self.rt.kernels)

    def attend_backward(self, blk: ShardedBlock, dy, actx, params, grads):
        return self_attention_backward(dy, actx, params, grads, self.rt.kernels)

    def attend_core_backward(self, blk: ShardedBlock, do, a):
        """(dq, dk, dv) merged, of this rank's heads from do = dL/do: the zero-bubble B pass's attention
        core (tensor_gpt_split.py; context_tensor.py's runs over the cp group)."""
        b, heads, s, _ = a.q.shape
        grads = attention_core_backward(split_heads(do, b, s, heads), a.q, a.k, a.v, a.probs)
        return tuple(merge_heads(g) for g in grads)

    def block_forward(self, blk: ShardedBlock, flat, x):
        g1, b1, Wq, bq, Wk, bk, Wv, bv, Wo, bo, g2, b2, W1, c1, W2, c2 = blk.views(flat)
        h1, (xh1, r1) = layernorm_forward(x, g1, b1)  # this rank's rows (all of them without --sp)
        h1 = self.f(h1)
        batch = h1.shape[0] // blk.s
        kern = self.rt.kernels
        y, actx = self.attend(blk, h1, (Wq, bq, Wk, bk, Wv, bv, Wo, None), batch)
        x2 = x + (self.g(y) + bo)  # bo once, after the sum over the heads' partial products
        h2, (xh2, r2) = layernorm_forward(x2, g2, b2)
        h2 = self.f(h2)
        z, u = kern.linear_act_forward(h2, W1, c1, "gelu")
        m, _ = kern.linear_act_forward(u, W2, None, "none")
        ctx = Kept(xh1=xh1, r1=r1, attn=actx, xh2=xh2, r2=r2, h2=h2, z=z, u=u)
        if self.rt.clock is not None:
            self._charge(blk, h1.shape[0], x.shape[0], x.itemsize, False)
        return x2 + (self.g(m) + c2), ctx

    def block_backward(self, blk: ShardedBlock, flat, gflat, ctx, dy):
        g1, _, Wq, bq, Wk, bk, Wv, bv, Wo, bo, g2, _, W1, _, W2, _ = blk.views(flat)
        dg1, db1, *dattn, dg2, db2, dW1, dc1, dW2, dc2 = blk.views(gflat)
        kern = self.rt.kernels
        dv = self.g_back(dy)  # all rows
        du, gW2, gc2 = kern.linear_act_backward(dv, ctx.u, W2, dv, dv, "none", True)  # gc2: full row sum
        dh2, gW1, gc1 = kern.linear_act_backward(du, ctx.h2, W1, ctx.z, ctx.u, "gelu", True)
        dx2, gg2, gb2 = layernorm_backward(self.f_back(dh2), (ctx.xh2, ctx.r2), g2)
        dx2 = dy + dx2  # the residual path around the MLP
        attn = (Wq, bq, Wk, bk, Wv, bv, Wo, bo)
        dh1 = self.attend_backward(blk, self.g_back(dx2), ctx.attn, attn, dattn)  # dbo: full row sum
        dx, gg1, gb1 = layernorm_backward(self.f_back(dh1), (ctx.xh1, ctx.r1), g1)
        for acc, new in ((dg1, gg1), (db1, gb1), (dg2, gg2), (db2, gb2), (dW1, gW1), (dc1, gc1)):
            acc += new
        dW2 += gW2
        dc2 += gc2
        if self.rt.clock is not None:
            self._charge(blk, dv.shape[0], dy.shape[0], dy.itemsize, True)
        return dx2 + dx  # the residual path around attention

    def _charge(self, blk: ShardedBlock, R: int, Rl: int, bpe: int, backward: bool) -> None:
        """gpt.charge_block's accounting for this rank's share: the matmuls' sharded dimension / t;
        elementwise work on the R gathered rows (biases of the column shards, GELU, merging heads,
        the scores) / t, on this rank's Rl rows (LayerNorms, residuals; all rows without --sp) whole."""
        clock, h, hl, s, t = self.rt.clock, blk.h, blk.h // blk.t, blk.score_keys, blk.t
        for _ in range(2 if backward else 1):
            for _ in range(3):
                clock.matmul(R, h, hl)
            clock.matmul(R, hl, h)
            clock.matmul(R, hl, s)
            clock.matmul(R, s, hl)
            clock.matmul(R, h, 4 * h // t)
            clock.matmul(R, 4 * h // t, h)
        if backward:  # LN' 20h, residuals 4h on Rl; bo, c2 sums 2h and 25h/t on R; softmax' 4 a s / t
            elems = 24 * Rl * h + 2 * R * h + 25 * R * hl + 4 * R * blk.heads * s + 3 * blk.size
            clock.stream(elems * bpe)
        else:  # LN 16h, bo and c2 4h, residuals 6h on Rl; q k v biases, merge, bias + GELU 24h/t on R
            clock.stream((26 * Rl * h + 24 * R * hl + 6 * R * blk.heads * s) * bpe)
            clock.layer_call()

    def _sync_sequence_grads(self, unit, gflat) -> None:
        """--sp: sum over tp the gradients of parameters that saw only this rank's rows (one message
        of their concatenation, written back)."""
        parts = unit.sp_grads(gflat)
        if not parts:
            return
        buf = np.concatenate([p.reshape(-1) for p in parts])
        collectives.allreduce(self.comm, buf, "model", "sp-grad-allreduce", self.algorithm)
        offset = 0
        for p in parts:
            p.reshape(-1)[...] = buf[offset : offset + p.size]
            offset += p.size

    # -- the SerialStack interface ---------------------------------------------------------------------
    def forward(self, x, meter: HeldBytes, watch: NonFiniteWatch):
        contexts = []
        for u, (p, _) in zip(self.units, self.flats):
            x, ctx = self.block_forward(u, p, x) if isinstance(u, ShardedBlock) else u.forward(p, x)
            watch.check(u.index, x)
            meter.take(ctx.nbytes)
            contexts.append(ctx)
        return x, contexts

    def backward(self, contexts, grad, meter: HeldBytes, on_layer_done=None):
        pending = pending_weight_passes()  # a zero-bubble pipeline's B pass (tensor_gpt_split.py)
        for u, (p, g), ctx in zip(reversed(self.units), reversed(self.flats), reversed(contexts)):
            if pending is not None:
                grad = split_unit_backward(self, u, p, g, ctx, grad, pending)
            elif isinstance(u, ShardedBlock):
                grad = self.block_backward(u, p, g, ctx, grad)
            else:
                grad = u.backward(p, g, ctx, grad)
            meter.free(ctx.nbytes)
            if on_layer_done is not None:  # the last micro-step: gradients complete, sum row shards
                if self.sp:
                    self._sync_sequence_grads(u, g)
                on_layer_done(u.index)
        return grad

    def sequence_synced(self, on_layer_done):
        """`on_layer_done`, preceded under --sp by the sum over tp of the unit's row-shard gradients
        (what backward does itself; a zero-bubble W pass completes the gradients outside it)."""
        grads = {u.index: (u, g) for u, (_, g) in zip(self.units, self.flats)}

        def done(index: int) -> None:
            self._sync_sequence_grads(*grads[index])
            on_layer_done(index)

        return done

    def full_pieces(self, flat: np.ndarray | None = None):
        """On tp rank 0: [(unit index, whole flat vector, empty)] (UnitStack's layout) of the
        parameters or of `flat` (laid out like store.params); None elsewhere."""
        flat = self.store.params if flat is None else flat
        mine = [flat[off : off + u.size].copy() for u, off in zip(self.units, self._offsets())]
        shards = self.comm.gather_object(mine, root=0)
        if self.comm.rank != 0:
            return None
        empty = np.empty(0, flat.dtype)
        return [(u.index, u.join([s[n] for s in shards]), empty) for n, u in enumerate(self.units)]

    def _offsets(self):
        return np.cumsum([0] + [u.size for u in self.units[:-1]])

    def flat_from_full(self, full: list, dtype=None) -> np.ndarray:
        parts = [u.cut(full[u.index][0]) for u in self.units]
        return np.concatenate(parts).astype(dtype or self.store.params.dtype, copy=False)


class GptTensorParallel(TensorParallel):
    """--arch gpt --tp t [--sp] [--dp d]: tensor_gpt.GptTensorStack inside DataParallel's step. Every
    tp rank gets the whole micro-batch of tokens (the embedding's reduce-scatter cuts the rows under
    --sp) and computes the same loss: tp index 0 reports it."""

    def __init__(self, sections, mesh):
        Strategy.__init__(self, sections, mesh)
        self.stack = GptTensorStack(sections.model, sections.layout, mesh)
        self.replicas = VocabParallelReplicas(sections, mesh, stack=self.stack)
        self.meter, self.watch = self.replicas.meter, self.replicas.watch
        self.optimizer = self.replicas.optimizer

    def train_step(self, micro_steps, global_batch: int) -> float:
        loss = self.replicas.train_step(micro_steps, global_batch)
        return loss if self.mesh.tp_index == 0 else 0.0
