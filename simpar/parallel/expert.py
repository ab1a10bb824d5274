"""Expert parallelism inside data parallelism (--experts E --ep P --dp D), as DeepSpeed-MoE and GShard.

The D data-parallel ranks are cut into D/P EXPERT-PARALLEL groups of P consecutive ranks; each group
holds all E experts of every MoE layer (simpar/moe.py), E/P per rank: ep rank j holds experts
j*E/P .. (j+1)*E/P - 1. Ranks that hold the same experts (same j, one per ep group) form an
EXPERT-DATA-PARALLEL group of D/P ranks. Everything outside the experts (dense layers, routers) is
replicated on all D ranks, as in plain data parallelism. --ep 1 is data parallelism of the MoE
model (D = 1: the serial MoE run); every layout computes the serial run's numbers.

One MoE layer, forward, on every rank (its own rows, in global row order after lower dp ranks'):
  1. route its rows (moe.route);
  2. exchange the routing histograms over the dp group (a ring all-gather of D x E int64 counts,
     `control/ep-histogram`): capacity is global -- an expert fills its slots in global row order --
     so each rank needs the counts of all lower ranks; the counts also give every rank the size of
     every piece it will receive, so no size messages follow, and f_e of the aux loss;
  3. all-to-all `activation/ep-dispatch` over the ep group: the rows of kept assignments go to the
     rank owning their expert (d_in wide), pieces ordered by expert, then row;
  4. each expert runs on the rows it received (from all P ranks of its group);
  5. all-to-all `activation/ep-combine`: the outputs (d_out wide) go back to their rows' ranks,
     which sum gate * output per row.
Backward mirrors it: `activation/ep-combine-grad` carries dL/dh (gate * dy, d_out wide) to the
expert owners, `activation/ep-dispatch-grad` carries dL/dx of the expert inputs (d_in wide) back.

Bytes per step for rank d (j = d mod P, group g), with kept[s][e] kept assignments of rank s to e:
  ep-dispatch and ep-combine-grad: sum over experts e NOT on d of kept[d][e] rows (d_in, d_out wide)
  ep-combine and ep-dispatch-grad: sum over ranks s != d of g, over e on d, of kept[s][e] rows
  each in P-1 messages per layer (collectives/alltoall.py); balanced routing with no drops:
  (P-1)/P x rows x K x width x bpe for each of the four. That is --alltoall pairwise (the default);
  --alltoall bruck (collectives/bruck.py) sends ceil(log2 P) messages instead, forwarding pieces on
  the way, so more bytes (its docstring has the sum; costmodel/moe.py writes both again).
Gradients: the non-expert parameters all-reduced over the dp group (`model/grad-allreduce`, one
call), the experts' over their expert-data-parallel group (`model/expert-grad-allreduce`), both
after backward: no buckets and no overlap (--bucket-mb and --no-overlap do not apply), kept simple
so that the all-to-alls stand out.
Checkpoints (and --weights-out): full shape is every router and all E experts of each MoE layer
(moe.pack_flat); the first ep group's ranks send their experts to world rank 0 (`control`), and a
resume on any --ep slices each rank's experts out again.

(Over 300 lines: the checkpoint hooks that gather and slice the experts sit beside the sharding they undo.)
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .. import collectives
from ..model.mlp import Linear, activation_of, init_layer, layer_backward, layer_forward
from ..model.moe import (
    aux_loss,
    capacity,
    histogram,
    init_moe,
    keep_mask,
    kept_counts,
    micro_rows,
    moe_layer_indices,
    pack_flat,
    route,
    router_backward,
    unpack_flat,
)
from ..model.precision import build_optimizer, loss_grad
from .base import Strategy


def pack(arrays: list, dtype):
    """One flat parameter buffer and one gradient buffer for `arrays`; [(param view, grad view)]."""
    total = sum(a.size for a in arrays)
    params, grads, views, off = np.empty(total, dtype), np.zeros(total, dtype), [], 0
    for a in arrays:
        params[off : off + a.size] = a.reshape(-1)
        views.append(
            (params[off : off + a.size].reshape(a.shape), grads[off : off + a.size].reshape(a.shape))
        )
        off += a.size
    return params, grads, views


def split_rows(arr, counts):
    return np.split(arr, np.cumsum(counts)[:-1])


class MoELayer:
    """One MoE layer on this rank: the replicated router and this rank's experts (see module doc)."""

    def __init__(self, strategy, index: int, Wr, dWr, experts: dict):
        model = strategy.model
        self.s, self.index, self.Wr, self.dWr, self.experts = strategy, index, Wr, dWr, experts
        self.E, self.K, self.C = model.experts, model.top_k, model.capacity_factor
        self.alpha = model.aux_loss_coef
        self.P = strategy.layout.ep
        self.per = self.E // self.P

    def owned_by(self, q: int) -> range:
        return range(q * self.per, (q + 1) * self.per)

    def alltoall(self, send, rows, op: str):
        """One all-to-all over the ep group, by --alltoall (pairwise exchange or Bruck's algorithm)."""
        return collectives.alltoall(self.s.ep, send, rows, "activation", op, self.s.layout.alltoall)

    def forward(self, x, N: int, B: int):
        """N: the global rows of this micro-step (its capacity and f_e); B: the global batch (the aux
        loss is weighted N/B per micro-step, so the G micro-steps' shares add up like the main loss)."""
        s, E, K, P = self.s, self.E, self.K, self.P
        p, top, gates = route(x, self.Wr, K, s.rt.clock)
        H = s.all_histograms(histogram(top, E))
        cap = capacity(self.C, K, N, E)
        kept = kept_counts(H, cap)
        d, j = s.dp.rank, s.ep.rank
        base = d - j
        keep = keep_mask(top, E, cap, H[:d].sum(axis=0))
        aux, dp_aux = aux_loss(p, H.sum(axis=0) / (N * K), self.alpha, B)
        dp_aux = dp_aux * p.dtype.type(s.loss_scale())  # --precision mixed-*: scaled like dL/dlogits
        s.record(self.index, H, kept)
        # assigned[e]: (rows, slots) of this rank's kept assignments to expert e, in row order
        assigned = [np.nonzero((top == e) & keep) for e in range(E)]
        # dispatch: to ep rank q the rows assigned to q's experts, expert by expert; from ep rank q
        # come from_q[q][k] rows for this rank's k-th expert (known from the histograms: no size messages)
        send = [np.concatenate([x[assigned[e][0]] for e in self.owned_by(q)]) for q in range(P)]
        from_q = [[int(kept[base + q, e]) for e in self.owned_by(j)] for q in range(P)]
        # dispatch_rows[a][b]: what ep rank a sends ep rank b, for the whole group (Bruck's all-to-all
        # forwards other ranks' pieces, so every rank needs every size); combine: the transpose
        dispatch_rows = kept[base : base + P].reshape(P, P, self.per).sum(axis=2).tolist()
        combine_rows = [list(col) for col in zip(*dispatch_rows)]
        got = self.alltoall(send, dispatch_rows, "ep-dispatch")
        got = [split_rows(g, c) for g, c in zip(got, from_q)]
        outs, ectx, width = [[] for _ in range(P)], {}, self.experts[self.owned_by(j)[0]].W.shape[1]
        for k, e in enumerate(self.owned_by(j)):
            xe = np.concatenate([got[q][k] for q in range(P)])
            h, ectx[e] = (
                layer_forward(self.experts[e], xe) if len(xe) else (np.zeros((0, width), x.dtype), None)
            )
            for q, piece in enumerate(split_rows(h, [c[k] for c in from_q])):
                outs[q].append(piece)
        # combine: each expert's outputs go back where its rows came from; to_q[q]: rows this rank sent q
        to_q = [[len(assigned[e][0]) for e in self.owned_by(q)] for q in range(P)]
        outs = [np.concatenate(o) for o in outs]
        back = self.alltoall(outs, combine_rows, "ep-combine")
        # gate x output summed in the router's type (float32 under mixed precision), rounded once
        y, hs = np.zeros((x.shape[0], width), p.dtype), {}
        for q in range(P):
            for e, h in zip(self.owned_by(q), split_rows(back[q], to_q[q])):
                rows, slots = assigned[e]
                y[rows] += gates[rows, slots][:, None] * h.astype(p.dtype, copy=False)
                hs[e] = h
        y = y.astype(x.dtype, copy=False)
        ctx = (x, p, top, gates, dp_aux, assigned, hs, ectx, from_q, to_q, dispatch_rows, combine_rows)
        held = x.nbytes + p.nbytes + sum(h.nbytes for h in hs.values())
        held += sum(c.nbytes for c in ectx.values() if c is not None)
        return y, aux, ctx, held

    def backward(self, dy, ctx):
        P, j = self.P, self.s.ep.rank
        x, p, top, gates, dp_aux, assigned, hs, ectx, from_q, to_q, dispatch_rows, combine_rows = ctx
        # the forward's two all-to-alls in reverse, with the same piece sizes: gate * dy to the experts
        # (combine-grad), dL/d(expert input) back to the rows' ranks (dispatch-grad)
        # (in the router's type, gate * dy rounded to the model's before it travels)
        f = p.dtype
        dgates, send = np.zeros(top.shape, f), []
        for q in range(P):
            pieces = []
            for e in self.owned_by(q):
                rows, slots = assigned[e]
                dyr = dy[rows].astype(f, copy=False)
                dgates[rows, slots] = (dyr * hs[e].astype(f, copy=False)).sum(axis=1)
                pieces.append((gates[rows, slots][:, None] * dyr).astype(x.dtype, copy=False))
            send.append(np.concatenate(pieces))
        got = self.alltoall(send, dispatch_rows, "ep-combine-grad")
        got = [split_rows(g, c) for g, c in zip(got, from_q)]
        outs = [[] for _ in range(P)]
        for k, e in enumerate(self.owned_by(j)):
            dh = np.concatenate([got[q][k] for q in range(P)])
            dxe = (
                layer_backward(self.experts[e], ectx[e], dh)
                if len(dh)
                else np.zeros((0, x.shape[1]), x.dtype)
            )
            for q, piece in enumerate(split_rows(dxe, [c[k] for c in from_q])):
                outs[q].append(piece)
        back = self.alltoall([np.concatenate(o) for o in outs], combine_rows, "ep-dispatch-grad")
        dx = np.zeros_like(x)
        for q in range(P):
            for e, piece in zip(self.owned_by(q), split_rows(back[q], to_q[q])):
                dx[assigned[e][0]] += piece
        dx_router = router_backward(dgates, dp_aux, p, top, gates, x, self.Wr, self.dWr, self.s.rt.clock)
        return (dx.astype(f, copy=False) + dx_router).astype(x.dtype, copy=False)


