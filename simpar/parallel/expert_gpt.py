"""Expert parallelism of the MoE transformer (--arch gpt --experts E [--ep P] --dp D), as expert.py
does it for the MLP: ep inside dp (runtime/mesh.py: ep the fastest part of the dp index).

Every dp rank holds the embedding, each block's attention, LayerNorms and router, and the head whole
(replicated as in plain data parallelism, their gradients all-reduced over the dp group in one call,
`model/grad-allreduce`); ep rank j of each group of P consecutive dp ranks holds experts
j E/P .. (j+1) E/P - 1 of every block, their gradients all-reduced over the expert-data-parallel group
(`model/expert-grad-allreduce`, D/P ranks). --ep 1 --dp 1 is the serial MoE transformer.

Each block, on every rank, with its b s tokens (its sequences, in global order after lower dp ranks'):
route them (model/moe.py), exchange the D x E routing histograms over the dp group (`control/
ep-histogram`: global capacity, piece sizes), then the four all-to-alls of expert.py over the ep group,
h wide: `activation/ep-dispatch`, `ep-combine` forward, `ep-combine-grad`, `ep-dispatch-grad` backward
(the routine is model/gpt_moe.MoEFFN; this file gives it the exchange). Bytes: costmodel/gpt_moe.py.
No overlap and no buckets, as expert.py: the all-to-alls stand out.
Full shape (--weights-out, checkpoints): per unit its flat vector, a block's being its dense part
then all E experts, gathered from the first ep group to world rank 0 (`control`); a checkpoint
resumes on any --dp/--ep (slice_full keeps the rank's experts).
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .. import collectives
from ..model.gpt import Kept
from ..model.gpt_build import gpt_units
from ..model.gpt_moe import MoEBlockUnit, MoEFFN, train_pass
from ..model.moe import capacity, micro_rows
from ..model.precision import build_optimizer, loss_grad
from .base import Strategy
from .expert import pack


class EpExchange:
    """Where the experts live for MoEFFN: this rank's dp and ep coordinates, and the traffic."""

    def __init__(self, strategy):
        self.s = strategy
        self.D, self.d = strategy.dp.size, strategy.dp.rank
        self.P, self.j = strategy.ep.size, strategy.ep.rank

    def histograms(self, counts):
        """Every dp rank's histogram (D x E), by a ring all-gather of counted messages (control)."""
        D, E = self.D, counts.size
        H = np.zeros(D * E, np.int64)
        H[self.d * E : (self.d + 1) * E] = counts
        if D > 1:
            for requests in collectives.ring_allgather_rounds(self.s.dp, H, "control", "ep-histogram"):
                MPI.Request.Waitall(requests)
        return H.reshape(D, E)

    def alltoall(self, send, rows, op: str):
        if self.P == 1:
            return [send[0]]
        return collectives.alltoall(self.s.ep, send, rows, "activation", op, self.s.layout.alltoall)


class UnitContext(Kept):
    """One unit's context in an MoE stack (parallel/pipeline/expert_stage.py, expert_tensor_gpt.py) and
    the bytes it holds. A Kept, so that pipeline/recompute.save takes gpt_recompute.py's path: `attn`
    is a block's attention context (whose P --recompute selective drops and rebuilds), `nbytes` what
    the unit holds now (P dropped or not; the MoE part's bytes fixed)."""

    def __init__(self, ctx, held: int):
        self.ctx, self._kept = ctx, ctx[0] if isinstance(ctx, tuple) else ctx  # a block's: (Kept, ffn's)
        self._rest = held - self._kept.nbytes

    @property
    def attn(self):
        return getattr(self._kept, "attn", None)

    @property
    def nbytes(self) -> int:
        return self._kept.nbytes + self._rest


