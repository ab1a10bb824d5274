"""Context parallelism with MoE blocks (--arch gpt --experts E [--ep P] --cp C [--dp D], ep inside dp).

The world is dp x cp (runtime/mesh.py: rank = d C + c). Every rank holds, of each of its dp rank's
sequences, chunks c and 2C-1-c of 2C chunks of m = s/(2C) tokens (parallel/context.py), so n = s/C
tokens of each: the embedding, LayerNorms, router, experts and head run on them, the attention reaches
the rest over the cp group (context_attention.py: ring or Ulysses, K/V traffic as costmodel/cp.py).
The experts are sharded as in expert_gpt.py, at every cp coordinate: ep rank j of each group of P
consecutive dp ranks (the mesh's `ep` group, which varies ep only) holds experts j E/P .. (j+1) E/P - 1,
and the four all-to-alls run inside that group on its ranks' own tokens.

Capacity, exactly as serial. The serial model fills an expert's cap = ceil(C_f K N / E) slots in
global token order: row by row, and in a row position by position (model/moe.keep_mask). Split over
dp and cp, that order is a sequence of SEGMENTS of m tokens, row g's chunk q being segment 2C g + q,
and rank (d, c) holds segments 2C g + c and 2C g + 2C-1-c of its rows g -- segments of different cp
ranks interleave, so a rank's "tokens before mine" is not one number (dp's H[:d] of expert_gpt.py)
but one per segment. So each rank counts its assignments per segment (2b x E), ONE ring all-gather
over the dp x cp group (`control/cp-ep-histogram`, padded to the largest dp rank's rows) gives every
rank the whole table T (2C B_k x E, global order), and expert e keeps, of segment i,
    kept_i[e] = clip(cap - sum_{i' < i} T_{i'}[e], 0, T_i[e])         (moe.kept_counts over segments)
with keep_mask run per segment from that prefix sum: the same tokens are dropped as in the serial
run, whatever D and C. Rank (d, c) keeps the sum of its segments' kept rows; the all-to-all pieces
follow from those (D x E at its cp coordinate), as expert_gpt.py's do.

Gradients: the non-expert parameters are replicated on all dp C ranks (one ring all-reduce over the
`dpcp` group, `model/grad-allreduce`); the experts of ep rank j over the D/P x C ranks that hold them
(the mesh's `edpcp` group, `model/expert-grad-allreduce`). The loss divides by the global batch's
B s tokens (B x C rows of n tokens, as context.py). Full shape and checkpoints: expert_gpt.py's, from
cp rank 0's first ep group (every cp rank holds the same parameters), so a checkpoint resumes serially.
Bytes: costmodel/cp_moe.py.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .. import collectives
from ..collectives.base import offsets
from ..model.gpt import HeadUnit
from ..model.gpt_moe import MoEBlockUnit, MoEFFN, train_pass
from ..model.moe import capacity, histogram, keep_mask, kept_counts, micro_rows
from ..model.precision import loss_grad
from ..model.ring_attention import chunk_positions
from .context import ContextBlock, PositionedEmbedding
from .expert_gpt import EpExchange, GptExpertParallel


class ContextMoEBlock(MoEBlockUnit):
    """An MoE block on this cp rank's n = s/C tokens of each sequence; attention as ContextBlock's."""

    charged_keys = 0
    attend = ContextBlock.attend
    attend_backward = ContextBlock.attend_backward
    attend_core_backward = ContextBlock.attend_core_backward  # zb-h1/zb-v's B pass (gpt_moe_split.py)
    rebuild_softmax = ContextBlock.rebuild_softmax  # --recompute selective (pipeline/gpt_recompute.py)

    def __init__(self, model, index: int, comm, algo: str):
        super().__init__(
            index,
            model.hidden,
            model.heads,
            model.seq_len // comm.size,  # self.s: MY tokens of a sequence
            model.blocks,
            model.experts,
            model.top_k,
            model.capacity_factor,
            model.aux_loss_coef,
        )
        self.comm, self.algo, self.full_seq = comm, algo, model.seq_len


def context_moe_units(model, layout, comm, rt) -> list:
    """[embedding, L MoE blocks, head] on this cp rank's tokens (context.context_units' with MoE blocks)."""
    L, C, s = model.blocks, comm.size, model.seq_len
    units = (
        [PositionedEmbedding(model.vocab, s, model.hidden, chunk_positions(comm.rank, C, s))]
        + [ContextMoEBlock(model, i, comm, layout.cp_algo) for i in range(1, L + 1)]
        + [HeadUnit(L + 1, model.hidden, model.vocab, s // C)]
    )
    for unit in units:
        unit.rt = rt
    return units


def segment_order(rows: int, D: int, C: int) -> list[list[int]]:
    """For each dp x cp rank d C + c, the global index of each of its segments, in its local order
    (its rows g in order, and of each chunk c then chunk 2C-1-c): 2C g + c, 2C g + 2C-1-c."""
    starts = offsets(rows, D)
    return [
        [2 * C * g + q for g in range(starts[d], starts[d + 1]) for q in (c, 2 * C - 1 - c)]
        for d in range(D)
        for c in range(C)
    ]


class CpEpExchange(EpExchange):
    """EpExchange (the ep all-to-alls at this cp coordinate) plus the segment table over dp x cp."""

    def __init__(self, strategy):
        super().__init__(strategy)
        self.dpcp, self.C, self.c = strategy.dpcp, strategy.cp.size, strategy.cp.rank
        self.m = strategy.model.seq_len // (2 * self.C)  # tokens of a chunk
        self.rows = 0  # the micro-step's global rows: train_step sets it

    def segment_table(self, counts):
        """(T, mine): every segment's assignments per expert in global order (2C rows x E), and the
        global indices of this rank's segments (`counts`' rows). One counted ring all-gather."""
        D, C, E = self.D, self.C, counts.shape[1]
        order = segment_order(self.rows, D, C)
        slot = 2 * -(-self.rows // D) * E  # the largest dp rank's segments: equal pieces to gather
        flat = np.zeros(D * C * slot, np.int64)
        me = self.d * C + self.c  # my rank in the dpcp group (mesh.py: edp, ep, cp, the last fastest)
        flat[me * slot : me * slot + counts.size] = counts.reshape(-1)
        if D * C > 1:
            for requests in collectives.ring_allgather_rounds(self.dpcp, flat, "control", "cp-ep-histogram"):
                MPI.Request.Waitall(requests)
        T = np.zeros((2 * C * self.rows, E), np.int64)
        for r, segments in enumerate(order):
            T[segments] = flat[r * slot : r * slot + len(segments) * E].reshape(-1, E)
        return T, order[me]

    def by_rank(self, table):
        """Per dp rank at my cp coordinate: the sum over its segments (D x E)."""
        order = segment_order(self.rows, self.D, self.C)
        return np.stack([table[order[d * self.C + self.c]].sum(axis=0) for d in range(self.D)])


class CpMoEFFN(MoEFFN):
    """MoEFFN whose capacity is planned per segment over dp x cp (module docstring)."""

    last = None  # (T, kept per segment) of the latest plan, for the routing summary

    def plan(self, top, cap: int):
        ex, E = self.x, self.E
        segments = top.reshape(-1, ex.m, top.shape[1])  # my segments of m tokens, in local order
        T, mine = ex.segment_table(np.stack([histogram(t, E) for t in segments]))
        before = np.cumsum(T, axis=0) - T
        keep = np.concatenate([keep_mask(t, E, cap, before[g]) for t, g in zip(segments, mine)])
        kept = kept_counts(T, cap)
        self.last = (T, kept)
        return T, ex.by_rank(kept), keep.reshape(top.shape), ex.d - ex.j


class ContextExpertParallel(GptExpertParallel):
    """dp x cp with MoE blocks: experts over the ep group at each cp coordinate (module docstring)."""

    ffn_class = CpMoEFFN

    def __init__(self, sections, mesh):
        self.cp, self.dpcp = mesh.groups["cp"], mesh.groups["dpcp"]
        super().__init__(sections, mesh)
        self.edp = mesh.groups["edpcp"]  # an expert's replicas: every edp and cp coordinate
        self.positions = chunk_positions(self.cp.rank, self.cp.size, self.model.seq_len)
        self.exchange = CpEpExchange(self)
        for i, ffn in self.ffns.items():
            ffn.x = self.exchange
            ffn.record = lambda H, kept, f=ffn, i=i: self.routing[-1].__setitem__(i, f.last)

    def make_units(self) -> list:
        return context_moe_units(self.model, self.layout, self.cp, self.rt)

    def train_step(self, micro_steps, global_batch: int) -> float:
        """expert_gpt.py's step on my tokens of my rows; gradients over dpcp and edpcp."""
        self.dense_grads.fill(0)
        self.expert_grads.fill(0)
        self.watch.reset()
        s, C, loss = self.model.seq_len, self.cp.size, 0.0
        for k, (x, y) in enumerate(micro_steps):
            self.routing.append({})
            self.exchange.rows = micro_rows(global_batch, len(micro_steps), k)
            x, y = x[:, self.positions], y[:, self.positions]

            def grad_of(logits, y=y):  # B x C rows of n = s/C tokens: divides by B s (context.py)
                return loss_grad(self.optimizer, logits, y, global_batch * C)

            N = self.exchange.rows * s
            loss += train_pass(
                self.units, self.flats, self.ffns, x, y, N, global_batch * s, grad_of, self.meter, self.watch
            )
        for comm, buf, op in (
            (self.dpcp, self.dense_grads, "grad-allreduce"),
            (self.edp, self.expert_grads, "expert-grad-allreduce"),
        ):
            if comm.size > 1:
                collectives.allreduce(comm, buf, "model", op, self.layout.collectives)
        self.optimizer.step(self.optimizer_params(), [self.dense_grads, self.expert_grads])
        return loss

    def routing_summary(self) -> dict:
        """expert_gpt.py's keys over the whole dp x cp batch; routed_by_segment: T per micro-step and
        block (2C B_k x E, global order), what costmodel/cp_moe.py reads; *_by_rank per dpcp rank."""
        order = sorted(self.routing[0]) if self.routing else []
        model, opt = self.model, self.optimisation
        tokens = micro_rows(opt.batch, opt.grad_accum, 0) * model.seq_len
        D, C = self.exchange.D, self.exchange.C

        def by_rank(step, i, which):
            table = step[i][which]
            rows = table.shape[0] // (2 * C)
            return [table[seg].sum(axis=0).tolist() for seg in segment_order(rows, D, C)]

        return {
            "experts": model.experts,
            "top_k": model.top_k,
            "capacity_factor": model.capacity_factor,
            "capacity": capacity(model.capacity_factor, model.top_k, tokens, model.experts),
            "grad_accum": opt.grad_accum,
            "ep": self.layout.ep,
            "cp": C,
            "alltoall": self.layout.alltoall,
            "layers": order,
            "tokens_per_expert": [[step[i][1].sum(axis=0).tolist() for i in order] for step in self.routing],
            "routed_per_expert": [[step[i][0].sum(axis=0).tolist() for i in order] for step in self.routing],
            "dropped": [[int(step[i][0].sum() - step[i][1].sum()) for i in order] for step in self.routing],
            "routed_by_segment": [[step[i][0].tolist() for i in order] for step in self.routing],
            "routed_by_rank": [[by_rank(step, i, 0) for i in order] for step in self.routing],
            "kept_by_rank": [[by_rank(step, i, 1) for i in order] for step in self.routing],
        }

    def _gather(self, local, op: str):
        """expert_gpt.py's gather from cp rank 0's first ep group (all cp ranks hold the same)."""
        return super()._gather(local, op) if self.cp.rank == 0 else None