class ExpertParallel(Strategy):
    """Dense layers and routers replicated over the dp group; experts sharded over each ep group."""

    def __init__(self, sections, mesh):
        super().__init__(sections, mesh)
        model = self.model
        P, dtype, W = self.layout.ep, model.compute_dtype(), model.layers
        # The mesh made (and wrapped for bfloat16) the groups: ep varies the fastest part of the dp
        # index (d % P), edp the rest (d // P) -- runtime/mesh.py's AXES
        self.dp, self.ep, self.edp = mesh.dp_comm, mesh.groups["ep"], mesh.groups["edp"]
        moe, n, per = set(moe_layer_indices(model.n_layers)), model.n_layers, model.experts // P
        self.mine = range(self.ep.rank * per, (self.ep.rank + 1) * per)
        dense, experts = [], []
        for i in range(n):
            if i in moe:
                Wr, full = init_moe(model.seed, i, W[i], W[i + 1], model.experts, dtype)
                dense.append(Wr)
                experts += [a for e in self.mine for a in full[e]]
            else:
                dense += list(init_layer(model.seed, i, W[i], W[i + 1], dtype))
        self.dense, self.dense_grads, dviews = pack(dense, dtype)
        self.expert_params, self.expert_grads, eviews = pack(experts, dtype)
        self.layers = []
        for i in range(n):
            act = activation_of(i, n, model.activation)
            if i in moe:
                (Wr, dWr) = dviews.pop(0)
                ex = {}
                for e in self.mine:
                    (We, dWe), (be, dbe) = eviews.pop(0), eviews.pop(0)
                    ex[e] = Linear(i, We, be, dWe, dbe, act, rt=self.rt)
                self.layers.append(MoELayer(self, i, Wr, dWr, ex))
            else:
                (Wv, dWv), (bv, dbv) = dviews.pop(0), dviews.pop(0)
                self.layers.append(Linear(i, Wv, bv, dWv, dbv, act, rt=self.rt))
        # Mixed precision: ep ranks hold different experts' gradients, so the whole dp group votes on
        # skipping an overflowed step (precision.MixedPrecisionOptimizer).
        self.optimizer = build_optimizer(model, self.optimisation, self.dp, self.rt)
        self.routing = []  # per step: {layer index: (H, kept)}

    def loss_scale(self) -> float:
        """The mixed-precision loss scale (1 without --precision mixed-*): the aux loss's gradient
        starts scaled like the main loss's, and the optimizer divides both out."""
        return getattr(self.optimizer, "scale", 1.0)

    def all_histograms(self, counts):
        """Every dp rank's histogram (D x E), by a ring all-gather of counted messages (control)."""
        D, E = self.dp.size, counts.size
        H = np.zeros(D * E, np.int64)
        H[self.dp.rank * E : (self.dp.rank + 1) * E] = counts
        if D > 1:  # run here, off the collective streams: control traffic takes no simulated time
            for requests in collectives.ring_allgather_rounds(self.dp, H, "control", "ep-histogram"):
                MPI.Request.Waitall(requests)
        return H.reshape(D, E)

    def record(self, index, H, kept):
        self.routing[-1][index] = (H, kept)

    def train_step(self, micro_steps, global_batch: int) -> float:
        """--grad-accum G: each micro-step routes its own rows, with its own capacity and its own
        all-to-alls, as a framework that accumulates does; the gradients add up locally and are
        all-reduced once, after the last micro-step."""
        self.dense_grads.fill(0)
        self.expert_grads.fill(0)
        self.watch.reset()
        loss = 0.0
        for k, (x, y) in enumerate(micro_steps):
            self.routing.append({})  # one entry per micro-step
            rows = micro_rows(global_batch, len(micro_steps), k)
            loss += self._forward_backward(x, y, rows, global_batch)
        for comm, buf, op in (
            (self.dp, self.dense_grads, "grad-allreduce"),
            (self.edp, self.expert_grads, "expert-grad-allreduce"),
        ):
            if comm.size > 1:
                collectives.allreduce(comm, buf, "model", op, self.layout.collectives)
        self.optimizer.step(self.optimizer_params(), [self.dense_grads, self.expert_grads])
        return loss

    def _forward_backward(self, x, y, rows: int, global_batch: int) -> float:
        """One micro-step of `rows` global rows (this rank's x, y are its share of them); returns its
        share of the loss, main and aux, both normalised by the global batch."""
        loss, contexts = 0.0, []
        for layer in self.layers:
            if isinstance(layer, MoELayer):
                x, aux, ctx, held = layer.forward(x, rows, global_batch)
                loss += aux
            else:
                x, ctx = layer_forward(layer, x)
                held = ctx.nbytes
            self.watch.check(layer.index, x)
            self.meter.take(held)
            contexts.append((ctx, held))
        main, grad = loss_grad(self.optimizer, x, y, global_batch)
        for layer, (ctx, held) in zip(reversed(self.layers), reversed(contexts)):
            if isinstance(layer, MoELayer):
                grad = layer.backward(grad, ctx)
            else:
                grad = layer_backward(layer, ctx, grad, need_dx=layer.index > 0)
            self.meter.free(held)
        return loss + main

    def routing_summary(self) -> dict:
        """Per micro-step (steps x --grad-accum entries, step-major) and MoE layer: kept tokens per
        expert, drops, and kept per (dp rank, expert). `capacity`: the first micro-step's (the largest)."""
        order = sorted(self.routing[0]) if self.routing else []
        model, opt = self.model, self.optimisation
        rows = micro_rows(opt.batch, opt.grad_accum, 0)
        return {
            "experts": model.experts,
            "top_k": model.top_k,
            "capacity_factor": model.capacity_factor,
            "capacity": capacity(model.capacity_factor, model.top_k, rows, model.experts),
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

    def full_weights(self):
        """Full shape on world rank 0: (W, b) per dense layer, (moe.pack_flat, empty) per MoE layer."""
        return self._gather([self.dense, self.expert_params], "gather-weights")

    def memory(self) -> dict:
        n = self.dense.nbytes + self.expert_params.nbytes
        return self.memory_of(
            n, self.dense_grads.nbytes + self.expert_grads.nbytes, self.optimizer.state_nbytes()
        )

    # -- checkpoints: two positions, the replicated non-expert flat and this rank's experts ----------
    # Full shape is the --weights-out layout (an MoE layer's W_i = pack_flat(Wr, all E experts), b_i
    # empty), so a checkpoint holds every expert whichever ep rank trained it, and resumes on any --ep.
    def optimizer_params(self) -> list:
        return [self.dense, self.expert_params]

    def gather_full(self, local):
        return self._gather(local, "checkpoint-gather")

    def _gather(self, local, op: str):
        """[dense-like, experts-like] -> full shape on world rank 0 (None elsewhere). Only the first
        ep group moves anything (every group holds the same experts): its ep ranks 1..P-1 each send
        their E/P experts to ep rank 0 = world rank 0, one counted `control` message of
        (E/P) x sum over MoE layers of (d_in d_out + d_out) elements each."""
        dense, mine = local
        if self.dp.rank >= self.ep.size:
            return None
        if self.ep.rank != 0:
            self.ep.send(np.ascontiguousarray(mine), 0, "control", op)
            return None
        pieces = [mine] + [
            self.ep.recv(np.empty_like(mine), q, "control", op) for q in range(1, self.ep.size)
        ]
        dense_views = iter(self._split(dense, self._dense_shapes()))
        expert_views = [iter(self._split(piece, self._expert_shapes())) for piece in pieces]
        out = []
        for layer in self.layers:
            if not isinstance(layer, MoELayer):
                out.append((next(dense_views).copy(), next(dense_views).copy()))
                continue
            Wr = next(dense_views)
            experts = [  # global expert order: ep rank 0's E/P, then rank 1's, ...
                (next(views), next(views)) for views in expert_views for _ in range(layer.per)
            ]
            out.append((pack_flat(Wr, experts), np.zeros(0, dense.dtype)))
        return out

    def slice_full(self, full, dtype=None):
        """Full shape -> [the non-expert flat, this rank's experts' flat]; the experts are unpacked
        from each MoE layer's flat W_i, and only the ones this ep rank holds are kept."""
        dtype = dtype or self.dense.dtype
        dense, mine = [], []
        for layer, (W, b) in zip(self.layers, full):
            if not isinstance(layer, MoELayer):
                dense += [W, b]
                continue
            d_in, d_out = self.model.layers[layer.index], self.model.layers[layer.index + 1]
            Wr, experts = unpack_flat(W, d_in, d_out, self.model.experts)
            dense.append(Wr)
            mine += [a for e in self.mine for a in experts[e]]
        flat = lambda arrays: np.concatenate([a.reshape(-1) for a in arrays]).astype(dtype)  # noqa: E731
        return [flat(dense), flat(mine) if mine else np.zeros(0, dtype)]

    def _dense_shapes(self) -> list[tuple]:
        shapes = []
        for layer in self.layers:
            shapes += [layer.Wr.shape] if isinstance(layer, MoELayer) else [layer.W.shape, layer.b.shape]
        return shapes

    def _expert_shapes(self) -> list[tuple]:
        return [
            a.shape
            for layer in self.layers
            if isinstance(layer, MoELayer)
            for e in self.mine
            for a in (layer.experts[e].W, layer.experts[e].b)
        ]

    @staticmethod
    def _split(flat, shapes) -> list:
        out, off = [], 0
        for shape in shapes:
            size = int(np.prod(shape))
            out.append(flat[off : off + size].reshape(shape))
            off += size
        return out