class GptExpertParallel(Strategy):
    """Non-expert units and parts replicated over dp; each block's experts sharded over the ep group."""

    def __init__(self, sections, mesh):
        super().__init__(sections, mesh)
        model, dtype = self.model, self.model.compute_dtype()
        self.dp, self.ep, self.edp = mesh.dp_comm, mesh.groups["ep"], mesh.groups["edp"]
        P = self.layout.ep
        per = model.experts // P
        self.mine = range(self.ep.rank * per, (self.ep.rank + 1) * per)
        self.units = self.make_units()
        dense, experts = [], []
        for u in self.units:  # every rank builds the full shape from (seed, unit) and keeps its part
            full = u.init(model.seed, dtype)
            if isinstance(u, MoEBlockUnit):
                dense.append(full[: u.dense])
                experts += [u.expert_flats(full)[e] for e in self.mine]
            else:
                dense.append(full)
        self.dense, self.dense_grads, dviews = pack(dense, dtype)
        self.expert_params, self.expert_grads, eviews = pack(experts, dtype)
        self.flats, self.ffns, exchange = dviews, {}, EpExchange(self)
        for u in self.units:
            if isinstance(u, MoEBlockUnit):
                mine = {e: eviews.pop(0) for e in self.mine}
                ffn = self.ffn_class(u.h, u.E, u.K, u.C, u.alpha, mine, exchange, self.rt)
                ffn.record = lambda H, kept, i=u.index: self.routing[-1].__setitem__(i, (H, kept))
                ffn.loss_scale = lambda: getattr(self.optimizer, "scale", 1.0)
                self.ffns[u.index] = ffn
        self.optimizer = build_optimizer(model, self.optimisation, self.dp, self.rt)
        self.routing = []  # per micro-step: {block index: (H, kept)}

    ffn_class = MoEFFN  # parallel/context_expert.py's plans capacity over cp ranks' chunks

    def make_units(self) -> list:
        return gpt_units(self.model, self.rt)

    def train_step(self, micro_steps, global_batch: int) -> float:
        """--grad-accum G: each micro-step routes its own tokens with its own capacity, as expert.py."""
        self.dense_grads.fill(0)
        self.expert_grads.fill(0)
        self.watch.reset()
        s, loss = self.model.seq_len, 0.0
        for k, (x, y) in enumerate(micro_steps):
            self.routing.append({})
            N = micro_rows(global_batch, len(micro_steps), k) * s

            def grad_of(logits, y=y):
                return loss_grad(self.optimizer, logits, y, global_batch)

            loss += train_pass(
                self.units, self.flats, self.ffns, x, y, N, global_batch * s, grad_of, self.meter, self.watch
            )
        for comm, buf, op in (
            (self.dp, self.dense_grads, "grad-allreduce"),
            (self.edp, self.expert_grads, "expert-grad-allreduce"),
        ):
            if comm.size > 1:
                collectives.allreduce(comm, buf, "model", op, self.layout.collectives)
        self.optimizer.step(self.optimizer_params(), [self.dense_grads, self.expert_grads])
        return loss

    def routing_summary(self) -> dict:
        """As expert.py's: per micro-step and block, tokens kept per expert, drops, per (dp rank, expert)."""
        order = sorted(self.routing[0]) if self.routing else []
        model, opt = self.model, self.optimisation
        tokens = micro_rows(opt.batch, opt.grad_accum, 0) * model.seq_len
        return {
            "experts": model.experts,
            "top_k": model.top_k,
            "capacity_factor": model.capacity_factor,
            "capacity": capacity(model.capacity_factor, model.top_k, tokens, model.experts),
            "grad_accum": opt.grad_accum,
            "ep": self.layout.ep,
            "alltoall": self.layout.alltoall,
            "layers": order,
            "tokens_per_expert": [[step[i][1].sum(axis=0).tolist() for i in order] for step in self.routing],
            "routed_per_expert": [[step[i][0].sum(axis=0).tolist() for i in order] for step in self.routing],
            "dropped": [[int(step[i][0].sum() - step[i][1].sum()) for i in order] for step in self.routing],
            "routed_by_rank": [[step[i][0].tolist() for i in order] for step in self.routing],
            "kept_by_rank": [[step[i][1].tolist() for i in order] for step in self.routing],
        }

    def memory(self) -> dict:
        return self.memory_of(
            self.dense.nbytes + self.expert_params.nbytes,
            self.dense_grads.nbytes + self.expert_grads.nbytes,
            self.optimizer.state_nbytes(),
        )

    # -- full shape: (unit's flat vector, empty) per unit; a block's = dense part + all E experts ------
    def full_weights(self):
        return self._gather([self.dense, self.expert_params], "gather-weights")

    def optimizer_params(self) -> list:
        return [self.dense, self.expert_params]

    def gather_full(self, local):
        return self._gather(local, "checkpoint-gather")

    def _gather(self, local, op: str):
        """Only the first ep group moves anything: its ep ranks 1..P-1 send their experts to ep rank 0
        = world rank 0 (one counted `control` message each)."""
        dense, mine = local
        if self.dp.rank >= self.ep.size:
            return None
        if self.ep.rank != 0:
            self.ep.send(np.ascontiguousarray(mine), 0, "control", op)
            return None
        pieces = [mine] + [
            self.ep.recv(np.empty_like(mine), q, "control", op) for q in range(1, self.ep.size)
        ]
        per, n_dense, out, offsets = len(self.mine), 0, [], [0] * len(pieces)
        for u in self.units:
            size = u.dense if isinstance(u, MoEBlockUnit) else u.size
            part = [dense[n_dense : n_dense + size]]
            n_dense += size
            if isinstance(u, MoEBlockUnit):
                n = per * (u.size - u.dense) // u.E  # this unit's E/P experts in one rank's flat
                for q, piece in enumerate(pieces):  # global expert order: ep rank 0's, then rank 1's
                    part.append(piece[offsets[q] : offsets[q] + n])
                    offsets[q] += n
            out.append((np.concatenate(part), np.zeros(0, dense.dtype)))
        return out

    def slice_full(self, full, dtype=None):
        dtype = dtype or self.dense.dtype
        dense, mine = [], []
        for u, (flat, _) in zip(self.units, full):
            if isinstance(u, MoEBlockUnit):
                dense.append(flat[: u.dense])
                mine += [u.expert_flats(flat)[e] for e in self.mine]
            else:
                dense.append(flat)
        cat = lambda arrays: np.concatenate([a.reshape(-1) for a in arrays]).astype(dtype)  # noqa: E731
        return [cat(dense), cat(mine) if mine else np.zeros(0, dtype)]
