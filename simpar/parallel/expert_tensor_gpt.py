"""MoE transformer blocks under tensor parallelism (--arch gpt --experts E [--ep P] --tp T [--dp D]).

The choice: attention split over tp as Megatron-LM splits it (tensor_gpt.py: heads by columns of Wq,
Wk, Wv, rows of Wo, f and g around them), the embedding, head and cross-entropy over the vocabulary
(vocab_parallel.py), and the MoE part -- LayerNorm 2, the router and this ep rank's E/P experts --
REPLICATED on every tp rank, each running it whole on the whole residual stream. That is the simpler
of the two correct choices (the other, Megatron-Core's expert tensor parallelism, splits each expert's
W1 by columns and W2 by rows and adds an f and a g around every expert): after attention's g every tp
rank holds the same x2, so the same tokens take the same routes on every tp rank, and the MoE's
dL/dh2 is complete on each -- no f is needed before it and its parameters' gradients agree across tp
without a message. The price is memory and work: a tp rank holds all E/P experts of its ep rank.

The mesh (runtime/mesh.py) puts tp innermost: world rank d T + k. The ep group (varies ep only) and the
dp group hold ranks of one tp index, so tp rank k of each dp rank routes over its own ep group: every
tp rank sends the same all-to-alls (costmodel/gpt_moe.py's bytes, T copies), and exchanges the
histograms over its dp group. Per micro-step of R = b s token rows, tp bytes per rank (ring, t = T):
tp-g-allreduce L all-reduces of R h (attention's g; the MLP's is gone), tp-f-allreduce L (backward),
and vocab_parallel.py's four ops. Once per step: this rank's dense shards all-reduced over dp
(`model/grad-allreduce`, one call: no buckets, as expert_gpt.py), its experts over the D/P
expert-data-parallel ranks (`model/expert-grad-allreduce`). Closed form: costmodel/gpt_moe_tp.py.

--sp (Korthikanti et al. 2022, sec. 4.2.2, as tensor_gpt.py): between the units each tp rank holds
its contiguous 1/T of the rows; attention's f and g become f-bar and g-bar (all-gather "sp-gather",
reduce-scatter "sp-scatter"). The MoE part stays replicated on every row: LN2 runs on the rank's rows,
its output is all-gathered ("sp-gather"), every tp rank routes every row as without --sp (the same
tokens dropped) and keeps its rows of the output -- complete, so no reduce-scatter; backward,
dL/dm is all-gathered ("sp-gather") and each rank keeps its rows of the complete dL/dh2. The router's
and experts' gradients come from every row (complete), the LayerNorms' from the rank's rows: summed
over tp once a step ("model/sp-grad-allreduce", each block's 4h and the head's 2h).

Full shape (checkpoints, --weights-out): expert_gpt.py's -- per unit its flat vector, a block's being
its dense part then all E experts -- assembled on world rank 0 from the tp shards of dp rank 0 (tp
gather) and the experts of its ep group's tp-0 ranks (`control`). With --pp a stage's chunks are
ExpertTensorStacks over their units (pipeline/expert_stage.py): pp x dp x ep x tp, every schedule
(zb-h1, zb-v: expert_tensor_split.py), --recompute and --sp; with --cp the stack runs on a cp rank's
tokens (context_expert_tensor.py, through the ffn_class, make_stack and my_tokens hooks).
--precision mixed-*: half shards and messages, the router in float32, the aux loss's gradient scaled
with the main loss's, the world voting on an overflowed step. Refused in one line (config/moe.py):
--sp with --cp, and mixed precision with --sp.
"""

from __future__ import annotations

import numpy as np

from .. import collectives
from ..model import moe_charges as mc
from ..model.gpt import EmbeddingUnit, Kept
from ..model.gpt_build import gpt_units
from ..model.gpt_moe import MoEBlockUnit, MoEFFN, expert_size
from ..model.mlp import ParamStore, pending_weight_passes
from ..model.moe import micro_rows
from ..model.precision import build_optimizer, vote_comm
from ..model.resmlp import layernorm_backward, layernorm_forward
from .base import Strategy
from .expert_gpt import EpExchange, GptExpertParallel, UnitContext
from .expert_tensor_split import split_moe_backward
from .sharded import Sharded
from .tensor_gpt import GptTensorStack
from .tensor_gpt_split import split_unit_backward
from .vocab_parallel import ShardedEmbedding, ShardedHead, vocab_loss_grad


