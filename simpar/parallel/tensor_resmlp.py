"""The residual MLP (--arch resmlp) under tensor parallelism, and sequence parallelism (--sp).

Tensor parallelism (Megatron-LM, Shoeybi et al. 2019, sec. 3, Fig. 3a: the transformer's MLP block).
Each block  x + W2 act(W1 LN(x) + b1) + b2  of width d is split over the t ranks of the tp group:

  W1, b1   column-parallel: rank k holds W1[:, cols_k], b1[cols_k] (d/t columns) and computes its
           columns of u = act(h W1 + b1) alone (act is elementwise: Megatron eq. 3)
  W2       row-parallel: rank k holds W2[cols_k, :] and computes the partial product u_k W2_k;
           their sum over k is u W2.  b2 is replicated and added once, after the sum.
  f        before W1: forward identity, backward all-reduce of dL/dh     op "tp-f-allreduce"
  g        after W2:  forward all-reduce of the partials, backward identity   op "tp-g-allreduce"
  gamma, beta (LayerNorm) and b2: replicated. Every tp rank holds the whole residual stream (all rows,
           all d features), so it computes LN on the same numbers and receives the same dL/dy: their
           gradients come out identical on every rank and need no communication.
  projections (input d_in -> d, output d -> classes): replicated, computed whole on every tp rank
           (as tensor.py's odd last layer): identical gradients, no traffic. They are a few percent
           of the work of a block stack, and keeping them whole keeps the residual stream replicated.

Per block per micro-step of r rows: g all-reduces r x d in forward, f all-reduces r x d in backward
(ring: 2(t-1)/t * r*d elements per rank each). Every block needs f: its input comes from trainable
layers below it.

Sequence parallelism (Korthikanti et al. 2022, sec. 4.2.2, Figs. 5 and 6). Outside the two matmuls,
nothing mixes rows, so the rows (tokens) of the residual stream are split over the tp group: rank k
keeps rows k*r/t .. (k+1)*r/t. LayerNorm, the residual add, b2 and both projections run on that row
shard; the tensor-parallel region between them needs all rows, so the conjugate operators become

  f-bar    forward all-gather of LN's output rows (op "sp-gather"), backward reduce-scatter of
           dL/dh over rows (op "sp-scatter")
  g-bar    forward reduce-scatter of the partial products over rows ("sp-scatter"), backward
           all-gather of dL/dy ("sp-gather")

A ring reduce-scatter plus a ring all-gather of N elements move exactly what one ring all-reduce
moves, so the activation bytes per rank are tensor parallelism's (the paper's point). What shrinks
by t is what LayerNorm and the residual keep for backward (x, xh, s: (2d + 1) per row); the gathered
LN output h that W1 needs for its gradient is kept whole, as under plain tensor parallelism
(Megatron gathers it again in backward instead, trading bytes for memory; we keep the bytes equal).

Parameters that now see only a shard of the rows -- gamma and beta of every block and both
projections -- get per-rank partial gradients, so they are all-reduced over tp after the last
micro-step (Megatron does the same for its sequence-parallel parameters): op "sp-grad-allreduce",
category "model", ring over 2d elements per block plus each projection's size. b2 needs none: its
gradient is summed over dL/dy's rows AFTER g-bar's all-gather, so every rank holds the full sum.

Rows must divide evenly by t (config.validate asks --batch to be a multiple of dp*grad-accum*tp):
the ring's chunks of r x d elements are then whole rows.

Under --pp a stage's chunk is a ResTensorStack over the chunk's units (pipeline._stack): the same
split, its own f and g per block; the residual stream arriving from the previous stage is already
replicated over the tp group -- or, under --sp, already this rank's row shard: the previous stage's
tp rank k sends its rows to tp rank k here (pipeline_comms._row_shard), so the shard crosses the
boundary as it is, at 1/t of the bytes (Korthikanti et al. 2022, sec. 4.2.2). Zero-bubble schedules
split a block's backward into B and W halves (below); their W pass then sums the row-shard gradients
over tp (sequence_synced). --recompute selective keeps f-bar's gathered h under --sp instead of
gathering it again. (A little over 300 lines: the B/W split.)
"""

from __future__ import annotations

import numpy as np

from .. import collectives
from ..model.mlp import ACTIVATIONS, pending_weight_passes
from ..model.resmlp import (
    BlockContext,
    BlockUnit,
    LinearUnit,
    build_units,
    layernorm_backward,
    layernorm_forward,
)
from .base import HeldBytes, NonFiniteWatch
from .resmlp_stack import unit_store
from .tensor import f_backward, g_forward


