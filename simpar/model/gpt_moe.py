"""Mixture-of-experts transformer blocks (--arch gpt --experts E --top-k K --capacity-factor C).

Every one of the L blocks keeps its attention and swaps its MLP (h -> 4h -> h) for E expert MLPs of
the same shape and a router, as Switch Transformer does (Fedus et al. 2021, fig. 2; GShard puts one in
every other block, simpar in every block so that a two-block model already has two):

    x2 = x + Attn(LN1(x));   out = x2 + MoE(LN2(x2))
    MoE(u) = sum over KEPT j of g_j * FFN_{T_j}(u),   FFN_e(u) = W2_e gelu(W1_e u + c1_e) + c2_e

The router, top-k, gates, capacity (filled in global token order: data-parallel rank 0's tokens first)
and the Switch load-balancing loss are the MLP's, model/moe.py, unchanged: one token is one row. A
dropped token's MoE output is 0 and the residual carries it through, as in Switch. The aux loss of
every block adds to the loss; N is the micro-step's tokens (global rows x s).

Parameters of a block: the dense part 4h^2 + 8h + hE (LayerNorms 4h, q k v o 4h^2 + 4h, router h x E,
no bias) then E experts of 8h^2 + 5h (W1 h x 4h, c1, W2 4h x h, c2) -- the unit's flat vector, the
full-shape layout of --weights-out and checkpoints. Initialisation: attention and LayerNorms as the
dense block's (gpt.py, stream (seed, block, 1)), the router normal with std 1/sqrt(h) from (seed, block,
0) as moe.py's, expert e's W1, W2 as the dense MLP's (W2 scaled by 1/sqrt(2L)) from (seed, block, e + 2).

`MoEFFN` runs one block's routing on one rank, with an `exchange` that says where the experts live:
LOCAL (every expert here: the serial run, and evaluation) or parallel/expert_gpt.py's all-to-alls over
the ep group; its `plan` fills capacity (parallel/context_expert.py plans again per sequence chunk,
for cp ranks). `train_pass` is one micro-step's forward and backward over the units; the strategy runs
it and tests/unit/model/test_gpt_moe.py checks it against finite differences in float64.
"""

from __future__ import annotations

import math

import numpy as np

from ..runtime.context import PLAIN
from . import moe_charges as mc
from .gpt import INIT_STD, BlockUnit, Kept, _cut
from .gpt_moe_split import expert_backward_input, router_backward_input, split_backward_moe
from .mlp import pending_weight_passes
from .moe import aux_loss, capacity, histogram, keep_mask, kept_counts, route, router_backward
from .resmlp import layernorm_backward, layernorm_forward


def expert_size(h: int) -> int:
    """One expert MLP: W1 (h x 4h), c1 (4h), W2 (4h x h), c2 (h)."""
    return 8 * h * h + 5 * h


def dense_size(h: int, E: int) -> int:
    """A block's parameters outside its experts: LayerNorms 4h, attention 4h^2 + 4h, router h E."""
    return 4 * h * h + 8 * h + h * E


def split_rows(arr, counts):
    return np.split(arr, np.cumsum(counts)[:-1])


class LocalExchange:
    """Every expert on this rank: one dp rank, one ep rank, nothing moves."""

    D, d, P, j = 1, 0, 1, 0

    def histograms(self, counts):
        return counts[None, :]

    def alltoall(self, send, rows, op: str):
        return [send[0]]


LOCAL = LocalExchange()


