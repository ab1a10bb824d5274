"""Context parallelism with tensor parallelism (--arch gpt --cp C --tp T [--dp D]).

The mesh (runtime/mesh.py) puts cp between dp and tp: a cp rank is a whole tp group. Inside it the
model is split as tensor_gpt.py splits it (Megatron-LM, Shoeybi et al. 2019): Wq, Wk, Wv by heads
(column-parallel), Wo and W2 by rows, W1 by columns, the embedding, the LM head and the cross-entropy
over the vocabulary (vocab_parallel.py). Across the tp groups of a cp group the sequence is split as
context.py splits it: cp rank r holds chunks r and 2C-1-r of the 2C chunks of every sequence, n = s/C
tokens, with their global positions (Megatron's CP with TP, Korthikanti et al. 2022 for the split).

So a rank (cp index r, tp index j) runs its a/T heads over its n tokens of each of its b sequences:
  attention  q, k, v of a/T heads; the ring passes K and V blocks of those a/T heads only
             (2 b n h/T elements a hop), Ulysses turns (a/T heads, n tokens) into (a/(T C) heads,
             s tokens) -- so (a/T) % C must be 0 (config/rules.py refuses otherwise);
  f, g       tensor_gpt.py's all-reduces, on the rank's R = b n rows (not b s);
  the loss   vocab_parallel_cross_entropy over the tp group on the rank's R rows, divided by the
             global batch's token count B s: the shares of all dp x cp ranks add up to the serial
             mean (context.py), and tp index 0 reports each.
--sp (Korthikanti et al. 2022, sec. 4.2.2): the tp group cuts the rank's R rows into T contiguous shards
  (n % T == 0, config/rules.py); f and g become tensor_gpt.py's gathers and scatters, and the embedding
  adds to each row of its shard the global position of that row's token (a shard may start mid-sequence).
Gradients: one all-reduce (SUM) of each rank's shards over the dp x cp ranks of the same tp index
(the mesh's `dpcp` group), as context.py does without tp.

Closed forms per rank per micro-step of b sequences (R = b n rows, ring collectives):
  cp-kv (ring)       forward 2 (C-1) b n h/T, backward 4 (C-1) b n h/T elements per block
  cp-alltoall        8 (C-1)/C b n h/T elements per block (4 all-to-alls forward, 4 backward)
  tp-g/f-allreduce   2L each of R h elements (2 (T-1)/T R h sent); the vocab ops as vocab_parallel.py's
  grad-allreduce     ring all-reduce of this rank's P_T parameters over dp C ranks (costmodel/cp_tp.py)

Checkpoints: every tp rank of every cp rank holds the same shard of the full model, so
tensor_gpt.py's gather (by tp index 0 of dp index 0 and cp index 0) and cut are right as they are:
a cp x tp run's checkpoint resumes serially and the other way round.
"""

from __future__ import annotations

import numpy as np

from ..model.gpt import Kept
from ..model.ring_attention import chunk_positions
from .base import Strategy
from .context_attention import cp_attention_backward, cp_attention_forward, cp_core_backward, rebuild_softmax
from .data import GradientBuckets
from .tensor_gpt import GptTensorParallel, GptTensorStack, ShardedBlock
from .vocab_parallel import ShardedEmbedding, VocabParallelReplicas


class PositionedShardedEmbedding(ShardedEmbedding):
    """The vocabulary-parallel lookup of this rank's n tokens, plus Pos at their GLOBAL positions."""

    def __init__(self, unit, t: int, k: int, positions: np.ndarray):
        super().__init__(unit, t, k)
        self.positions = positions

    def forward(self, flat, tokens):
        E, pos = self.views(flat)
        ids, mine = self._mine(tokens)
        partial = E[ids]
        partial[~mine] = 0  # rows of tokens another tp rank owns: the all-reduce brings them
        x = self.stack.g(partial, op="vocab-embed-allreduce", sp_op="vocab-embed-scatter")
        n = tokens.shape[1]
        first = self.k * x.shape[0] if self.stack.sp else 0  # --sp: this tp rank's first of the b n rows
        x += pos[self.positions[(first + np.arange(x.shape[0])) % n]]
        clock = self.rt.clock
        if clock is not None:  # ShardedEmbedding's charge: gather E's rows, read Pos and write x
            clock.stream((partial.size + 2 * x.size) * x.itemsize)
            clock.layer_call()
        return x, Kept(tokens=tokens)

    def backward(self, flat, gflat, ctx, dy):
        dE, dpos = self.views(gflat)
        dy = self.stack.g_back(dy, op="vocab-embed-gather")  # --sp: every row, as ShardedEmbedding
        ids, mine = self._mine(ctx.tokens)
        np.add.at(dE, ids[mine], dy[mine])
        b, n = ctx.tokens.shape
        dpos[self.positions] += dy.reshape(b, n, self.h).sum(axis=0)  # positions are distinct
        if self.rt.clock is not None:  # gpt.py's 4 passes over the rows
            self.rt.clock.stream(4 * dy.size * dy.itemsize)
        return None