class ShardedBlock:
    """This rank's share of a BlockUnit: flat parameters gamma, beta, W1[:, cols], b1[cols],
    W2[cols, :], b2 (cols = the k-th of t equal column ranges of d)."""

    def __init__(self, unit: BlockUnit, t: int, k: int):
        self.unit, self.index, self.d, self.act = unit, unit.index, unit.d, unit.act
        self.rt = unit.rt  # the run's kernels and clock (build_units)
        self.dl = unit.d // t
        self.cols = slice(k * self.dl, (k + 1) * self.dl)
        self.size = 3 * self.d + 2 * self.d * self.dl + self.dl

    def views(self, flat):
        d, dl = self.d, self.dl
        g, beta, W1, b1, W2, b2 = np.split(flat, np.cumsum([d, d, d * dl, dl, dl * d]))
        return g, beta, W1.reshape(d, dl), b1, W2.reshape(dl, d), b2

    def rebuild_context(self, flat, x, z1, gathered=None) -> BlockContext:
        """What forward kept, from the block's input x and this rank's columns of z1 (--recompute
        selective, resstack.restore_selective): LayerNorm on x's rows (~8 passes over rows x d) and
        u = act(z1) (2 per column, all rows). Without --sp f is the identity, so h is LayerNorm's
        output; under --sp h is f-bar's all-gather of it, kept by the forward (`gathered`) rather
        than gathered again, so that recomputation moves no bytes."""
        g, beta, *_ = self.views(flat)
        ln, (xh, s) = layernorm_forward(x, g, beta)
        h = ln if gathered is None else gathered
        u = ACTIVATIONS[self.act][0](z1)
        clock = self.rt.clock
        if clock is not None:
            clock.stream((8 * self.d * x.shape[0] + 2 * self.dl * z1.shape[0]) * x.itemsize)
        return BlockContext(x, xh, s, h, z1, u)

    def cut(self, full_flat: np.ndarray) -> np.ndarray:
        """This rank's flat vector from the whole block's (initial weights or a checkpoint's)."""
        g, beta, W1, b1, W2, b2 = self.unit.views(full_flat)
        parts = (g, beta, W1[:, self.cols], b1[self.cols], W2[self.cols, :], b2)
        return np.concatenate([p.reshape(-1) for p in parts])

    def join(self, shards: list[np.ndarray]) -> np.ndarray:
        """The whole block's flat vector from every rank's (in tp rank order)."""
        views = [self.views(s) for s in shards]
        g, beta, _, _, _, b2 = views[0]
        W1 = np.concatenate([v[2] for v in views], axis=1)
        b1 = np.concatenate([v[3] for v in views])
        W2 = np.concatenate([v[4] for v in views], axis=0)
        return np.concatenate([p.reshape(-1) for p in (g, beta, W1, b1, W2, b2)])