class MoEFFN:
    """One block's experts on this rank (`experts`: {e: (params, grads)} flat vectors of expert_size)
    and the routing around them. ep rank j holds experts j E/P .. (j+1) E/P - 1."""

    def __init__(self, h, E, K, C, alpha, experts: dict, exchange=LOCAL, rt=PLAIN, unlimited=False):
        self.h, self.E, self.K, self.C, self.alpha = h, E, K, C, alpha
        self.experts, self.x, self.rt, self.unlimited = experts, exchange, rt, unlimited
        self.per = E // exchange.P
        self.record = None  # a callable(H, kept) the strategy sets to keep the routing
        self.loss_scale = lambda: 1.0  # --precision mixed-*: the strategy's optimizer's loss scale

    def owned_by(self, q: int) -> range:
        return range(q * self.per, (q + 1) * self.per)

    def views(self, flat):
        h = self.h
        return _cut(flat, ((h, 4 * h), (4 * h,), (4 * h, h), (h,)))

    def plan(self, top, cap: int):
        """(H, kept, keep, base): assignments per (dp rank, expert) in global token order, those the
        cap slots keep, this rank's (n x K) keep mask, and the row of kept where this rank's ep group
        starts. parallel/context_expert.py plans again for cp ranks, whose tokens interleave."""
        ex = self.x
        H = ex.histograms(histogram(top, self.E))
        return H, kept_counts(H, cap), keep_mask(top, self.E, cap, H[: ex.d].sum(axis=0)), ex.d - ex.j

    def forward(self, x, Wr, N: int, B: int):
        """x: this rank's n tokens (n x h); N: the micro-step's global tokens (capacity, f_e); B: the
        step's global tokens (the aux loss weight). Returns y, the aux loss share, ctx, bytes held."""
        E, K, P, ex, h = self.E, self.K, self.x.P, self.x, self.h
        clock = self.rt.clock
        p, top, gates = route(x, Wr, K, clock)
        cap = N * K if self.unlimited else capacity(self.C, K, N, E)
        H, kept, keep, base = self.plan(top, cap)
        aux, dp_aux = aux_loss(p, H.sum(axis=0) / (N * K), self.alpha, B)
        f = p.dtype  # the router's type: float32 under --precision mixed-* (moe.router_dtype)
        dp_aux = dp_aux * f.type(self.loss_scale())  # scaled like dL/dlogits (precision.py)
        if self.record is not None:
            self.record(H, kept)
        assigned = [np.nonzero((top == e) & keep) for e in range(E)]
        send = [np.concatenate([x[assigned[e][0]] for e in self.owned_by(q)]) for q in range(P)]
        sent = sum(len(rows) for rows, _ in assigned)  # this rank's kept assignments (moe_charges.py)
        if clock is not None:
            mc.charge_routing(clock, sent, h, x.itemsize, mc.PACK_ELEMS)
        from_q = [[int(kept[base + q, e]) for e in self.owned_by(ex.j)] for q in range(P)]
        dispatch_rows = kept[base : base + P].reshape(P, P, self.per).sum(axis=2).tolist()
        combine_rows = [list(col) for col in zip(*dispatch_rows)]
        got = [split_rows(g, c) for g, c in zip(ex.alltoall(send, dispatch_rows, "ep-dispatch"), from_q)]
        outs, ectx = [[] for _ in range(P)], {}
        for k, e in enumerate(self.owned_by(ex.j)):
            xe = np.concatenate([got[q][k] for q in range(P)])
            out, ectx[e] = self._expert_forward(e, xe)
            for q, piece in enumerate(split_rows(out, [c[k] for c in from_q])):
                outs[q].append(piece)
        to_q = [[len(assigned[e][0]) for e in self.owned_by(q)] for q in range(P)]
        back = ex.alltoall([np.concatenate(o) for o in outs], combine_rows, "ep-combine")
        # gate x output summed in the router's type, rounded to the model's once (as moe.py, expert.py)
        y, hs = np.zeros((x.shape[0], h), f), {}
        for q in range(P):
            for e, out in zip(self.owned_by(q), split_rows(back[q], to_q[q])):
                rows, slots = assigned[e]
                y[rows] += gates[rows, slots][:, None] * out.astype(f, copy=False)
                hs[e] = out
        y = y.astype(x.dtype, copy=False)
        if clock is not None:
            mc.charge_routing(clock, sent, h, x.itemsize, mc.COMBINE_ELEMS)
        ctx = (x, p, top, gates, dp_aux, assigned, hs, ectx, from_q, to_q, dispatch_rows, combine_rows)
        held = x.nbytes + p.nbytes + sum(o.nbytes for o in hs.values())
        held += sum(c.nbytes for c in ectx.values() if c is not None)
        return y, aux, ctx, held

    def backward(self, dy, ctx, Wr, dWr, weight_passes=None):
        """dL/dx of forward's x (experts and router); the experts' and the router's gradients added, or
        with `weight_passes` (a zero-bubble B pass: gpt_moe_split.py) queued there as closures."""
        P, ex = self.x.P, self.x
        x, p, top, gates, dp_aux, assigned, hs, ectx, from_q, to_q, dispatch_rows, combine_rows = ctx
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
        clock, sent = self.rt.clock, sum(len(rows) for rows, _ in assigned)
        if clock is not None:
            mc.charge_routing(clock, sent, self.h, dy.itemsize, mc.GATE_GRAD_ELEMS)
        got = ex.alltoall(send, dispatch_rows, "ep-combine-grad")
        got = [split_rows(g, c) for g, c in zip(got, from_q)]
        outs = [[] for _ in range(P)]
        for k, e in enumerate(self.owned_by(ex.j)):
            dout = np.concatenate([got[q][k] for q in range(P)])
            if weight_passes is None:
                dxe = self._expert_backward(e, ectx[e], dout)
            else:
                dxe = expert_backward_input(self, e, ectx[e], dout, weight_passes)
            for q, piece in enumerate(split_rows(dxe, [c[k] for c in from_q])):
                outs[q].append(piece)
        back = ex.alltoall([np.concatenate(o) for o in outs], combine_rows, "ep-dispatch-grad")
        dx = np.zeros_like(x)
        for q in range(P):
            for e, piece in zip(self.owned_by(q), split_rows(back[q], to_q[q])):
                dx[assigned[e][0]] += piece
        if clock is not None:
            mc.charge_routing(clock, sent, self.h, dx.itemsize, mc.SCATTER_ELEMS)
        if weight_passes is None:
            dx_router = router_backward(dgates, dp_aux, p, top, gates, x, Wr, dWr, clock)
        else:  # zero-bubble halves (gpt_moe_split.py), each charging its share of the clock
            dx_router = router_backward_input(dgates, dp_aux, p, top, gates, x, Wr, dWr, weight_passes, clock)
        return (dx.astype(f, copy=False) + dx_router).astype(x.dtype, copy=False)

    def _expert_forward(self, e, xe):
        """FFN_e on the rows it received: (output, Kept(input, W1's output z, GELU's u)) or no context."""
        if not len(xe):
            return np.zeros((0, self.h), xe.dtype), None
        W1, c1, W2, c2 = self.views(self.experts[e][0])
        k = self.rt.kernels
        z, u = k.linear_act_forward(xe, W1, c1, "gelu")
        out, _ = k.linear_act_forward(u, W2, c2, "none")
        if self.rt.clock is not None:
            mc.charge_expert(self.rt.clock, xe.shape[0], self.h, xe.itemsize, False)
        return out, Kept(x=xe, z=z, u=u)

    def _expert_backward(self, e, c, dout):
        if c is None:
            return np.zeros((0, self.h), dout.dtype)
        W1, _, W2, _ = self.views(self.experts[e][0])
        dW1, dc1, dW2, dc2 = self.views(self.experts[e][1])
        k = self.rt.kernels
        du, gW2, gc2 = k.linear_act_backward(dout, c.u, W2, dout, dout, "none", True)
        dx, gW1, gc1 = k.linear_act_backward(du, c.x, W1, c.z, c.u, "gelu", True)
        for acc, new in ((dW1, gW1), (dc1, gc1), (dW2, gW2), (dc2, gc2)):
            acc += new
        if self.rt.clock is not None:
            mc.charge_expert(self.rt.clock, dout.shape[0], self.h, dout.itemsize, True)
        return dx


