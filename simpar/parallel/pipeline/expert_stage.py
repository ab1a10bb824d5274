"""MoE blocks on pipeline stages (--arch gpt --experts E --ep P --pp S [--dp D]; --schedule naive, gpipe,
1f1b or interleaved: a stage's several chunks are each such a stack).

The mesh (runtime/mesh.py) nests pp outside dp = edp x ep: a stage is D ranks, and its ep groups are P
consecutive dp ranks of that stage. A stage's chunk is the units lo..hi-1 of model/gpt_build.gpt_units
(cut by partition.py on the full units' sizes, every expert counted), each MoE block run as
expert_gpt.py runs it: dense part replicated over the stage's dp group, experts j E/P .. (j+1) E/P - 1
on ep rank j, the histograms exchanged over the stage's dp group (`control/ep-histogram`) and the four
all-to-alls over its ep group (`activation/ep-dispatch`, `ep-combine`, `ep-combine-grad`,
`ep-dispatch-grad`). The aux (load-balancing) loss of a block adds its gradient inside the block's own
backward (MoEFFN.backward), so nothing about it crosses a stage: each stage reports its blocks' shares.

Micro-batches ARE the serial run's micro-steps. Capacity (ceil(C K N / E)) and the aux loss's f_e are
per routing group, so a pipeline whose micro-batch mb were each dp rank's own mb-th slice would route
other token groups than any serial run. Instead the feeder (run/data.feeder_splits) cuts a step into
G x M micro-steps first and then splits each over dp, and micro-batch mb of grad-accum pass g is
micro-step g M + mb: the pipeline drops exactly the tokens `--grad-accum G M` drops serially (and
expert_gpt.py's --dp D --ep P --grad-accum G M), equal at 1e-12 in float64 with tokens dropped.

Bytes per rank and step (costmodel/gpt_moe_pipeline.py): per micro-batch of b sequences on this rank,
b s h per boundary forward ("pp-send-act") and backward ("pp-send-grad"), as gpt's pipeline; the
all-to-alls of its stage's blocks from the routing (costmodel/gpt_moe.py's rule); once per step each chunk's
stage's dense parameters all-reduced over dp (`model/grad-allreduce`) and its experts over the D/P
expert-data-parallel ranks (`model/expert-grad-allreduce`), no buckets and no overlap, as expert_gpt.py.

Checkpoints: full shape per unit (its flat vector, a block's being its dense part then all E experts,
as expert_gpt.py's), assembled by each stage's first ep group (ep ranks 1..P-1 send their experts to
ep rank 0, `control`), then gathered to world rank 0; any layout (serial included) resumes it.
The routing of every stage's blocks comes to rank 0 beside the final weights (full_weights, after the
ledger's snapshot), for the metrics' `moe` summary and the prediction.

With --tp a chunk is expert_tensor_gpt.py's ExpertTensorStack over its units (attention and the
vocabulary over tp, the MoE part replicated on it; each tp rank sends its own copy of the boundary's
b s h, and of the all-to-alls over its tp index's ep group): pp x dp x ep x tp, every factor free.
--recompute (recompute.py; a unit's context is a UnitContext, a Kept whose `attn` and `nbytes` it reads):
selective drops each block's softmax output P (a s^2 per sequence) and rebuilds it from the kept q, k
(gpt_recompute.py), no message; full keeps the chunk's input and re-runs its forward before the
backward, on the micro-step's own N and B: the same routes, so the same tokens dropped (_record checks
the histograms and kept counts against the forward's), its aux share not counted twice -- and the
forward's traffic again: the histograms' all-gather (`control/ep-histogram`) and per block the
`ep-dispatch` and `ep-combine` all-to-alls, real messages (costmodel/gpt_moe_pipeline.py counts them).
--schedule zb-h1 and zb-v: each unit's backward split into B and W (gpt_split.py, an MoE block's by
gpt_moe_split.py: the four all-to-alls stay in B, the experts' and router's weight gradients go to W);
no bucket hook (one all-reduce after the last W pass), so the W pass runs its closures in order.
With --tp --sp each tp rank of a stage holds its 1/T of the rows between units and at the boundaries
(expert_tensor_gpt.py's --sp), the LayerNorms' gradients summed over tp once a step (_allreduce).
--precision mixed-*: the aux loss's gradient scaled with the main loss's, the world voting on a skip.
With --cp the stages are pipeline/context_expert_stage.py's.
"""

from __future__ import annotations

import numpy as np