class ResTensorStack:
    """The resmlp's units `unit_indices` (default: all; a pipeline chunk's run of units under --pp,
    as resstack.make_stack) over mesh.tp_comm, tensor- (and with layout.sp sequence-) parallel; the
    interface of base.SerialStack. Under --sp, forward receives only this rank's rows (TensorParallel
    cuts them) and returns the logits of those rows."""

    def __init__(self, model, layout, mesh, unit_indices: list[int] | None = None):
        # model, layout: the config's sections (config.sections)
        self.comm, self.algorithm, self.sp = mesh.tp_comm, layout.collectives, layout.sp
        t, k = self.comm.size, self.comm.rank
        dtype = model.compute_dtype()
        self.rt = mesh.world.runtime  # the run's kernels and clock
        every = build_units(model, self.rt)
        chosen = every if unit_indices is None else [every[i] for i in unit_indices]
        self.units = [ShardedBlock(u, t, k) if isinstance(u, BlockUnit) else u for u in chosen]

        def initial(u):  # the serial model's numbers, cut to this rank's share
            return (
                u.cut(u.unit.init(model.seed, dtype))
                if isinstance(u, ShardedBlock)
                else u.init(model.seed, dtype)
            )

        self.store, self.flats = unit_store(self.units, dtype, initial)

    # -- the conjugate operators: Megatron's f and g, or sequence parallelism's f-bar and g-bar ------
    def _gather_rows(self, shard: np.ndarray) -> np.ndarray:
        """All-gather row shards (r/t x d) into all r rows, in tp rank order (ring)."""
        t, k, n = self.comm.size, self.comm.rank, shard.shape[0]
        full = np.empty((n * t, shard.shape[1]), shard.dtype)
        full[k * n : (k + 1) * n] = shard
        return collectives.allgather(self.comm, full, "activation", "sp-gather")

    def _scatter_rows(self, partial: np.ndarray) -> np.ndarray:
        """Reduce-scatter r x d partial sums over rows: this rank's r/t rows of the sum (ring)."""
        rows = partial.shape[0] // self.comm.size
        mine = collectives.reduce_scatter(
            self.comm, np.ascontiguousarray(partial), "activation", "sp-scatter"
        )
        return mine.reshape(rows, partial.shape[1])

    def _f(self, h):  # forward of f (identity) or f-bar (all-gather)
        return self._gather_rows(h) if self.sp else h

    def _f_back(self, dh):  # backward of f (all-reduce) or f-bar (reduce-scatter)
        return self._scatter_rows(dh) if self.sp else f_backward(dh, self.comm, self.algorithm)

    def _g(self, partial):  # forward of g (all-reduce) or g-bar (reduce-scatter)
        return self._scatter_rows(partial) if self.sp else g_forward(partial, self.comm, self.algorithm)

    def _g_back(self, dy):  # backward of g (identity) or g-bar (all-gather)
        return self._gather_rows(dy) if self.sp else dy

    # -- one block ----------------------------------------------------------------------------------
    def _block_forward(self, blk: ShardedBlock, flat, x):
        gamma, beta, W1, b1, W2, b2 = blk.views(flat)
        ln, (xh, s) = layernorm_forward(x, gamma, beta)  # on this rank's rows (all of them without sp)
        h = self._f(ln)
        k = self.rt.kernels
        z1, u = k.linear_act_forward(h, W1, b1, blk.act)
        partial, _ = k.linear_act_forward(u, W2, None, "none")  # u_k W2_k: b2 only after the sum
        v = self._g(partial)
        clock = self.rt.clock
        if clock is not None:  # as BlockUnit, split: LN 8, b2 2, residual 3 on x's rows; b1 + act 4
            r, rs, bpe = h.shape[0], x.shape[0], x.itemsize
            clock.matmul(r, blk.d, blk.dl)
            clock.matmul(r, blk.dl, blk.d)
            clock.stream((13 * rs * blk.d + 4 * r * blk.dl) * bpe)
            clock.layer_call()
        return x + (v + b2), BlockContext(x, xh, s, h, z1, u)

    def _block_backward(self, blk: ShardedBlock, flat, gflat, ctx, dy):
        pending = pending_weight_passes()
        if pending is not None:  # a zero-bubble pipeline's B pass: the W half is queued for later
            dx, weight_pass = self._block_backward_input(blk, flat, gflat, ctx, dy)
            pending.append(weight_pass)
            return dx
        gamma, beta, W1, b1, W2, b2 = blk.views(flat)
        grads = blk.views(gflat)
        x, xh, s, h, z1, u = ctx.arrays
        dv = self._g_back(dy)  # all rows
        k = self.rt.kernels
        du, gW2, gb2 = k.linear_act_backward(dv, u, W2, dv, dv, "none", True)  # gb2: the full row sum
        dh, gW1, gb1 = k.linear_act_backward(du, h, W1, z1, u, blk.act, True)
        dx, ggamma, gbeta = layernorm_backward(self._f_back(dh), (xh, s), gamma)
        for acc, new in zip(grads, (ggamma, gbeta, gW1, gb1, gW2, gb2)):
            acc += new  # += so grad-accum micro-steps add up
        clock = self.rt.clock
        if clock is not None:  # 4 matmuls; LN' 10, residual 2 on x's rows; db2 1 on all; act' 3, db1 1
            r, rs, bpe = dv.shape[0], dy.shape[0], dy.itemsize
            for _ in range(2):
                clock.matmul(blk.dl, r, blk.d)
                clock.matmul(r, blk.d, blk.dl)
            clock.stream((12 * rs * blk.d + r * blk.d + 4 * r * blk.dl + 3 * blk.size) * bpe)
        return dy + dx  # the identity path

    # -- the backward in two halves (zero-bubble pipelines, Qi et al. 2023, sec. 2; resmlp.BlockUnit's
    # split with this rank's columns): B is the critical path -- du = dv W2_k^T, dz1 = act'(du),
    # dh = f's all-reduce of dz1 W1_k^T, LayerNorm's dx (its dgamma, dbeta row sums come with it);
    # W is the rest -- dW2_k += u_k^T dv, db2 += sum dv, dW1_k += h^T dz1, db1_k += sum dz1, and every
    # accumulation. Together the fused backward's arithmetic, traffic and clock charges.
    def _block_backward_input(self, blk: ShardedBlock, flat, gflat, ctx, dy):
        """(dL/dx, the W half as a closure over dv, dz1 and LayerNorm's parameter gradients)."""
        gamma, _, W1, _, W2, _ = blk.views(flat)
        x, xh, s, h, z1, u = ctx.arrays
        dv = self._g_back(dy)
        dz1 = ACTIVATIONS[blk.act][1](dv @ W2.T, z1, u)
        dx, ggamma, gbeta = layernorm_backward(self._f_back(dz1 @ W1.T), (xh, s), gamma)
        clock = self.rt.clock
        if clock is not None:  # the two dx matmuls; act' 3 per column, LN' 10 and residual 2 on x's rows
            r, rs = dv.shape[0], dy.shape[0]
            clock.matmul(r, blk.d, blk.dl)
            clock.matmul(r, blk.dl, blk.d)
            clock.stream((12 * rs * blk.d + 3 * r * blk.dl) * dy.itemsize)
        return dy + dx, lambda: self._block_backward_weight(blk, gflat, ctx, dv, dz1, ggamma, gbeta)

    @staticmethod
    def _block_backward_weight(blk: ShardedBlock, gflat, ctx, dv, dz1, ggamma, gbeta) -> None:
        """The W half: add the six parameter gradients (+=: micro-batches add up)."""
        dgamma, dbeta, dW1, db1, dW2, db2 = blk.views(gflat)
        h, u = ctx.arrays[3], ctx.arrays[5]
        for acc, new in (
            (dW2, u.T @ dv),
            (db2, dv.sum(axis=0)),
            (dW1, h.T @ dz1),
            (db1, dz1.sum(axis=0)),
            (dgamma, ggamma),
            (dbeta, gbeta),
        ):
            acc += new
        clock = blk.rt.clock
        if clock is not None:  # the two dW matmuls, db2 and db1's row sums, accumulating 3 per parameter
            r = dv.shape[0]
            clock.matmul(blk.dl, r, blk.d)
            clock.matmul(blk.d, r, blk.dl)
            clock.stream((r * blk.d + r * blk.dl + 3 * blk.size) * dv.itemsize)

    def _sync_sequence_grads(self, unit, gflat) -> None:
        """--sp: sum the partial gradients of parameters that saw only this rank's rows."""
        grads = gflat if isinstance(unit, LinearUnit) else gflat[: 2 * unit.d]  # gamma, beta
        collectives.allreduce(self.comm, grads, "model", "sp-grad-allreduce", self.algorithm)

    # -- the SerialStack interface ---------------------------------------------------------------------
    def forward(self, x, meter: HeldBytes, watch: NonFiniteWatch):
        contexts = []
        for u, (p, _) in zip(self.units, self.flats):
            x, ctx = self._block_forward(u, p, x) if isinstance(u, ShardedBlock) else u.forward(p, x)
            watch.check(u.index, x)
            meter.take(ctx.nbytes)
            contexts.append(ctx)
        return x, contexts

    def backward(self, contexts, grad, meter: HeldBytes, on_layer_done=None):
        """`on_layer_done` is given on the micro-step that communicates (the last of --grad-accum):
        only then are the sequence-parallel gradients complete, and summed over tp."""
        for u, (p, g), ctx in zip(reversed(self.units), reversed(self.flats), reversed(contexts)):
            if isinstance(u, ShardedBlock):
                grad = self._block_backward(u, p, g, ctx, grad)
            else:
                grad = u.backward(p, g, ctx, grad, need_dx=u.index > 0)
            meter.free(ctx.nbytes)
            if on_layer_done is not None:
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
        """On tp rank 0: [(unit index, W, b)] full shape -- a projection's (W, b), a block's (flat,
        empty) as in UnitStack -- of the parameters or of `flat` (laid out like store.params)."""
        flat = self.store.params if flat is None else flat
        mine, offset = [], 0
        for u in self.units:
            mine.append(flat[offset : offset + u.size].copy())
            offset += u.size
        shards = self.comm.gather_object(mine, root=0)
        if self.comm.rank != 0:
            return None
        out = []
        for n, u in enumerate(self.units):
            if isinstance(u, ShardedBlock):
                out.append((u.index, u.join([s[n] for s in shards]), np.empty(0, flat.dtype)))
            else:  # replicated: rank 0's copy
                out.append((u.index, *u.weights(shards[0][n])))
        return out

    def flat_from_full(self, full: list, dtype=None) -> np.ndarray:
        """A fresh array laid out like store.params: this rank's share of each full-shape unit."""
        parts = []
        for u in self.units:
            W, b = full[u.index]
            parts.append(u.cut(W) if isinstance(u, ShardedBlock) else np.concatenate((W.reshape(-1), b)))
        return np.concatenate(parts).astype(dtype or self.store.params.dtype, copy=False)
