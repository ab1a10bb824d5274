"""ZeRO-2 and ZeRO-3 inside tensor parallelism: --arch gpt --tp T --dp D [--cp C] --zero 2|3 [--sp].

zero_mesh.py shards each tp shard's OPTIMIZER STATE over the dp ranks that hold the same shard (ZeRO-1,
Megatron-LM's distributed optimizer). This file goes on to stages 2 and 3 (Rajbhandari et al. 2020,
sec. 5.2 and 5.3) exactly as zero.py does without tp, unit by unit, where a "unit" is a rank's tp share
of one of gpt's units (tensor_gpt.py: the embedding's V/T rows, a block's heads and MLP columns, the
head's V/T columns -- n_u elements, the same share the tp layout holds and all-reduces):

  chunk g of unit u   np.array_split's g-th piece of the unit's n_u elements over the p = D ranks of
                      the dp group (g = this rank's dp index), or with --cp the p = D C ranks of the
                      dp x cp group (the mesh's `dpcp`, g = d C + c: a cp rank's gradient is one more
                      share of the serial one, context_tensor.py); S = sum over units of chunk(n_u, p, g)
  stage 2             the parameters stay whole (P_T = sum n_u); backward writes each unit's gradient
                      into a fresh n_u buffer, reduce-scatters it at once ("grad-reduce-scatter") and
                      keeps its chunk in the S-element gradient shard; after the update each unit's
                      parameters are all-gathered ("param-all-gather")
  stage 3             only the S-element parameter shard stays; each unit is all-gathered before its
                      forward and again before its backward ("param-all-gather", freed after use)

Bytes per rank per step (ring over p, model category; chunk(n, p, g) = np.array_split's g-th size):
  stage 2   sum_u (n_u - chunk(n_u, p, g)) grad  +  (n_u - chunk(n_u, p, g+1)) param   ~ 2(p-1)/p P_T
  stage 3   K times (each of the K micro-steps reduce-scatters, as zero.py's stage 3):
            sum_u (n_u - chunk(n_u, p, g)) grad  +  2 (n_u - chunk(n_u, p, g+1)) param ~ 3K(p-1)/p P_T
tp's own traffic (f, g, the vocabulary's collectives) is the tp layout's, unchanged; under --sp the
LayerNorm gammas' and betas' sum over tp ("sp-grad-allreduce") runs on each unit's buffer before its
reduce-scatter: once per step for stage 2, on every micro-step for stage 3.
Memory (bpe bytes per element, n_max = the largest n_u, K_opt = 2 for Adam, 1 for SGD with momentum):
  params     stage 2: P_T;  stage 3: S + n_max (the shard and one gathered unit, alive together)
  grads      S + n_max (stage 2 with --grad-accum K > 1: S + P_T, the full accumulation buffer)
  optimizer  K_opt S
Written again in costmodel/zero_tp.py, which never calls this file.

--cp: the units are context_tensor.py's (this cp rank's tokens, attention over the cp group with its
a/T heads), each micro-step's sequences cut to the rank's positions; cp's traffic is cp x tp's own.

Checkpoints: a unit's chunks in group order concatenate to the unit's tp share (gathered as control
traffic onto group rank 0: dp and cp index 0), and from there tensor_gpt.py's gather assembles the full
model: a checkpoint reshards to serial and back.

Not built: --arch mlp|resmlp (tensor.py's stacks) and --pp (as zero_mesh.py says); config/rules.py
refuses them.
"""

from __future__ import annotations

import numpy as np

from .. import collectives
from ..model.precision import build_optimizer
from .base import HeldBytes, Strategy
from .context_tensor import ContextTensorStack
from .tensor_gpt import GptTensorStack, ShardedBlock
from .vocab_parallel import vocab_loss_grad
from .zero_mesh import sharding_group


