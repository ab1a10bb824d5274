"""Context parallelism (--cp C, --arch gpt): every sequence split over the C ranks of a cp group.

Rank r of the group holds, of each of its sequences, chunks r and 2C-1-r of 2C equal chunks
(model/ring_attention.chunk_positions): an early chunk and a late one, so that under the causal mask
every rank has the same attention work (Megatron's CP, Llama 3's long-context stage). Everything but
attention is per token, so the embedding, the LayerNorms, the MLP, the head and the loss run on the
rank's own n = s/C tokens, with their GLOBAL positions (the embedding looks up Pos[positions]). The
attention of those tokens needs every earlier token's keys and values: context_attention.py brings
them, around a ring (--cp-algo ring) or by all-to-all into head shards (--cp-algo ulysses).

The loss: each rank's cross-entropy over its tokens divided by the global batch's token count B s
(the loss is given B x C "rows" of n tokens: B C n = B s), so the shares of all dp x cp ranks add up
to the serial mean, and so do their gradients. Gradients: every cp rank holds the whole model and
saw other tokens of the same sequences, exactly as a dp rank saw other sequences; so ONE all-reduce
(SUM) over the combined dp x cp group (the mesh's `dpcp` group, as Megatron's data-parallel group
with CP) gives every rank the serial gradient -- data.py's buckets and overlap, just over dp*C ranks:
2(dp C - 1)/(dp C) x P x bpe model bytes per rank per step.

Checkpoints: every rank holds the full parameters (as under dp), so data.py's full-shape gather and
slice are right as they are: a cp run's checkpoint resumes serially and the other way round.
"""

from __future__ import annotations

import numpy as np

from ..model.gpt import EMBED_BWD_ELEMS, EMBED_FWD_ELEMS, BlockUnit, EmbeddingUnit, HeadUnit, Kept
from ..model.mlp import pending_weight_passes
from ..model.precision import loss_grad
from ..model.ring_attention import chunk_positions
from .context_attention import cp_attention_backward, cp_attention_forward, cp_core_backward, rebuild_softmax
from .data import DataParallel, GradientBuckets
from .resmlp_stack import UnitStack, unit_store


class PositionedEmbedding(EmbeddingUnit):
    """The embedding of this rank's tokens: x = E[tokens] + Pos[positions] (global positions)."""

    def __init__(self, vocab: int, seq: int, hidden: int, positions: np.ndarray):
        super().__init__(vocab, seq, hidden)
        self.positions = positions

    def forward(self, flat, tokens):
        E, pos = self.views(flat)
        b, n = tokens.shape
        x = (E[tokens] + pos[self.positions]).reshape(b * n, self.h)
        if self.rt.clock is not None:  # what EmbeddingUnit charges, for my n tokens
            self.rt.clock.stream(EMBED_FWD_ELEMS * x.size * x.itemsize)
            self.rt.clock.layer_call()
        return x, Kept(tokens=tokens)

    def backward(self, flat, gflat, ctx, dy, need_dx: bool = False):
        pending = pending_weight_passes()
        if pending is not None:  # a zero-bubble B pass (--pp, zb-h1/zb-v): all of it is W (gpt_split.py),
            pending.append(lambda: self.backward(flat, gflat, ctx, dy))  # run fused, outside B
            return None
        dE, dpos = self.views(gflat)
        b, n = ctx.tokens.shape
        np.add.at(dE, ctx.tokens.reshape(-1), dy)
        dpos[self.positions] += dy.reshape(b, n, self.h).sum(axis=0)  # positions are distinct
        if self.rt.clock is not None:
            self.rt.clock.stream(EMBED_BWD_ELEMS * dy.size * dy.itemsize)
        return None


class ContextBlock(BlockUnit):
    """A block on n = s/C tokens of each sequence; its attention reaches the rest over the cp group."""

    charged_keys = 0  # its score work is charged by context_attention.py, hop by hop (--clock sim)

    def __init__(self, index, hidden, heads, seq, n_blocks, comm, algo):
        super().__init__(index, hidden, heads, seq // comm.size, n_blocks)  # self.s: MY tokens, n
        self.comm, self.algo, self.full_seq = comm, algo, seq

    def attend(self, x, attn, batch):
        return cp_attention_forward(
            self.comm, self.algo, x, attn, batch, self.s, self.a, self.full_seq, self.rt.kernels
        )

    def attend_backward(self, dy, actx, attn, dattn):
        return cp_attention_backward(
            self.comm, self.algo, dy, actx, attn, dattn, self.a, self.full_seq, self.rt.kernels
        )

    def attend_core_backward(self, do, actx):
        """The zero-bubble B pass's attention core (model/gpt_split.py): over the cp group, all in B."""
        return cp_core_backward(self.comm, self.algo, do, actx, self.a, self.full_seq)

    def rebuild_softmax(self, actx) -> None:
        """--recompute selective: the softmax part dropped in forward, again (context_attention.py)."""
        rebuild_softmax(self.comm, self.algo, actx)


def context_units(model, layout, comm, rt) -> list:
    """[embedding, L blocks, head] on this cp rank's tokens: the serial model's units and shapes
    (`model`, `layout`: the config's sections; the layout's cp_algo picks the attention)."""
    L, C, s = model.blocks, comm.size, model.seq_len
    positions = chunk_positions(comm.rank, C, s)
    units = (
        [PositionedEmbedding(model.vocab, s, model.hidden, positions)]
        + [ContextBlock(i, model.hidden, model.heads, s, L, comm, layout.cp_algo) for i in range(1, L + 1)]
        + [HeadUnit(L + 1, model.hidden, model.vocab, s // C)]  # logits shaped (b, n, V)
    )
    for unit in units:
        unit.rt = rt
    return units


class ContextStack(UnitStack):
    """UnitStack over context_units: the same flat store, buckets and checkpoints as serial's."""

    def __init__(self, model, layout, comm, rt):
        self.rt = rt
        self.units = context_units(model, layout, comm, rt)
        dtype = model.compute_dtype()
        self.store, self.flats = unit_store(self.units, dtype, lambda u: u.init(model.seed, dtype))


class ContextParallel(DataParallel):
    """dp x cp: the whole model on every rank, each rank's tokens chunks (r, 2C-1-r) of its dp rows;
    gradients summed over the dp x cp group (module docstring)."""

    def __init__(self, sections, mesh):
        self.cp_comm = mesh.groups["cp"]
        stack = ContextStack(sections.model, sections.layout, self.cp_comm, mesh.world.runtime)
        super().__init__(sections, mesh, stack=stack)
        self.positions = chunk_positions(self.cp_comm.rank, self.cp_comm.size, self.model.seq_len)
        layout = self.layout
        self.buckets = GradientBuckets(
            self.store, mesh.groups["dpcp"], layout.bucket_mb * 2**20, layout.collectives, layout.overlap
        )

    def _forward_backward(self, x, y, global_batch, communicate) -> float:
        x, y = x[:, self.positions], y[:, self.positions]  # my tokens of my dp rows
        logits, contexts = self.stack.forward(x, self.meter, self.watch)
        # B x C rows of n = s/C tokens: the loss divides by B s, the global batch's tokens
        loss, grad = loss_grad(self.optimizer, logits, y, global_batch * self.cp_comm.size)
        self.stack.backward(contexts, grad, self.meter, self.buckets.grads_ready if communicate else None)
        return loss