class ContextTensorStack(GptTensorStack):
    """GptTensorStack on this cp rank's n tokens: its blocks' attention reaches the other cp ranks'
    tokens through context_attention.py with this rank's a/T heads."""

    block_types = (ShardedBlock,)  # context_expert_tensor.py: MoE blocks

    def __init__(self, model, layout, mesh, indices=None):
        super().__init__(model, layout, mesh, indices)  # indices: one pipeline chunk's units (cp x tp x pp)
        self.take_sequence_share(model, layout, mesh)

    def take_sequence_share(self, model, layout, mesh) -> None:
        """Make the tp stack's units run on this cp rank's n = s/C tokens: the embedding at their
        global positions, every block's attention over the cp group (attend below)."""
        self.cp_comm, self.algo, self.full_seq = mesh.groups["cp"], layout.cp_algo, model.seq_len
        C = self.cp_comm.size
        self.positions = chunk_positions(self.cp_comm.rank, C, model.seq_len)
        t, k = self.comm.size, self.comm.rank
        if isinstance(self.units[0], ShardedEmbedding):  # a later pipeline chunk starts with a block
            embedding = PositionedShardedEmbedding(self.units[0].unit, t, k, self.positions)
            embedding.stack = self
            self.units[0] = embedding  # the same pieces as the one it replaces: the store is unchanged
        for blk in self.units:
            if isinstance(blk, self.block_types):
                blk.s = model.seq_len // C  # a block's rows per sequence: my n tokens
                blk.score_keys = 0  # context_attention.py charges the scores, hop by hop (--clock sim)

    def attend(self, blk: ShardedBlock, h1, params, batch: int):
        return cp_attention_forward(
            self.cp_comm, self.algo, h1, params, batch, blk.s, blk.heads, self.full_seq, self.rt.kernels
        )

    def attend_backward(self, blk: ShardedBlock, dy, actx, params, grads):
        return cp_attention_backward(
            self.cp_comm, self.algo, dy, actx, params, grads, blk.heads, self.full_seq, self.rt.kernels
        )

    def attend_core_backward(self, blk: ShardedBlock, do, actx):
        """The zero-bubble B pass's attention core of this rank's a/T heads (tensor_gpt_split.py): over
        the cp group -- the ring's hops and dK/dV partial sums, or Ulysses' all-to-alls -- all in B."""
        return cp_core_backward(self.cp_comm, self.algo, do, actx, blk.heads, self.full_seq)

    def rebuild_softmax(self, actx) -> None:
        """--recompute selective (pipeline/gpt_recompute.py): the softmax part of this rank's heads
        again -- the ring's forward with its K/V hops of a/T heads, or Ulysses' P locally."""
        rebuild_softmax(self.cp_comm, self.algo, actx)


class ContextVocabReplicas(VocabParallelReplicas):
    """The vocabulary-parallel step on this cp rank's tokens; gradients summed over dp x cp."""

    def __init__(self, sections, mesh, stack):
        super().__init__(sections, mesh, stack=stack)
        layout = self.layout
        self.buckets = GradientBuckets(
            self.store, mesh.groups["dpcp"], layout.bucket_mb * 2**20, layout.collectives, layout.overlap
        )

    def _forward_backward(self, x, y, global_batch, communicate) -> float:
        mine = self.stack.positions  # the loss still divides by B s: vocab_parallel.py's tokens
        return super()._forward_backward(x[:, mine], y[:, mine], global_batch, communicate)


class ContextTensorParallel(GptTensorParallel):
    """--cp C --tp T [--dp D] on --arch gpt (module docstring)."""

    def __init__(self, sections, mesh):
        Strategy.__init__(self, sections, mesh)
        self.stack = ContextTensorStack(sections.model, sections.layout, mesh)
        self.replicas = ContextVocabReplicas(sections, mesh, stack=self.stack)
        self.meter, self.watch = self.replicas.meter, self.replicas.watch
        self.optimizer = self.replicas.optimizer

    def full_weights(self):
        return super().full_weights() if self.mesh.coords["cp"] == 0 else None  # cp replicas agree

    def gather_full(self, local):
        return super().gather_full(local) if self.mesh.coords["cp"] == 0 else None
