"""ZeRO with experts inside tensor parallelism (--arch gpt --experts E --ep P --tp T --dp D --zero 1|2|3
[--sp]): expert_tensor_gpt.py's layout with its model states sharded as expert_zero.py shards
expert_gpt.py's, and as zero_tp.py shards the dense gpt's tp shares.

expert_tensor_gpt.py splits attention, the embedding and the head over tp and replicates a block's MoE
part (LayerNorm 2, router, this ep rank's E/P experts) on every tp rank. It all-reduces two gradients
once a step: a rank's dense tp shares over its D dp ranks (the same tp index), and its experts over
its D/P expert-data-parallel ranks (edp, the same tp index too). ZeRO (Rajbhandari et al. 2020, sec.
5) replaces each by its halves over THAT group, exactly as expert_zero.py does without tp: a unit is
now a rank's tp share of one of gpt's units (zero_tp.py's n_i: embedding V h/T + s h, a block's dense
part 4h^2/T + 3h/T + 5h + hE, head 2h + hV/T) plus, for a block, its m_i = E/P (8h^2 + 5h) expert
elements -- replicated over tp, so each tp index's edp group shards its own copy (every tp rank
updates the same chunks the same way: the copies stay equal without a message). Chunks, stages,
op names, the optimizer's positions and the memory formulas are expert_zero.py's, read with those n_i
and m_i; tp's traffic (f, g, the vocabulary's ops, --sp's gathers) and the all-to-alls are
expert_tensor_gpt.py's, unchanged. --sp: the LayerNorms' row-shard gradients are summed over tp
("sp-grad-allreduce", as zero_tp.py) on a unit's buffer just before its reduce-scatter: once a step
for stages 1 and 2, on every micro-step for stage 3.

Bytes per rank per step (ring; RS(n, p, g) = n - chunk(n, p, g), AG(n, p, g) = n - chunk(n, p, g+1)):
stages 1/2 sum_i RS(n_i, D, d) + AG(n_i, D, d) + RS(m_i, D/P, q) + AG(m_i, D/P, q); stage 3 K (RS + 2 AG)
of each (K = --grad-accum), d the dp index and q = d div P the edp index. Closed forms:
costmodel/gpt_moe_zero_tp.py. Checkpoints: chunks gathered over dp and edp (expert_zero.py), then
expert_tensor_gpt.py's tp gather of the dense shares and ep gather of the experts to world rank 0.
--cp C (ContextExpertZeroTensor): context_expert_tensor.py's layout -- a tp group on its cp rank's tokens
-- whose every cp rank holds the same parameters and a share of the gradient, so the dense tp shares
shard over the D C ranks of `dpcp` and the experts over the (D/P) C of `edpcp` (context_expert_zero.py's
groups, at each tp index); read D C and (D/P) C above. Not built: with --pp (config/moe.py refuses it).
"""

from __future__ import annotations

import numpy as np

from ..model.gpt_moe import expert_size
from ..model.precision import build_optimizer
from .base import Strategy
from .context_expert import ContextExpertParallel, CpEpExchange
from .context_expert_tensor import ContextExpertTensorStack
from .expert_gpt import EpExchange
from .expert_tensor_gpt import ExpertTensorParallel, ExpertTensorStack, ShardedMoEBlock
from .expert_zero import DENSE, EXPERT, ExpertZero
from .vocab_parallel import vocab_loss_grad