class MoEBlockUnit(BlockUnit):
    """A pre-LN block whose MLP is E experts and a router. Its flat vector: the dense part, then the
    E experts (module doc). forward(flat, x) is evaluation's: every expert here, no capacity limit."""

    def __init__(self, index, hidden, heads, seq, n_blocks, experts: int, top_k: int, capacity_factor, alpha):
        super().__init__(index, hidden, heads, seq, n_blocks)
        self.E, self.K, self.C, self.alpha = experts, top_k, capacity_factor, alpha
        self.dense = dense_size(hidden, experts)
        self.size = self.dense + experts * expert_size(hidden)

    @classmethod
    def of(cls, model, index: int) -> MoEBlockUnit:
        """Block `index` of `model` (its section: shape, experts, top-k, capacity, aux loss weight)."""
        return cls(
            index,
            model.hidden,
            model.heads,
            model.seq_len,
            model.blocks,
            model.experts,
            model.top_k,
            model.capacity_factor,
            model.aux_loss_coef,
        )

    def dense_views(self, flat):
        """g1, b1, (Wq, bq, Wk, bk, Wv, bv, Wo, bo), g2, b2, Wr."""
        h = self.h
        v = _cut(flat, [(h,), (h,)] + [(h, h), (h,)] * 4 + [(h,), (h,), (h, self.E)])
        return v[0], v[1], tuple(v[2:10]), v[10], v[11], v[12]

    def expert_flats(self, flat) -> list:
        n = expert_size(self.h)
        return [flat[self.dense + e * n : self.dense + (e + 1) * n] for e in range(self.E)]

    def init(self, seed: int, dtype) -> np.ndarray:
        h, flat = self.h, np.zeros(self.size)
        rng = np.random.default_rng([seed, self.index, 1])
        g1, _, attn, g2, _, Wr = self.dense_views(flat[: self.dense])
        g1[...] = g2[...] = 1.0
        out_scale = 1 / math.sqrt(2 * self.L)
        for W, scale in ((attn[0], 1), (attn[2], 1), (attn[4], 1), (attn[6], out_scale)):
            W[...] = rng.standard_normal(W.shape) * INIT_STD * scale
        Wr[...] = np.random.default_rng([seed, self.index, 0]).standard_normal(Wr.shape) / math.sqrt(h)
        for e, ef in enumerate(self.expert_flats(flat)):
            g = np.random.default_rng([seed, self.index, e + 2])
            W1, _, W2, _ = _cut(ef, ((h, 4 * h), (4 * h,), (4 * h, h), (h,)))
            W1[...] = g.standard_normal(W1.shape) * INIT_STD
            W2[...] = g.standard_normal(W2.shape) * INIT_STD * out_scale
        return flat.astype(dtype)

    def forward_moe(self, dense, x, ffn: MoEFFN, N: int, B: int):
        """(out, aux loss share, ctx, bytes held) with the experts and routing of `ffn`."""
        g1, b1, attn, g2, b2, Wr = self.dense_views(dense)
        h1, (xh1, r1) = layernorm_forward(x, g1, b1)
        y, actx = self.attend(h1, attn, x.shape[0] // self.s)  # context parallelism swaps its own in
        x2 = x + y
        h2, (xh2, r2) = layernorm_forward(x2, g2, b2)
        if self.rt.clock is not None:  # the attention half; the experts and routing charge their own
            mc.charge_attention(self.rt.clock, x.shape[0], self.h, self.a, self._keys(), x.itemsize, 0, False)
        m, aux, fctx, held = ffn.forward(h2, Wr, N, B)
        kept = Kept(xh1=xh1, r1=r1, attn=actx, xh2=xh2, r2=r2)
        return x2 + m, aux, (kept, fctx), kept.nbytes + held

    def backward_moe(self, dense, gdense, ctx, dy, ffn: MoEFFN):
        pending = pending_weight_passes()
        if pending is not None:  # a zero-bubble pipeline's B pass: the W half waits (gpt_moe_split.py)
            return split_backward_moe(self, dense, gdense, ctx, dy, ffn, pending)
        kept, fctx = ctx
        g1, _, attn, g2, _, Wr = self.dense_views(dense)
        dg1, db1, dattn, dg2, db2, dWr = self.dense_views(gdense)
        dh2 = ffn.backward(dy, fctx, Wr, dWr)
        dx2, gg2, gb2 = layernorm_backward(dh2, (kept.xh2, kept.r2), g2)
        dx2 = dy + dx2
        dh1 = self.attend_backward(dx2, kept.attn, attn, dattn)
        dx, gg1, gb1 = layernorm_backward(dh1, (kept.xh1, kept.r1), g1)
        for acc, new in ((dg1, gg1), (db1, gb1), (dg2, gg2), (db2, gb2)):
            acc += new
        if self.rt.clock is not None:
            rows, keys = dy.shape[0], self._keys()
            mc.charge_attention(self.rt.clock, rows, self.h, self.a, keys, dy.itemsize, self.dense, True)
        return dx2 + dx

    def forward(self, flat, x):
        experts = {e: (f, None) for e, f in enumerate(self.expert_flats(flat))}
        ffn = MoEFFN(self.h, self.E, self.K, self.C, self.alpha, experts, rt=self.rt, unlimited=True)
        n = x.shape[0]
        out, _, ctx, _ = self.forward_moe(flat[: self.dense], x, ffn, n, n)
        return out, ctx


def train_pass(units, flats, ffns, tokens, labels, N: int, B: int, loss_grad, meter=None, watch=None):
    """One micro-step's forward and backward: units [embedding, MoE blocks, head]; flats [(params,
    grads)] of each unit (a block's: its dense part); ffns {block index: MoEFFN}; N, B: the micro-step's
    and the step's global tokens. loss_grad(logits) -> (loss share, dlogits). Returns the loss share,
    main and aux (gradients added into the flats' and the experts' grads)."""
    x, contexts, loss = tokens, [], 0.0
    for u, (p, _) in zip(units, flats):
        if u.index in ffns:
            x, aux, ctx, held = u.forward_moe(p, x, ffns[u.index], N, B)
            loss += aux
        else:
            x, ctx = u.forward(p, x)
            held = ctx.nbytes
        if watch is not None:
            watch.check(u.index, x)
        if meter is not None:
            meter.take(held)
        contexts.append((ctx, held))
    main, grad = loss_grad(x)
    for u, (p, g), (ctx, held) in zip(reversed(units), reversed(flats), reversed(contexts)):
        if u.index in ffns:
            grad = u.backward_moe(p, g, ctx, grad, ffns[u.index])
        else:
            grad = u.backward(p, g, ctx, grad, need_dx=u.index > 0)
        if meter is not None:
            meter.free(held)
    return loss + main
