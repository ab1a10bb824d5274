"""ZeRO with experts (--arch gpt --experts E --ep P --dp D --zero 1|2|3): expert_gpt.py's layout with
its model states sharded, each part over the group that would all-reduce its gradient.

expert_gpt.py all-reduces two gradients: the dense parameters (embedding, attention, LayerNorms,
routers, head) over the D dp ranks, and this rank's E/P experts of every block over its D/P
expert-data-parallel ranks (`edp`: the ranks holding the same experts). ZeRO (Rajbhandari et al. 2020,
sec. 5; zero.py) replaces each all-reduce by its halves over THAT group, so the dense states shard D
ways and the experts' D/P ways -- as DeepSpeed does for its MoE (Rajbhandari et al. 2022,
"DeepSpeed-MoE"): its ZeRO-1/2 optimizer (deepspeed/runtime/zero/stage_1_and_2.py, _configure_moe_settings)
gives each MoE parameter group the expert-data-parallel group as the group it partitions over
(real_dp_process_group) and that group's size as its partition count. Its MoE long ran with ZeRO-1/2
only (the Alpa OSDI'22 artifact notes report DeepSpeed v0.5.4's MoE unable to use ZeRO-3); stage 3
here applies the same rule to the parameters themselves.

Unit by unit, in all three stages: unit i (embedding, block, head) has n_i dense elements (a block's
dense part, gpt_moe.dense_size) and m_i elements of this rank's experts (per E/P x expert_size, 0 for
the embedding and head). This rank owns chunk d of each n_i (dp rank d) and chunk q of each m_i (edp
rank q = d div P); chunks follow collectives.chunk_bounds, the optimizer steps on those chunks alone
(its positions: unit 0's dense chunk, unit 1's dense chunk, unit 1's expert chunk, ...).
  stage 1  params and grads whole; after the last micro-step each unit's gradients reduce-scattered
           (dense over dp `grad-reduce-scatter`, experts over edp `expert-grad-reduce-scatter`),
           the chunks updated, each unit's parameters all-gathered back (`param-all-gather`,
           `expert-param-all-gather`);
  stage 2  ... the gradients too: backward writes one unit's gradients into fresh buffers and
           reduce-scatters them at once (with --grad-accum K > 1 into whole buffers, reduce-scattered
           on the last micro-step, as zero.py);
  stage 3  ... the parameters too: each unit gathered for forward and again for backward, and its
           gradients reduce-scattered on every micro-step.
Bytes per rank per step (model): stages 1/2 sum_i RS(n_i, D, d) + AG(n_i, D, d) + RS(m_i, D/P, q) +
AG(m_i, D/P, q) (ring; ~ 2(D-1)/D M + 2(Q-1)/Q M_e, as the all-reduces of expert_gpt.py), stage 3
K (RS + 2 AG) of each. The all-to-alls and histograms are expert_gpt.py's, unchanged. Closed forms:
costmodel/gpt_moe_zero.py. Memory (as zero.py's, each part over its own group): params stage 1/2
M + M_e, stage 3 S_d + S_e + max_i (n_i + m_i) (one unit gathered); grads stage 1 M + M_e, stage 2/3
S_d + S_e + max_i (n_i + m_i) (stage 2 with K > 1: + M + M_e); optimizer K_opt (S_d + S_e).
Checkpoints: chunks gathered over dp and edp to the first ep group, then expert_gpt.py's gather to
rank 0; a --zero checkpoint resumes on any layout with experts and the other way round.
With --tp: expert_zero_tp.py (these stages on tp shares, through the hold and parts_from_full hooks).
"""

from __future__ import annotations

import numpy as np

from .. import collectives
from ..model.gpt_moe import MoEBlockUnit, expert_size
from ..model.moe import micro_rows
from ..model.precision import build_optimizer, loss_grad
from .base import HeldBytes, Strategy
from .expert_gpt import EpExchange, GptExpertParallel

DENSE, EXPERT = 0, 1  # the two parts of a unit, sharded over dp and over edp