class ExpertZeroTensor(ExpertZero):
    """ZeRO stage 1, 2 or 3 of expert_tensor_gpt.py's layout (module docstring)."""

    def __init__(self, sections, mesh):
        Strategy.__init__(self, sections, mesh)
        model = self.model
        self.stage, self.dtype = self.layout.zero, model.compute_dtype()
        self.dp, self.ep, self.edp = mesh.dp_comm, mesh.groups["ep"], mesh.groups["edp"]
        self.comms = self._sharding_groups(mesh)  # both hold ranks of this rank's tp index only
        per = model.experts // self.ep.size
        self.mine = range(self.ep.rank * per, (self.ep.rank + 1) * per)
        self.stack = st = self.make_stack(mesh)
        self.units = st.units
        parts, at = [], st.n_dense  # the store: every unit's dense tp share, then every block's experts
        for u, (p, _) in zip(st.units, st.flats):
            m = len(self.mine) * expert_size(u.h) if isinstance(u, ShardedMoEBlock) else 0
            parts.append((p, st.store.params[at : at + m]))
            at += m
        self.hold(parts)  # copies: the store is dropped, the units' parts live in self.params
        st.store.params = st.store.grads = np.empty(0, self.dtype)
        st.flats = None  # nothing may read the store's views any more
        self.ffns = st.ffns  # their experts bound to the gathered parts for each pass (_bind)
        for i, ffn in self.ffns.items():
            ffn.record = lambda H, kept, i=i: self.routing[-1].__setitem__(i, (H, kept))
            ffn.loss_scale = lambda: getattr(self.optimizer, "scale", 1.0)
        # tp shards differ and ranks update different chunks: the world votes on a skipped step
        self.optimizer = build_optimizer(model, self.optimisation, mesh.world, self.rt)
        self.routing = []

    def make_stack(self, mesh) -> ExpertTensorStack:
        return ExpertTensorStack(self.model, self.layout, mesh, self.mine, EpExchange(self))

    def _scatter(self, i: int, bufs) -> list:
        """--sp: the LayerNorms' row-shard gradients summed over tp first (zero_tp.py), then
        expert_zero.py's reduce-scatters over dp and edp."""
        if self.stack.sp:
            self.stack._sync_sequence_grads(self.units[i], bufs[DENSE])
        return super()._scatter(i, bufs)

    def _pass(self, tokens, labels, N: int, B: int, loss_rows: int, last: bool) -> float:
        """expert_zero.py's pass, unit by unit, through the tp stack's forward and backward."""
        st, x, contexts = self.stack, tokens, []
        st.N, st.B, st.aux = N, B, 0.0
        for i, u in enumerate(self.units):
            full = self._unit_params(i)
            if isinstance(u, ShardedMoEBlock):
                self._bind(i, full[EXPERT], None)
                x, ctx, held = st.moe_forward(u, full[DENSE], x)
            else:
                x, ctx = u.forward(full[DENSE], x)
                held = ctx.nbytes
            self._release(full)
            del full
            self.watch.check(u.index, x)
            self.meter.take(held)
            contexts.append((ctx, held))
        main, grad = vocab_loss_grad(st, self.optimizer, x, labels, loss_rows, self.model.seq_len)  # / B s
        for i in reversed(range(len(self.units))):
            u, (ctx, held) = self.units[i], contexts.pop()
            full = self._unit_params(i)  # stage 3: the second gather of this unit in this micro-step
            if self.stage == 1:
                bufs = self.grads[i]
            elif self.accum is not None:
                bufs = self.accum[i]
            else:  # one unit's gradient buffers, alive only until their reduce-scatters are done
                bufs = [np.zeros(n, self.dtype) for n in self.sizes[i]]
                self.grads_held.take(sum(b.nbytes for b in bufs))
            if isinstance(u, ShardedMoEBlock):
                self._bind(i, full[EXPERT], bufs[EXPERT])
                grad = st.moe_backward(u, full[DENSE], bufs[DENSE], ctx, grad)
            else:
                grad = u.backward(full[DENSE], bufs[DENSE], ctx, grad)
            self.meter.free(held)
            self._release(full)
            del full
            if self.stage > 1 and (last or self.stage == 3):  # this rank keeps the sum of its chunks
                for shard, mine in zip(self.shards[i], self._scatter(i, bufs)):
                    shard += mine
            if self.stage > 1 and self.accum is None:
                self.grads_held.free(sum(b.nbytes for b in bufs))
        return main + st.aux if self.mesh.tp_index == 0 else 0.0  # every tp rank computed the same

    # -- full shape: expert_tensor_gpt.py's, from [all dense shares, all my experts] ---------------------
    def _gather(self, local, op: str):
        dense, experts = local
        if dense.size == 0:  # a dp rank > 0 of the first ep group: only its experts travel
            dense = np.zeros(self.stack.n_dense, self.dtype)
        return ExpertTensorParallel._gather(self, np.concatenate([dense, experts]), op)

    def parts_from_full(self, full, dtype) -> list:
        flat = self.stack.flat_from(full, self.mine, dtype)
        return [flat[: self.stack.n_dense], flat[self.stack.n_dense :]]


class ContextExpertZeroTensor(ExpertZeroTensor):
    """--cp C as well: the units on this cp rank's tokens (context_expert_tensor.py's stack), every part
    sharded over its group x cp (module docstring)."""

    routing_summary = ContextExpertParallel.routing_summary  # per segment, global order

    def __init__(self, sections, mesh):
        self.cp, self.dpcp = mesh.groups["cp"], mesh.groups["dpcp"]  # for CpEpExchange
        super().__init__(sections, mesh)
        for i, ffn in self.ffns.items():  # CpMoEFFN's plan keeps (T, kept per segment)
            ffn.record = lambda H, kept, f=ffn, i=i: self.routing[-1].__setitem__(i, f.last)

    def _sharding_groups(self, mesh) -> tuple:
        return mesh.groups["dpcp"], mesh.groups["edpcp"]

    def make_stack(self, mesh) -> ContextExpertTensorStack:
        self.exchange = CpEpExchange(self)  # the all-to-alls, and the segment table over dpcp
        return ContextExpertTensorStack(self.model, self.layout, mesh, self.mine, self.exchange)

    def _micro_step(self, x, y, rows: int, global_batch: int, last: bool) -> float:
        """Chunks c and 2C-1-c of my dp rows; the loss still divides by the global batch's B s tokens."""
        self.exchange.rows, s, mine = rows, self.model.seq_len, self.stack.positions
        return self._pass(x[:, mine], y[:, mine], rows * s, global_batch * s, global_batch, last)

    def _gather(self, local, op: str):
        """From cp rank 0 (every cp rank holds the same parameters once gathered)."""
        return super()._gather(local, op) if self.cp.rank == 0 else None