class ZeroGptTensorLayerwise(Strategy):
    """--arch gpt --tp T --dp D [--cp C] --zero 2|3 [--sp] (module docstring)."""

    def __init__(self, sections, mesh):
        super().__init__(sections, mesh)
        self.stage, self.comm = self.layout.zero, sharding_group(mesh)
        self.p, self.g = self.comm.size, self.comm.rank
        stack_class = ContextTensorStack if mesh.cp > 1 else GptTensorStack
        self.stack = stack_class(sections.model, sections.layout, mesh)
        self.units = self.stack.units
        self.sizes = [u.size for u in self.units]  # n_u, this tp rank's share of each unit
        self.offsets = np.concatenate(([0], np.cumsum(self.sizes))).astype(int)
        self.dtype = self.model.compute_dtype()
        # tp shards differ, and dp ranks update different chunks: the world votes on a skipped step
        self.optimizer = build_optimizer(self.model, self.optimisation, mesh.world, self.rt)
        self.mine, seg = [], [0]
        for n in self.sizes:
            b = collectives.chunk_bounds(n, self.p)
            self.mine.append((int(b[self.g]), int(b[self.g + 1])))
            seg.append(seg[-1] + self.mine[-1][1] - self.mine[-1][0])
        self.segments = [slice(seg[i], seg[i + 1]) for i in range(len(self.sizes))]
        self.grad_shard = np.zeros(seg[-1], self.dtype)
        self.grads_held, self.gathered = HeldBytes(), HeldBytes()
        self.grads_held.take(self.grad_shard.nbytes)
        store = self.stack.store
        if self.stage == 2:
            self.flat = store.params  # every parameter of this tp shard, as in stage 1
        else:
            self.param_shard = np.concatenate(
                [store.params[o + lo : o + hi] for o, (lo, hi) in zip(self.offsets, self.mine)]
            )
            store.params = np.empty(0, self.dtype)  # dropped: the shard is all stage 3 keeps
        store.grads = np.empty(0, self.dtype)  # gradients live in per-unit buffers and the shard
        self.stack.flats = None  # nothing may read the store's views any more
        self.params_bytes = self.flat.nbytes if self.stage == 2 else self.param_shard.nbytes

    # -- a unit's parameters, for compute -----------------------------------------------------------
    def _unit_params(self, i: int) -> np.ndarray:
        if self.stage == 2:
            return self.flat[self.offsets[i] : self.offsets[i + 1]]
        full = np.empty(self.sizes[i], self.dtype)  # alive only while the unit computes
        lo, hi = self.mine[i]
        full[lo:hi] = self.param_shard[self.segments[i]]
        self.gathered.take(full.nbytes)
        return collectives.allgather(self.comm, full, "model", "param-all-gather")

    def _done_with(self, full: np.ndarray) -> None:
        if self.stage == 3:
            self.gathered.free(full.nbytes)

    def _run_unit(self, i: int, params, x):
        u = self.units[i]
        return self.stack.block_forward(u, params, x) if isinstance(u, ShardedBlock) else u.forward(params, x)

    # -- one step -------------------------------------------------------------------------------------
    def train_step(self, micro_steps, global_batch: int) -> float:
        self.watch.reset()
        self.grad_shard.fill(0)
        K = len(micro_steps)
        self.accum = None
        if self.stage == 2 and K > 1:  # earlier micro-steps add up full-size (zero.py's stage 2)
            self.accum = np.zeros(self.offsets[-1], self.dtype)
            self.grads_held.take(self.accum.nbytes)
        mine = getattr(self.stack, "positions", None)  # --cp: this rank's tokens of every sequence
        loss = 0.0
        for k, (x, y) in enumerate(micro_steps):
            if mine is not None:  # the loss still divides by the global batch's B s tokens
                x, y = x[:, mine], y[:, mine]
            loss += self._forward_backward(x, y, global_batch, k == K - 1)
        self.optimizer.step(self.optimizer_params(), [self.grad_shard[s] for s in self.segments])
        if self.stage == 2:  # every dp rank needs every chunk's update for the next forward
            for i in range(len(self.sizes)):
                flat = self.flat[self.offsets[i] : self.offsets[i + 1]]
                collectives.allgather(self.comm, flat, "model", "param-all-gather")
        if self.accum is not None:
            self.grads_held.free(self.accum.nbytes)
            self.accum = None
        return loss if self.mesh.tp_index == 0 else 0.0  # every tp rank computed the same loss

    def _forward_backward(self, x, y, global_batch: int, last: bool) -> float:
        contexts = []
        for i, u in enumerate(self.units):
            full = self._unit_params(i)
            x, ctx = self._run_unit(i, full, x)
            self._done_with(full)
            del full
            self.watch.check(u.index, x)
            self.meter.take(ctx.nbytes)
            contexts.append(ctx)
        loss, grad = vocab_loss_grad(self.stack, self.optimizer, x, y, global_batch, self.model.seq_len)
        for i in reversed(range(len(self.units))):
            grad = self._unit_backward(i, contexts.pop(), grad, last)
        return loss

    def _unit_backward(self, i: int, ctx, grad, last: bool):
        u, full = self.units[i], self._unit_params(i)  # stage 3: this unit's second gather
        if self.accum is not None:
            buf = self.accum[self.offsets[i] : self.offsets[i + 1]]
        else:  # this unit's gradient, alive only until its reduce-scatter is done
            buf = np.zeros(self.sizes[i], self.dtype)
            self.grads_held.take(buf.nbytes)
        if isinstance(u, ShardedBlock):
            grad = self.stack.block_backward(u, full, buf, ctx, grad)
        else:
            grad = u.backward(full, buf, ctx, grad)
        self.meter.free(ctx.nbytes)
        self._done_with(full)
        del full
        if last or self.stage == 3:
            if self.stack.sp:  # parameters that saw only this rank's rows: their sum over tp first
                self.stack._sync_sequence_grads(u, buf)
            mine = collectives.reduce_scatter(self.comm, buf, "model", "grad-reduce-scatter")
            self.grad_shard[self.segments[i]] += mine
        if self.accum is None:
            self.grads_held.free(buf.nbytes)
        return grad

    # -- reporting and checkpoints --------------------------------------------------------------------
    def memory(self) -> dict:
        return self.memory_of(
            self.params_bytes + self.gathered.peak, self.grads_held.peak, self.optimizer.state_nbytes()
        )

    def optimizer_params(self) -> list:
        """Chunk g of each unit's tp share: one optimizer position per unit."""
        if self.stage == 3:
            return [self.param_shard[s] for s in self.segments]
        return [self.flat[o + lo : o + hi] for o, (lo, hi) in zip(self.offsets, self.mine)]

    def full_weights(self):
        return self.gather_full(self.optimizer_params())

    def gather_full(self, local):
        """Chunks -> each unit's tp share on group rank 0 (control), then tensor_gpt.py's tp gather."""
        parts = self.comm.gather_object([np.ascontiguousarray(a) for a in local], root=0)
        if self.g != 0:
            return None
        flat = np.concatenate([np.concatenate([q[i] for q in parts]) for i in range(len(self.units))])
        pieces = self.stack.full_pieces(flat)
        return [(W, b) for _, W, b in pieces] if self.mesh.world.rank == 0 else None

    def slice_full(self, full, dtype=None):
        flat = self.stack.flat_from_full(full, dtype or self.dtype)
        return [flat[o + lo : o + hi].copy() for o, (lo, hi) in zip(self.offsets, self.mine)]

    def load_params(self, full) -> None:
        if self.stage == 3:
            super().load_params(full)  # the shard is all it holds
            return
        self.flat[...] = self.stack.flat_from_full(full, self.dtype)