class ShardedMoEBlock(Sharded):
    """An MoE block's dense part over tp: LayerNorms, bo and the router Wr whole; Wq, Wk, Wv (and
    their biases) by columns, i.e. by heads; Wo by rows. Its experts live outside (the stack)."""

    def __init__(self, unit: MoEBlockUnit, t: int, k: int):
        h = unit.h
        pieces = [((h,), None)] * 2 + [((h, h), 1), ((h,), 0)] * 3 + [((h, h), 0), ((h,), None)]
        pieces += [((h,), None)] * 2 + [((h, unit.E), None)]
        super().__init__(unit, pieces, t, k)
        self.h, self.s, self.heads = h, unit.s, unit.a // t

    def sp_grads(self, gflat) -> list:
        """--sp: the LayerNorms' gammas and betas saw this rank's rows only; bo's gradient is a row sum
        after the all-gather, the router's and the experts' come from every row: complete already."""
        v = self.views(gflat)
        return [v[0], v[1], v[10], v[11]]


class ExpertTensorStack(GptTensorStack):
    """gpt's units over the tp group (f, g and attention from GptTensorStack, --sp too), MoE blocks
    with their experts replicated over tp. One store: every unit's tp shard, then this ep rank's
    experts of every block."""

    ffn_class = MoEFFN  # context_expert_tensor.py's plans capacity per sequence segment (cp)

    def __init__(self, model, layout, mesh, mine: range, exchange, indices=None):
        self.comm, self.algorithm, self.sp = mesh.tp_comm, layout.collectives, layout.sp
        t, k, dtype = self.comm.size, self.comm.rank, model.compute_dtype()
        self.rt = mesh.world.runtime
        full = [u for u in gpt_units(model, self.rt) if indices is None or u.index in indices]
        wrap = {EmbeddingUnit: ShardedEmbedding, MoEBlockUnit: ShardedMoEBlock}
        self.units = [wrap.get(type(u), ShardedHead)(u, t, k) for u in full]
        dense, experts = [], []
        for u in self.units:  # every rank builds the full shape from (seed, unit) and keeps its part
            u.stack = self
            flat = u.unit.init(model.seed, dtype)
            moe = isinstance(u, ShardedMoEBlock)
            dense.append(u.cut(flat[: u.unit.dense] if moe else flat))
            experts += [u.unit.expert_flats(flat)[e] for e in mine] if moe else []
        self.n_dense = sum(d.size for d in dense)
        flat = np.concatenate(dense + experts).astype(dtype)
        self.store = ParamStore(flat, np.zeros_like(flat))
        p, g = self.store.params, self.store.grads
        self.flats, self.ffns, offset = [], {}, 0
        for d in dense:
            self.flats.append((p[offset : offset + d.size], g[offset : offset + d.size]))
            offset += d.size
        for u in self.units:
            if isinstance(u, ShardedMoEBlock):
                m, n = u.unit, expert_size(u.h)
                views = {
                    e: (p[offset + i * n : offset + (i + 1) * n], g[offset + i * n : offset + (i + 1) * n])
                    for i, e in enumerate(mine)
                }
                offset += len(mine) * n
                self.ffns[u.index] = self.ffn_class(m.h, m.E, m.K, m.C, m.alpha, views, exchange, self.rt)
        self.N = self.B = 0  # the micro-step's and the step's global tokens, set before each forward
        self.aux = 0.0

    def moe_forward(self, blk: ShardedMoEBlock, flat, x):
        g1, b1, Wq, bq, Wk, bk, Wv, bv, Wo, bo, g2, b2, Wr = blk.views(flat)
        h1, (xh1, r1) = layernorm_forward(x, g1, b1)  # this rank's rows (all of them without --sp)
        h1 = self.f(h1)
        y, actx = self.attend(blk, h1, (Wq, bq, Wk, bk, Wv, bv, Wo, None), h1.shape[0] // blk.s)
        x2 = x + (self.g(y) + bo)  # every tp rank: the same x2 (--sp: its rows of it)
        h2, (xh2, r2) = layernorm_forward(x2, g2, b2)
        if self.rt.clock is not None:  # this rank's share of the attention half (model/moe_charges.py)
            args = (blk.h, blk.unit.a, self._keys(blk), x.itemsize, 0, False, blk.t, x.shape[0])
            mc.charge_attention(self.rt.clock, h1.shape[0], *args)  # --sp: h1 every row, x the shard
        h2 = self.f(h2)  # --sp: every row again (sp-gather), so every tp rank routes the same tokens
        m, aux, fctx, held = self.ffns[blk.index].forward(h2, Wr, self.N, self.B)
        self.aux += aux
        kept = Kept(xh1=xh1, r1=r1, attn=actx, xh2=xh2, r2=r2)
        return x2 + self.mine(m), (kept, fctx), kept.nbytes + held

    @staticmethod
    def _keys(blk) -> int:
        """The keys a query's scores span in the attention half's charge: the sequence, or 0 under
        --cp (context_tensor.py sets score_keys: the hops charge the scores)."""
        return getattr(blk, "score_keys", blk.s)

    def mine(self, rows):
        """--sp: this tp rank's contiguous shard of `rows` (every rank holds them all: no message)."""
        if not self.sp:
            return rows
        n = rows.shape[0] // self.comm.size
        return rows[self.comm.rank * n : (self.comm.rank + 1) * n]

    def moe_backward(self, blk: ShardedMoEBlock, flat, gflat, ctx, dy):
        pending = pending_weight_passes()
        if pending is not None:  # a zero-bubble pipeline's B pass: the W half waits (expert_tensor_split.py)
            return split_moe_backward(self, blk, flat, gflat, ctx, dy, pending)
        kept, fctx = ctx
        g1, _, Wq, bq, Wk, bk, Wv, bv, Wo, bo, g2, _, Wr = blk.views(flat)
        dg1, db1, *dattn, dg2, db2, dWr = blk.views(gflat)
        dm = self.g_back(dy)  # --sp: every row's dL/dm (sp-gather)
        dh2 = self.ffns[blk.index].backward(dm, fctx, Wr, dWr)  # complete on every tp rank: no f
        dx2, gg2, gb2 = layernorm_backward(self.mine(dh2), (kept.xh2, kept.r2), g2)
        dx2 = dy + dx2
        attn = (Wq, bq, Wk, bk, Wv, bv, Wo, bo)
        dh1 = self.attend_backward(blk, self.g_back(dx2), kept.attn, attn, dattn)  # dbo: full row sum
        dx, gg1, gb1 = layernorm_backward(self.f_back(dh1), (kept.xh1, kept.r1), g1)
        for acc, new in ((dg1, gg1), (db1, gb1), (dg2, gg2), (db2, gb2)):
            acc += new
        if self.rt.clock is not None:
            clock, rows, keys = self.rt.clock, dm.shape[0], self._keys(blk)  # --sp: dy is the row shard
            args = (blk.h, blk.unit.a, keys, dy.itemsize, blk.size, True, blk.t, dy.shape[0])
            mc.charge_attention(clock, rows, *args)
        return dx2 + dx

    def forward(self, x, meter, watch):
        contexts = []
        for u, (p, _) in zip(self.units, self.flats):
            if isinstance(u, ShardedMoEBlock):
                x, ctx, held = self.moe_forward(u, p, x)
            else:
                x, ctx = u.forward(p, x)
                held = ctx.nbytes
            watch.check(u.index, x)
            meter.take(held)
            contexts.append(UnitContext(ctx, held))  # what --recompute reads (pipeline/recompute.py)
        return x, contexts

    def backward(self, contexts, grad, meter, on_layer_done=None):
        pending = pending_weight_passes()  # a zero-bubble pipeline's B pass: W halves queued there
        for u, (p, g), c in zip(reversed(self.units), reversed(self.flats), reversed(contexts)):
            held = c.nbytes
            if isinstance(u, ShardedMoEBlock):
                grad = self.moe_backward(u, p, g, c.ctx, grad)
            elif pending is not None:  # the embedding and the head as tensor_gpt_split.py splits them
                grad = split_unit_backward(self, u, p, g, c.ctx, grad, pending)
            else:
                grad = u.backward(p, g, c.ctx, grad)
            meter.free(held)
        return grad

    # -- full shape (pipeline/expert_stage.py's interface): per unit (whole flat, every expert) ---------
    def full_units(self, flat, pieces: list):
        """On tp rank 0: [(unit index, whole flat, empty)] from this rank's `flat` (laid out like
        store.params) and `pieces` (every ep rank's expert part, ep rank 0's first); None elsewhere.
        Every tp rank calls it: its dense shards are gathered over tp."""
        shards = self.comm.gather_object(flat[: self.n_dense].copy(), root=0)
        if self.comm.rank != 0:
            return None
        out, at, offset = [], 0, 0
        for u in self.units:  # u.size: its tp share's elements (expert_zero_tp.py drops the flats)
            part = [u.join([shard[offset : offset + u.size] for shard in shards])]
            offset += u.size
            if isinstance(u, ShardedMoEBlock):  # this block's E/P experts in each piece, global order
                n = (u.unit.E // len(pieces)) * expert_size(u.h)
                part += [piece[at : at + n] for piece in pieces]
                at += n
            out.append((u.index, np.concatenate(part), np.zeros(0, flat.dtype)))
        return out

    def flat_from(self, full: list, mine: range, dtype) -> np.ndarray:
        dense, experts = [], []
        for u in self.units:
            flat = full[u.index][0]
            moe = isinstance(u, ShardedMoEBlock)
            dense.append(u.cut(flat[: u.unit.dense] if moe else flat))
            experts += [u.unit.expert_flats(flat)[e] for e in mine] if moe else []
        return np.concatenate([a.reshape(-1) for a in dense + experts]).astype(dtype)


class ExpertTensorParallel(Strategy):
    """--arch gpt --experts E [--ep P] --tp T [--dp D]: the module docstring's layout."""

    routing_summary = GptExpertParallel.routing_summary  # the same summary of self.routing

    def __init__(self, sections, mesh):
        super().__init__(sections, mesh)
        self.dp, self.ep, self.edp, self.tp = (
            mesh.dp_comm,
            mesh.groups["ep"],
            mesh.groups["edp"],
            mesh.tp_comm,
        )
        self.replicas = self.dp  # who holds the same dense shards (context_expert_tensor.py adds cp)
        per = self.model.experts // self.ep.size
        self.mine = range(self.ep.rank * per, (self.ep.rank + 1) * per)
        self.stack = self.make_stack(mesh)
        for i, ffn in self.stack.ffns.items():
            ffn.record = lambda H, kept, i=i: self.routing[-1].__setitem__(i, (H, kept))
            ffn.loss_scale = lambda: getattr(self.optimizer, "scale", 1.0)  # --precision mixed-*
        # Mixed precision: tp shards hold different gradients, so the world votes on a skip (precision.py)
        self.optimizer = build_optimizer(self.model, self.optimisation, vote_comm(mesh, self.dp), self.rt)
        self.routing = []  # per micro-step: {block index: (H, kept)}

    def make_stack(self, mesh) -> ExpertTensorStack:
        return ExpertTensorStack(self.model, self.layout, mesh, self.mine, EpExchange(self))

    def my_tokens(self, x, y, rows: int):
        """This rank's tokens of its dp rows in a micro-step of `rows` global rows: all of them."""
        return x, y

    def train_step(self, micro_steps, global_batch: int) -> float:
        st, s = self.stack, self.model.seq_len
        st.store.grads.fill(0)
        self.watch.reset()
        st.aux, loss = 0.0, 0.0
        for k, (x, y) in enumerate(micro_steps):
            self.routing.append({})
            rows = micro_rows(global_batch, len(micro_steps), k)
            st.N, st.B = rows * s, global_batch * s
            x, y = self.my_tokens(x, y, rows)
            logits, contexts = st.forward(x, self.meter, self.watch)
            share, grad = vocab_loss_grad(st, self.optimizer, logits, y, global_batch, s)
            st.backward(contexts, grad, self.meter)
            loss += share
        for u, (_, g) in zip(st.units, st.flats) if st.sp else ():  # the row shards' sums over tp
            st._sync_sequence_grads(u, g)
        for comm, buf, op in (
            (self.replicas, st.store.grads[: st.n_dense], "grad-allreduce"),
            (self.edp, st.store.grads[st.n_dense :], "expert-grad-allreduce"),
        ):
            if comm.size > 1:
                collectives.allreduce(comm, buf, "model", op, self.layout.collectives)
        self.optimizer.step([st.store.params], [st.store.grads])
        return loss + st.aux if self.mesh.tp_index == 0 else 0.0  # every tp rank holds the same

    def memory(self) -> dict:
        store = self.stack.store
        return self.memory_of(store.params.nbytes, store.grads.nbytes, self.optimizer.state_nbytes())

    # -- full shape: per unit (its flat vector with every expert, empty b) ----------------------------
    def optimizer_params(self) -> list:
        return [self.stack.store.params]

    def full_weights(self):
        return self._gather(self.stack.store.params, "gather-weights")

    def gather_full(self, local):
        return self._gather(local[0], "checkpoint-gather")

    def _gather(self, flat, op: str):
        """dp rank 0's tp group gathers its dense shards on tp rank 0 (world rank 0); the tp-0 ranks
        of the first ep group send it their experts (one `control` message each; the other tp
        indices' ep groups do the same, their result unused)."""
        st = self.stack
        if self.mesh.dp_index >= self.ep.size:  # every tp index's ep group alike (full_units gathers tp)
            return None
        mine = np.ascontiguousarray(flat[st.n_dense :])
        if self.ep.rank != 0:
            self.ep.send(mine, 0, "control", op)
            return None
        got = [self.ep.recv(np.empty_like(mine), q, "control", op) for q in range(1, self.ep.size)]
        units = st.full_units(flat, [mine] + got)  # a tp gather: None off tp rank 0
        return None if units is None else [(W, b) for _, W, b in units]

    def slice_full(self, full, dtype=None):
        return [self.stack.flat_from(full, self.mine, dtype or self.stack.store.params.dtype)]