class ExpertZero(GptExpertParallel):
    """ZeRO stage 1, 2 or 3 of expert_gpt.py's layout (module docstring)."""

    def __init__(self, sections, mesh):
        Strategy.__init__(self, sections, mesh)
        model = self.model
        self.stage, self.dtype = self.layout.zero, model.compute_dtype()
        self.dp, self.ep, self.edp = mesh.dp_comm, mesh.groups["ep"], mesh.groups["edp"]
        self.comms = self._sharding_groups(mesh)  # (dense parts', experts')
        per = model.experts // self.layout.ep
        self.mine = range(self.ep.rank * per, (self.ep.rank + 1) * per)
        self.units = self.make_units()
        parts = []  # unit i's (dense part, this rank's experts), whole
        for u in self.units:  # every rank builds the full shape from (seed, unit)
            full = u.init(model.seed, self.dtype)
            if not isinstance(u, MoEBlockUnit):
                parts.append((full, full[:0]))
                continue
            n, e = u.dense, expert_size(u.h)  # this rank's experts lie end to end after the dense part
            parts.append((full[:n], full[n + self.mine.start * e : n + self.mine.stop * e]))
        self.hold(parts)
        self.ffns, exchange = {}, EpExchange(self)
        for u in self.units:
            if isinstance(u, MoEBlockUnit):
                ffn = self.ffn_class(u.h, u.E, u.K, u.C, u.alpha, {}, exchange, self.rt)
                ffn.record = lambda H, kept, i=u.index: self.routing[-1].__setitem__(i, (H, kept))
                ffn.loss_scale = lambda: getattr(self.optimizer, "scale", 1.0)
                self.ffns[u.index] = ffn
        # Mixed precision: ranks hold different gradient chunks, so the whole group votes on a skip.
        self.optimizer = build_optimizer(model, self.optimisation, self.comms[DENSE], self.rt)
        self.routing = []

    def hold(self, parts: list) -> None:
        """Keep unit i's parts[i] = (dense, experts) whole (stages 1/2) or this rank's chunk of each
        (stage 3), and the gradient buffers of the stage (expert_zero_tp.py passes its tp shares)."""
        self.sizes = [(dense.size, experts.size) for dense, experts in parts]  # (n_i, m_i)
        # bounds[i][part] = this rank's chunk [lo, hi) of that part
        self.bounds = [
            tuple(self._chunk(n, comm) for n, comm in zip(sizes, self.comms)) for sizes in self.sizes
        ]
        # the optimizer's positions: every (unit, part) that has elements
        self.slots = [(i, part) for i, n in enumerate(self.sizes) for part in (DENSE, EXPERT) if n[part]]
        self.grads_held, self.gathered = HeldBytes(), HeldBytes()
        whole = self.stage < 3  # stage 1/2: whole parts; stage 3: my chunks
        self.params = [
            [a.copy() if whole else a[slice(*b)].copy() for a, b in zip(pair, bounds)]
            for pair, bounds in zip(parts, self.bounds)
        ]
        self.grads = None  # stage 1: whole gradients of every part, kept for the step
        self.accum = None  # stage 2 with --grad-accum > 1: whole buffers the micro-steps add into
        if self.stage == 1:
            self.grads = [[np.zeros_like(p) for p in pair] for pair in self.params]
            self.grads_held.take(self._total(whole=True))
        else:
            self.shards = [[np.zeros(hi - lo, self.dtype) for lo, hi in b] for b in self.bounds]
            self.grads_held.take(self._total(whole=False))

    def _sharding_groups(self, mesh) -> tuple:
        """The groups that sum each part's gradient: dp, and the experts' edp (context_expert_zero.py:
        dp x cp and edp x cp)."""
        return mesh.dp_comm, mesh.groups["edp"]

    def _chunk(self, n: int, comm) -> tuple[int, int]:
        b = collectives.chunk_bounds(n, comm.size)
        return int(b[comm.rank]), int(b[comm.rank + 1])

    def _total(self, whole: bool) -> int:
        """Bytes of every unit's parts (whole) or of this rank's chunks of them."""
        if whole:
            return sum(n + m for n, m in self.sizes) * self.dtype.itemsize
        return sum(hi - lo for b in self.bounds for lo, hi in b) * self.dtype.itemsize

    # -- one unit's parameters and gradients ------------------------------------------------------------
    def _unit_params(self, i: int) -> list:
        """Unit i's parts whole; stage 3 all-gathers them into fresh buffers (freed by _release)."""
        if self.stage < 3:
            return self.params[i]
        out = []
        for part, (comm, op) in enumerate(zip(self.comms, ("param-all-gather", "expert-param-all-gather"))):
            full = np.empty(self.sizes[i][part], self.dtype)
            lo, hi = self.bounds[i][part]
            full[lo:hi] = self.params[i][part]
            if full.size:
                collectives.allgather(comm, full, "model", op)
            out.append(full)
        self.gathered.take(sum(f.nbytes for f in out))
        return out

    def _release(self, full: list) -> None:
        if self.stage == 3:
            self.gathered.free(sum(f.nbytes for f in full))

    def _bind(self, i: int, params, grads) -> None:
        """Point block i's MoEFFN at its experts' parameters (and gradient buffers) for this pass."""
        if self.units[i].index in self.ffns:
            n = len(params) // len(self.mine)
            cut = lambda flat, k: None if flat is None else flat[k * n : (k + 1) * n]  # noqa: E731
            self.ffns[self.units[i].index].experts = {
                e: (cut(params, k), cut(grads, k)) for k, e in enumerate(self.mine)
            }

    def _scatter(self, i: int, bufs) -> list:
        """Unit i's gradient parts summed over their groups: this rank's chunk of each (views of bufs)."""
        ops = ("grad-reduce-scatter", "expert-grad-reduce-scatter")
        return [
            collectives.reduce_scatter(comm, buf, "model", op) if buf.size else buf
            for comm, buf, op in zip(self.comms, bufs, ops)
        ]

    # -- one step ----------------------------------------------------------------------------------------
    def train_step(self, micro_steps, global_batch: int) -> float:
        self.watch.reset()
        K = len(micro_steps)
        for pair in self.grads or self.shards:
            for g in pair:
                g.fill(0)
        self.accum = None
        if self.stage == 2 and K > 1:  # the earlier micro-steps add up somewhere whole (zero.py)
            self.accum = [[np.zeros(n, self.dtype), np.zeros(m, self.dtype)] for n, m in self.sizes]
            self.grads_held.take(self._total(whole=True))
        loss = 0.0
        for k, (x, y) in enumerate(micro_steps):
            self.routing.append({})
            loss += self._micro_step(x, y, micro_rows(global_batch, K, k), global_batch, last=k == K - 1)
        if self.accum is not None:
            self.grads_held.free(self._total(whole=True))
            self.accum = None
        # stage 1 reduce-scatters each unit's whole gradients now; stages 2/3 did so during backward
        chunks = [self._scatter(i, b) for i, b in enumerate(self.grads)] if self.stage == 1 else self.shards
        self.optimizer.step(self.optimizer_params(), [chunks[i][part] for i, part in self.slots])
        if self.stage < 3:  # everyone needs everyone's updated chunks for the next forward
            ops = ("param-all-gather", "expert-param-all-gather")
            for pair in self.params:
                for comm, whole, op in zip(self.comms, pair, ops):
                    if whole.size:
                        collectives.allgather(comm, whole, "model", op)
        return loss

    def _micro_step(self, x, y, rows: int, global_batch: int, last: bool) -> float:
        """One micro-step of `rows` global sequences (context_expert_zero.py: on this cp rank's tokens)."""
        s = self.model.seq_len
        return self._pass(x, y, rows * s, global_batch * s, global_batch, last)

    def _pass(self, tokens, labels, N: int, B: int, loss_rows: int, last: bool) -> float:
        """gpt_moe.train_pass, unit by unit with ZeRO's gathers and reduce-scatters around each unit: N,
        B the micro-step's and the step's global tokens, loss_rows the rows the loss divides over."""
        x, contexts, loss = tokens, [], 0.0
        for i, u in enumerate(self.units):
            full = self._unit_params(i)
            if u.index in self.ffns:
                self._bind(i, full[EXPERT], None)
                x, aux, ctx, held = u.forward_moe(full[DENSE], x, self.ffns[u.index], N, B)
                loss += aux
            else:
                x, ctx = u.forward(full[DENSE], x)
                held = ctx.nbytes
            self._release(full)
            del full
            self.watch.check(u.index, x)
            self.meter.take(held)
            contexts.append((ctx, held))
        main, grad = loss_grad(self.optimizer, x, labels, loss_rows)
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
            if u.index in self.ffns:
                self._bind(i, full[EXPERT], bufs[EXPERT])
                grad = u.backward_moe(full[DENSE], bufs[DENSE], ctx, grad, self.ffns[u.index])
            else:
                grad = u.backward(full[DENSE], bufs[DENSE], ctx, grad, need_dx=u.index > 0)
            self.meter.free(held)
            self._release(full)
            del full
            if self.stage > 1 and (last or self.stage == 3):  # this rank keeps the sum of its chunks
                for shard, mine in zip(self.shards[i], self._scatter(i, bufs)):
                    shard += mine
            if self.stage > 1 and self.accum is None:
                self.grads_held.free(sum(b.nbytes for b in bufs))
        return loss + main

    # -- reporting and checkpoints -------------------------------------------------------------------------
    def memory(self) -> dict:
        # stage 3: its chunks plus one unit gathered whole while it computes (gathered.peak; 0 otherwise)
        held = self._total(whole=self.stage < 3) + self.gathered.peak
        return self.memory_of(held, self.grads_held.peak, self.optimizer.state_nbytes())

    def optimizer_params(self) -> list:
        """This rank's chunk of each unit's dense part and of its experts (positions, in unit order)."""
        if self.stage == 3:
            return [self.params[i][part] for i, part in self.slots]
        return [self.params[i][part][slice(*self.bounds[i][part])] for i, part in self.slots]

    def full_weights(self):
        if self.stage < 3:  # every part whole already: expert_gpt.py's gather of the experts
            return self._gather(self._concat(self.params), "gather-weights")
        return self._gather_chunks(self.optimizer_params(), "gather-weights")

    def gather_full(self, local):
        return self._gather_chunks(local, "checkpoint-gather")

    def _gather_chunks(self, local, op: str):
        """Chunks laid out like optimizer_params -> full shape on rank 0: each part's chunks gathered
        over its group (dense to dp rank 0, experts to edp rank 0: the first ep group), then
        expert_gpt.py's gather of the first ep group's experts to rank 0 (all control traffic)."""
        parts = [[np.zeros(0, self.dtype), np.zeros(0, self.dtype)] for _ in self.units]
        for (i, part), chunk in zip(self.slots, local):
            parts[i][part] = np.ascontiguousarray(chunk)
        whole = [[None, None] for _ in self.units]
        for part, comm in enumerate(self.comms):
            got = comm.gather_object([pair[part] for pair in parts], root=0)
            if comm.rank == 0:
                for i in range(len(self.units)):
                    whole[i][part] = np.concatenate([g[i] for g in got])
        if self.comms[EXPERT].rank != 0:  # not in the first ep group (of cp rank 0): nothing more to do
            return None
        if self.comms[DENSE].rank != 0:
            whole = [[np.zeros(0, self.dtype), pair[EXPERT]] for pair in whole]
        return self._gather(self._concat(whole), op)

    @staticmethod
    def _concat(pairs) -> list:
        """[(dense, experts)] per unit -> [all dense parts, all expert parts], as expert_gpt.py holds them."""
        return [np.concatenate([pair[part] for pair in pairs]) for part in (DENSE, EXPERT)]

    def slice_full(self, full, dtype=None):
        # [all dense parts, all my experts], as expert_gpt.py cuts them; then my chunk of each unit's
        cut = self.parts_from_full(full, dtype or self.dtype)
        out, at = [], [0, 0]
        for i, part in sorted(self.slots, key=lambda ip: ip[1]):
            lo, hi = self.bounds[i][part]
            out.append(((i, part), cut[part][at[part] + lo : at[part] + hi].copy()))
            at[part] += self.sizes[i][part]
        order = dict(out)
        return [order[ip] for ip in self.slots]

    def parts_from_full(self, full, dtype) -> list:
        """[every unit's dense part, every unit's part of this rank's experts] from full shape."""
        return GptExpertParallel.slice_full(self, full, dtype)

    def load_params(self, full) -> None:
        if self.stage == 3:
            super().load_params(full)
            return
        cut, at = self.parts_from_full(full, self.dtype), [0, 0]
        for i, sizes in enumerate(self.sizes):
            for part in (DENSE, EXPERT):
                self.params[i][part][...] = cut[part][at[part] : at[part] + sizes[part]]
                at[part] += sizes[part]
