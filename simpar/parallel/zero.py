"""ZeRO: data parallelism that stops replicating the model states (Rajbhandari et al. 2020).

Plain data parallelism keeps, on every one of p ranks, the parameters, the gradients and the
optimizer state of the whole model. ZeRO (sec. 5) notices that each rank only needs to *update*
1/p of them, and shards them one after the other:

  stage 1  P_os      optimizer state sharded              (sec. 5.1)
  stage 2  P_os+g    ... and the gradients                (sec. 5.2)
  stage 3  P_os+g+p  ... and the parameters themselves    (sec. 5.3)

Communication (sec. 7): an all-reduce is a reduce-scatter followed by an all-gather, so ZeRO-1/2
send exactly what DDP sends -- reduce-scatter the gradients (each rank receives the sum of ITS
chunk), update that chunk, all-gather the updated parameters: 2(p-1)/p * P elements per rank per
step (sec. 7.2.1). ZeRO-3 must gather the parameters twice, once for forward and again for
backward, because it threw them away in between: 3(p-1)/p * P, i.e. 1.5x DDP (sec. 7.2.2).

A "layer" below is a unit of resmlp.py: one MLP layer's flat (W, b), or with --arch resmlp a projection
or a whole residual block (LayerNorm, W1, W2 and biases) -- gathered, computed and reduce-scattered
as one. Under --precision mixed-* every buffer here is half precision and the optimizer keeps the
float32 masters of this rank's chunk (precision.py), so the ZeRO paper's Table 1 holds as measured.

Which elements a rank owns (its "chunk"; sizes follow collectives.chunk_bounds = np.array_split):
  stage 1   chunk r of the whole flat parameter vector (P elements), one reduce-scatter per step;
  stage 2/3 chunk r of EACH LAYER's flat (W, b) vector (n_l elements): gradients are
            reduce-scattered layer by layer as backward produces them, and stage 3 gathers one
            layer at a time. So totals over ranks are exact and each rank is within a few
            elements (at most one per layer and collective) of the (p-1)/p formula.

Gradient accumulation (--grad-accum K): stages 1 and 2 reduce-scatter only on the last micro-step
(like DDP); for stage 2 that means the earlier micro-steps need a FULL-size accumulation buffer,
which `grads` then reports honestly. Stage 3 gathers parameters on every micro-step anyway, so it
also reduce-scatters on every micro-step, into the shard: its gradients never exceed shard + one
layer, and its volume is 3K(p-1)/p * P. (DeepSpeed makes the same choice for stage 3.)

Memory, in bytes, measured from the arrays this rank holds (bpe = bytes per element, S1 = chunk_r(P),
S = sum over layers of chunk_r(n_l), n_max = the largest layer, K_opt = 1 for SGD with momentum,
2 for Adam):
  params     stage 1/2: P*bpe;  stage 3: (S + n_max)*bpe -- the persistent shard plus the largest
             full layer gathered for compute, alive at once (one layer at a time: the peak)
  grads      stage 1: P*bpe;  stage 2: (S + n_max)*bpe, or (S + P)*bpe if K > 1;  stage 3: (S + n_max)*bpe
             -- the shard plus the largest transient layer buffer alive at once (the peak)
  optimizer  stage 1: K_opt*S1*bpe;  stage 2/3: K_opt*S*bpe
  activations_peak  as data parallelism: the inputs and pre-activations kept for backward
How stage 2 avoids a full gradient in NumPy: backward writes each layer's gradient into a fresh
buffer of that layer's size, reduce-scatters it at once, adds this rank's chunk into the shard and
drops the buffer -- so at most one layer's buffer is alive next to the shard. (The temporaries a
kernel returns before `+=` into that buffer are not counted, as in every strategy.) Collectives are
blocking and always ring (--bucket-mb, --no-overlap, --collectives do not apply): overlapping the
next layer's backward would keep two layer buffers alive, and stage 3 would need to prefetch.
"""

from __future__ import annotations

import numpy as np