from ... import collectives
from ...model.gpt_build import gpt_units
from ...model.gpt_moe import MoEBlockUnit, MoEFFN, expert_size
from ...model.mlp import ParamStore
from ...model.moe import capacity, micro_rows
from ...model.precision import build_optimizer
from ...run.data import distributed_sampler, micro_steps
from ...runtime import trace
from ..expert_gpt import EpExchange, UnitContext
from ..expert_tensor_gpt import ExpertTensorStack
from .engine import PipelineParallel


class MoEChunkStack:
    """Units lo..hi-1 on this rank: one flat store, every unit's dense part (a block's outside its
    experts, the embedding and head whole) first, then this ep rank's experts of each block."""

    def __init__(self, model, rt, lo: int, hi: int, mine: range, exchange, units=None, ffn_class=MoEFFN):
        # units: the whole model's (context_expert_stage.py: a cp rank's); ffn_class plans capacity
        units = gpt_units(model, rt) if units is None else units
        self.units, dtype = units[lo:hi], model.compute_dtype()
        dense, experts = [], []
        for u in self.units:  # every rank builds the full shape from (seed, unit) and keeps its part
            full = u.init(model.seed, dtype)
            moe = isinstance(u, MoEBlockUnit)
            dense.append(full[: u.dense] if moe else full)
            experts += [u.expert_flats(full)[e] for e in mine] if moe else []
        self.n_dense = sum(d.size for d in dense)
        flat = np.concatenate(dense + experts).astype(dtype)
        self.store = ParamStore(flat, np.zeros_like(flat))
        self.flats, self.ffns, offset = [], {}, 0
        p, g = self.store.params, self.store.grads
        for d in dense:
            self.flats.append((p[offset : offset + d.size], g[offset : offset + d.size]))
            offset += d.size
        for u in self.units:
            if isinstance(u, MoEBlockUnit):
                views, n = {}, expert_size(u.h)
                for e in mine:
                    views[e] = (p[offset : offset + n], g[offset : offset + n])
                    offset += n
                self.ffns[u.index] = ffn_class(u.h, u.E, u.K, u.C, u.alpha, views, exchange, rt)
        self.N = self.B = 0  # the micro-step's and the step's global tokens, set before each forward
        self.aux = 0.0  # this rank's aux-loss shares of the step

    def forward(self, x, meter, watch):
        contexts = []
        for u, (p, _) in zip(self.units, self.flats):
            if u.index in self.ffns:
                x, aux, ctx, held = u.forward_moe(p, x, self.ffns[u.index], self.N, self.B)
                self.aux += aux
            else:
                x, ctx = u.forward(p, x)
                held = ctx.nbytes
            watch.check(u.index, x)
            meter.take(held)
            contexts.append(UnitContext(ctx, held))
        return x, contexts

    def backward(self, contexts, grad, meter, on_layer_done=None):
        for u, (p, g), c in zip(reversed(self.units), reversed(self.flats), reversed(contexts)):
            held = c.nbytes
            if u.index in self.ffns:  # inside a zero-bubble B pass: B now, W queued (gpt_moe_split.py)
                grad = u.backward_moe(p, g, c.ctx, grad, self.ffns[u.index])
            else:
                grad = u.backward(p, g, c.ctx, grad, need_dx=u.index > 0)
            meter.free(held)
        return grad

    # -- full shape: per unit (its flat vector with every expert, empty b) ---------------------------
    def full_units(self, flat, pieces: list) -> list:
        """[(unit index, full flat, empty)] from this rank's `flat` (laid out like store.params) and
        `pieces`: every ep rank's expert part of such a flat, ep rank 0's first."""
        out, dense_at, at = [], 0, 0
        for u, (p, _) in zip(self.units, self.flats):
            part = [flat[dense_at : dense_at + p.size]]
            dense_at += p.size
            if isinstance(u, MoEBlockUnit):  # this block's E/P experts in each piece, global order
                n = (u.E // len(pieces)) * expert_size(u.h)
                part += [piece[at : at + n] for piece in pieces]
                at += n
            out.append((u.index, np.concatenate(part), np.zeros(0, flat.dtype)))
        return out

    def flat_from(self, full: list, mine: range, dtype) -> np.ndarray:
        dense, experts = [], []
        for u in self.units:
            flat = full[u.index][0]
            moe = isinstance(u, MoEBlockUnit)
            dense.append(flat[: u.dense] if moe else flat)
            experts += [u.expert_flats(flat)[e] for e in mine] if moe else []
        return np.concatenate([a.reshape(-1) for a in dense + experts]).astype(dtype)


class ExpertPipelineParallel(PipelineParallel):
    """A pipeline stage whose chunks hold MoE blocks with experts sharded over the stage's ep group."""

    def __init__(self, sections, mesh):
        self.dp, self.ep, self.edp = mesh.dp_comm, mesh.groups["ep"], mesh.groups["edp"]
        self.replicas = self.dp  # who holds the same dense parameters (context_expert_stage.py: dp x cp)
        per = sections.model.experts // mesh.groups["ep"].size
        self.mine = range(self.ep.rank * per, (self.ep.rank + 1) * per)
        self.routing = []  # per micro-step of the run: {block index: (H, kept)} of this stage's blocks
        self._replay = False  # --recompute full's second forward: check the routing, do not record it
        super().__init__(sections, mesh)
        self.buckets = {}  # no buckets: one all-reduce of the dense part and one of the experts (below)
        for st in self.stacks.values():
            for i, ffn in st.ffns.items():
                ffn.record = lambda H, kept, i=i: self._record(i, H, kept)
                ffn.loss_scale = lambda: getattr(self.optimizer, "scale", 1.0)  # --precision mixed-*
        if self.model.mixed:  # a stage's ep ranks hold different experts: the world votes on a skip
            self.optimizer = build_optimizer(self.model, self.optimisation, mesh.world, self.rt)

    def _record(self, i: int, H, kept) -> None:
        micro = self.routing[self._micro]
        if not self._replay:
            micro[i] = (H, kept)
        elif not (np.array_equal(micro[i][0], H) and np.array_equal(micro[i][1], kept)):
            raise RuntimeError(f"--recompute full routed block {i} otherwise than its forward")

    def _stack(self, model, layout, mesh, lo: int, hi: int):
        # called inside PipelineParallel.__init__: self.layout and the groups above are already set
        if mesh.tp > 1:  # attention and vocabulary over tp, the MoE part replicated on it
            return ExpertTensorStack(model, layout, mesh, self.mine, EpExchange(self), range(lo, hi))
        return MoEChunkStack(model, mesh.world.runtime, lo, hi, self.mine, EpExchange(self))

    def _micro_batch_rows(self, global_batch: int) -> list[list[int]]:
        """Pass g's micro-batch mb: this dp rank's rows of micro-step g M + mb of G M (the feeder's)."""
        G, M = self.optimisation.grad_accum, self.M
        steps = micro_steps(np.arange(global_batch), G * M)
        D, d = self.mesh.dp, self.mesh.dp_index
        return [[len(distributed_sampler(steps[g * M + mb], D, d)) for mb in range(M)] for g in range(G)]

    def train_step(self, micro_steps_data, global_batch: int) -> float:
        """The feeder's G M micro-steps regrouped into G passes of M micro-batches."""
        M = self.M
        self._global_batch, self._pass, self._first = global_batch, -1, len(self.routing)
        self.routing += [{} for _ in micro_steps_data]

        def joined(parts):
            return None if parts[0] is None else np.concatenate(parts)

        groups = [micro_steps_data[g : g + M] for g in range(0, len(micro_steps_data), M)]
        passes = [(joined([x for x, _ in group]), joined([y for _, y in group])) for group in groups]
        for st in self.stacks.values():
            st.aux = 0.0
        loss = super().train_step(passes, global_batch)
        aux = sum(st.aux for st in self.stacks.values())
        return loss + aux if self.mesh.tp_index == 0 else loss  # tp ranks hold the same aux shares

    def _run(self, flight) -> None:
        self._pass += 1
        super()._run(flight)

    def _route(self, mb: int, stack) -> None:
        """Micro-batch mb of this pass is micro-step i: its routing entry, its N and B on the stack."""
        i, s = self._pass * self.M + mb, self.model.seq_len
        self._micro = self._first + i
        stack.N = micro_rows(self._global_batch, self.optimisation.grad_accum * self.M, i) * s
        stack.B = self._global_batch * s

    def _forward(self, step, flight) -> None:
        self._route(step.mb, self.stacks[step.chunk])
        super()._forward(step, flight)

    def _contexts(self, key: tuple, flight):
        """--recompute full re-runs (mb, chunk)'s forward here: on its own micro-step's N and B, so the
        same routes (checked by _record), its aux share already counted (kept as it was)."""
        stack = self.stacks[key[1]]
        self._route(key[0], stack)
        aux, self._replay = stack.aux, True
        try:
            return super()._contexts(key, flight)
        finally:
            stack.aux, self._replay = aux, False

    def _backward_weight(self, step, flight) -> None:
        """W: every unit's queued weight pass in order (no bucket hook: _allreduce after the last)."""
        weight_passes, nbytes = flight.weight_passes.pop((step.mb, step.chunk))
        with trace.span(self.pp_comm.runtime, f"W{step.mb}", "backward", mb=step.mb, chunk=step.chunk):
            for weight_pass in weight_passes:
                weight_pass()
        self.meter.free(nbytes)

    def _hook(self, step, flight):
        return None

    def _allreduce(self, step, flight) -> None:
        if not flight.communicate:  # gradient accumulation: only after the last pass
            return
        for c in self.chunks:
            st = self.stacks[c]
            for u, (_, g) in zip(st.units, st.flats) if self.layout.sp else ():
                st._sync_sequence_grads(u, g)  # --sp: the LayerNorms' row-shard gradients over tp
            for comm, buf, op in (
                (self.replicas, st.store.grads[: st.n_dense], "grad-allreduce"),
                (self.edp, st.store.grads[st.n_dense :], "expert-grad-allreduce"),
            ):
                if comm.size > 1 and buf.size:
                    collectives.allreduce(comm, buf, "model", op, self.layout.collectives)

    # -- the routing, and full shape ---------------------------------------------------------------
    def routing_summary(self) -> dict:
        """expert_gpt.py's summary over every stage's blocks (on rank 0, after full_weights)."""
        routing, model, opt = self._all_routing, self.model, self.optimisation
        order = sorted(routing[0]) if routing else []
        GM = opt.grad_accum * self.M
        tokens = micro_rows(opt.batch, GM, 0) * model.seq_len
        return {
            "experts": model.experts,
            "top_k": model.top_k,
            "capacity_factor": model.capacity_factor,
            "capacity": capacity(model.capacity_factor, model.top_k, tokens, model.experts),
            "grad_accum": GM,  # micro-steps per step: --grad-accum x --microbatches
            "microbatches": self.M,
            "ep": self.layout.ep,
            "alltoall": self.layout.alltoall,
            "layers": order,
            "tokens_per_expert": [[step[i][1].sum(axis=0).tolist() for i in order] for step in routing],
            "routed_per_expert": [[step[i][0].sum(axis=0).tolist() for i in order] for step in routing],
            "dropped": [[int(step[i][0].sum() - step[i][1].sum()) for i in order] for step in routing],
            "routed_by_rank": [[step[i][0].tolist() for i in order] for step in routing],
            "kept_by_rank": [[step[i][1].tolist() for i in order] for step in routing],
        }

    def full_weights(self):
        # every stage's routing (dp index 0's: the stage's histograms are all-gathered) to rank 0 too
        mine = self.routing if self.mesh.dp_index == 0 else None
        stages = self.mesh.world.gather_object(mine, root=0)
        if self.mesh.world.rank == 0:
            self._all_routing = [{} for _ in self.routing]
            for part in (p for p in stages if p is not None):
                for merged, micro in zip(self._all_routing, part):
                    merged.update(micro)
        return self._gather([st.params for st in self.stores], "gather-weights")

    def gather_full(self, local):
        return self._gather(local, "checkpoint-gather")

    def _gather(self, local, op: str):
        """Each stage's first ep group assembles its chunks' full units on its dp rank 0 (ep ranks
        1..P-1 send their experts, one `control` message a chunk); world rank 0 collects the stages."""
        pieces = None
        if self.mesh.dp_index < self.ep.size:  # with --tp: in each tp index's ep group alike
            parts = []
            for c, flat in zip(self.chunks, local):
                st = self.stacks[c]
                mine = np.ascontiguousarray(flat[st.n_dense :])
                if self.ep.rank != 0:
                    self.ep.send(mine, 0, "control", op)
                    continue
                got = [self.ep.recv(np.empty_like(mine), q, "control", op) for q in range(1, self.ep.size)]
                parts.append(st.full_units(flat, [mine] + got))  # None off tp rank 0
            if self.ep.rank == 0 and None not in parts:
                pieces = [piece for part in parts for piece in part]
        gathered = self.mesh.world.gather_object(pieces, root=0)
        if self.mesh.world.rank != 0:
            return None
        by_unit = {index: (W, b) for part in gathered if part for index, W, b in part}
        return [by_unit[i] for i in range(self.model.n_layers)]

    def slice_full(self, full, dtype=None):
        dtype = dtype or self.dtype
        return [self.stacks[c].flat_from(full, self.mine, dtype) for c in self.chunks]