from .. import collectives
from ..model.precision import build_optimizer, loss_grad
from .base import HeldBytes, Strategy
from .resmlp_stack import make_stack, model_units


class ZeroDataParallel(Strategy):
    """ZeRO stage 1, 2 or 3 over the data-parallel group (layout.zero); the Strategy interface."""

    def __init__(self, sections, mesh):
        super().__init__(sections, mesh)
        self.stage = self.layout.zero
        self.comm = self._sharding_group(mesh)
        self.p, self.r = self.comm.size, self.comm.rank
        self.dtype = self.model.compute_dtype()
        self.bpe = self.dtype.itemsize
        # Units: the MLP's layers (W then b, flat), or resmlp's projections and blocks (resmlp.py).
        self.units = self._make_units()
        self.sizes = [u.size for u in self.units]  # n_l
        self.offsets = np.concatenate(([0], np.cumsum(self.sizes))).astype(int)
        self.P = int(self.offsets[-1])
        # Mixed precision: ranks hold different gradient shards, so they vote on skipping a step.
        self.optimizer = build_optimizer(self.model, self.optimisation, self.comm, self.rt)
        # Besides the activations (self.meter): gradient buffers, and stage 3's gathered layers.
        self.grads_held, self.gathered = HeldBytes(), HeldBytes()
        if self.stage == 1:
            self._init_stage1()
        else:
            self._init_layerwise()

    # -- construction ------------------------------------------------------------------------------
    # Three hooks, so that context_zero.py can shard over dp x cp with cp's units: the group the
    # states are sharded over, the units, and stage 1's whole-model stack.
    def _sharding_group(self, mesh):
        return mesh.dp_comm

    def _make_units(self) -> list:
        return model_units(self.model, self.rt)

    def _make_stack(self):
        return make_stack(self.model, rt=self.rt)

    def _init_stage1(self) -> None:
        # The whole model and its whole gradient on every rank (as DDP); only the optimizer shrinks.
        self.stack = self._make_stack()
        self.store = self.stack.store
        bounds = collectives.chunk_bounds(self.P, self.p)
        self.chunk = slice(int(bounds[self.r]), int(bounds[self.r + 1]))
        self.params_bytes = self.store.params.nbytes
        self.grads_held.take(self.store.grads.nbytes)

    def _init_layerwise(self) -> None:
        # Layer l's chunk r is [lo_l, hi_l) of its flat (W, b); my chunks of all layers, end to end,
        # make this rank's shard of S elements (one flat buffer for grads, and for stage-3 params).
        self.mine = []
        for n in self.sizes:
            b = collectives.chunk_bounds(n, self.p)
            self.mine.append((int(b[self.r]), int(b[self.r + 1])))
        seg = np.concatenate(([0], np.cumsum([hi - lo for lo, hi in self.mine]))).astype(int)
        self.segments = [slice(int(seg[i]), int(seg[i + 1])) for i in range(len(self.sizes))]
        self.S = int(seg[-1])
        self.grad_shard = np.zeros(self.S, dtype=self.dtype)
        self.grads_held.take(self.grad_shard.nbytes)
        if self.stage == 2:
            self.flat = np.empty(self.P, dtype=self.dtype)  # full parameters, as in stage 1
            target = self.flat
        else:
            self.param_shard = np.empty(self.S, dtype=self.dtype)
            target = self.param_shard
        for i, unit in enumerate(self.units):
            # Initialise on the full shape (identical to serial), keep what this stage stores.
            full = unit.init(self.model.seed, self.dtype)
            if self.stage == 2:
                target[self.offsets[i] : self.offsets[i + 1]] = full
            else:
                lo, hi = self.mine[i]
                target[self.segments[i]] = full[lo:hi]
        self.params_bytes = target.nbytes

    # -- parameters of one layer, for compute ---------------------------------------------------
    def _layer_params(self, i: int) -> np.ndarray:
        """Layer i's full flat parameters. Stage 3 all-gathers them into a fresh buffer that lives
        only while this layer computes (freed by `_done_with`)."""
        if self.stage == 2:
            return self.flat[self.offsets[i] : self.offsets[i + 1]]
        full = np.empty(self.sizes[i], dtype=self.dtype)
        lo, hi = self.mine[i]
        full[lo:hi] = self.param_shard[self.segments[i]]
        self.gathered.take(full.nbytes)
        collectives.allgather(self.comm, full, "model", "param-all-gather")
        return full

    def _done_with(self, full: np.ndarray) -> None:
        if self.stage == 3:
            self.gathered.free(full.nbytes)  # the caller drops its last reference right after

    # -- one step ----------------------------------------------------------------------------------
    def train_step(self, micro_steps, global_batch: int) -> float:
        self.watch.reset()
        K = len(micro_steps)
        if self.stage == 1:
            self.store.zero_grad()
        else:
            self.grad_shard.fill(0)
        self.accum = None
        if self.stage == 2 and K > 1:
            # Communicating only on the last micro-step means the earlier ones must add up somewhere
            # full-size: stage 2 pays P gradient elements for K > 1 (see the module docstring).
            self.accum = np.zeros(self.P, dtype=self.dtype)
            self.grads_held.take(self.accum.nbytes)
        loss = 0.0
        for k, (x, y) in enumerate(micro_steps):
            loss += self._forward_backward(x, y, global_batch, last=k == K - 1)
        self._update()
        if self.accum is not None:
            self.grads_held.free(self.accum.nbytes)
            self.accum = None
        return loss

    def _forward_backward(self, x, y, global_batch: int, last: bool) -> float:
        if self.stage == 1:
            # No traffic during the micro-steps: the full gradient accumulates locally, as in DDP.
            logits, contexts = self.stack.forward(x, self.meter, self.watch)
            loss, grad = loss_grad(self.optimizer, logits, y, global_batch)
            self.stack.backward(contexts, grad, self.meter)
            return loss
        contexts = []
        for i in range(len(self.sizes)):
            full = self._layer_params(i)
            x, ctx = self.units[i].forward(full, x)
            self._done_with(full)
            del full
            self.watch.check(i, x)
            self.meter.take(ctx.nbytes)
            contexts.append(ctx)
        loss, grad = loss_grad(self.optimizer, x, y, global_batch)
        for i in reversed(range(len(self.sizes))):
            grad = self._layer_backward(i, contexts.pop(), grad, last)
        return loss

    def _layer_backward(self, i: int, ctx, grad, last: bool):
        full = self._layer_params(i)  # stage 3: the second gather of this layer in this micro-step
        lo_l, hi_l = self.offsets[i], self.offsets[i + 1]
        if self.accum is not None:
            buf = self.accum[lo_l:hi_l]  # stage 2, K > 1: accumulate in the full-size buffer
        else:
            # A gradient buffer for this one layer: alive only until its reduce-scatter is done.
            buf = np.zeros(self.sizes[i], dtype=self.dtype)
            self.grads_held.take(buf.nbytes)
        grad = self.units[i].backward(full, buf, ctx, grad, need_dx=i > 0)
        self.meter.free(ctx.nbytes)
        self._done_with(full)
        del full  # stage 3: the gathered layer is gone before we communicate
        if last or self.stage == 3:
            # Sum over the group; this rank keeps only the sum of its own chunk of the layer.
            mine = collectives.reduce_scatter(self.comm, buf, "model", "grad-reduce-scatter")
            self.grad_shard[self.segments[i]] += mine
        if self.accum is None:
            self.grads_held.free(buf.nbytes)
        return grad

    def _update(self) -> None:
        """Each rank updates only the parameters it owns, with the optimizer state it alone keeps."""
        if self.stage == 1:
            mine = collectives.reduce_scatter(self.comm, self.store.grads, "model", "grad-reduce-scatter")
            self.optimizer.step(self.optimizer_params(), [mine])
            # The other chunks of grads now hold partial sums; zero_grad clears them next step.
            collectives.allgather(self.comm, self.store.params, "model", "param-all-gather")
            return
        self.optimizer.step(self.optimizer_params(), [self.grad_shard[s] for s in self.segments])
        if self.stage == 3:
            return  # the shard IS the parameters: nothing to gather back; next forward gathers anew
        for i in range(len(self.sizes)):  # everyone needs everyone's updated chunk for forward
            collectives.allgather(
                self.comm, self.flat[self.offsets[i] : self.offsets[i + 1]], "model", "param-all-gather"
            )

    # -- reporting ---------------------------------------------------------------------------------
    def full_weights(self):
        """Full-shape [(W, b), ...] on world rank 0, None elsewhere; every rank must call it.

        Stages 1/2 hold the full parameters already. Stage 3 sends each shard to rank 0 with
        counted point-to-point messages booked as "control" (reporting, not training traffic).
        """
        if self.stage != 3:
            if self.mesh.world.rank != 0:
                return None
            flat = self.store.params if self.stage == 1 else self.flat
            return [
                self.units[i].weights(flat[self.offsets[i] : self.offsets[i + 1]])
                for i in range(len(self.sizes))
            ]
        out = []
        for i, n in enumerate(self.sizes):
            if self.r == 0:
                full = np.empty(n, dtype=self.dtype)
                bounds = collectives.chunk_bounds(n, self.p)
                for q in range(self.p):
                    part = full[bounds[q] : bounds[q + 1]]
                    if q == 0:
                        part[...] = self.param_shard[self.segments[i]]
                    else:
                        self.comm.recv(part, q, "control", "gather-weights")
                out.append(self.units[i].weights(full))
            else:
                self.comm.send(self.param_shard[self.segments[i]], 0, "control", "gather-weights")
        return out if self.mesh.world.rank == 0 else None

    def memory(self) -> dict:
        # Stage 3 holds its shard plus, while a layer computes, that layer gathered in full: the
        # peak of the two together is what it needs (gathered.peak is 0 for stages 1/2).
        return self.memory_of(
            self.params_bytes + self.gathered.peak, self.grads_held.peak, self.optimizer.state_nbytes()
        )

    # -- checkpoints ---------------------------------------------------------------------------------
    def optimizer_params(self) -> list:
        """What this rank updates: stage 1 its chunk of the flat model (one position); stages 2/3 its
        chunk [lo, hi) of each layer's flat (W, b) (one position per layer)."""
        if self.stage == 1:
            return [self.store.params[self.chunk]]
        if self.stage == 3:
            return [self.param_shard[s] for s in self.segments]
        return [
            self.flat[self.offsets[i] + lo : self.offsets[i] + hi] for i, (lo, hi) in enumerate(self.mine)
        ]

    def gather_full(self, local):
        """Chunks in dp-rank order concatenate back to the whole (chunk_bounds): on world rank 0 (ZeRO
        is data parallelism only, so the dp group is the world)."""
        parts = self.comm.gather_object([np.ascontiguousarray(a) for a in local], root=0)
        if self.r != 0:
            return None
        if self.stage == 1:
            flat = np.concatenate([p[0] for p in parts])
            layers = [flat[self.offsets[i] : self.offsets[i + 1]] for i in range(len(self.sizes))]
        else:
            layers = [np.concatenate([p[i] for p in parts]) for i in range(len(self.sizes))]
        return [self.units[i].weights(f) for i, f in enumerate(layers)]

    def slice_full(self, full, dtype=None):
        layers = [np.concatenate((W.reshape(-1), b)).astype(dtype or self.dtype, copy=False) for W, b in full]
        if self.stage == 1:
            return [np.concatenate(layers)[self.chunk].copy()]
        return [f[lo:hi].copy() for f, (lo, hi) in zip(layers, self.mine)]

    def load_params(self, full) -> None:
        if self.stage == 3:
            super().load_params(full)  # the shard is all it holds
            return
        # Stages 1/2 hold every parameter (their owned chunks are views into it).
        flat = np.concatenate([np.concatenate((W.reshape(-1), b)) for W, b in full])
        (self.store.params if self.stage == 1 else self.flat)[...] = flat
