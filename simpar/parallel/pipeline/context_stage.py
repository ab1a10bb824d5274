"""Context parallelism inside pipeline stages (--arch gpt --cp C --pp S [--dp D]).

The mesh (runtime/mesh.py) puts pp outermost and cp inside it: a stage is dp x C ranks, and cp rank r
of a stage holds, of each of its sequences, chunks r and 2C-1-r of 2C (context.py), n = s/C tokens
with their global positions. A stage's chunk of units is context.py's units cut at the pipeline's
boundaries (partition.py), so its blocks' attention reaches the other cp ranks of the SAME stage
(the mesh's cp group varies cp only) around the ring or by all-to-all (context_attention.py).

The rule for the pipeline's messages: every unit but attention is per token, and attention talks only
inside the stage's cp group, so what crosses a stage boundary is the cp rank's own residual stream,
b n h elements per micro-batch of b sequences, to (and its gradient from) the rank with the same dp
and cp coordinates on the next stage (mesh.pp_comm: it varies pp only). Per boundary and micro-batch:
"pp-send-act" b n h forward, "pp-send-grad" b n h backward -- 1/C of the pipeline's without cp.

The loss (on the last stage): each cp rank's cross-entropy over its tokens divided by B C rows of n
tokens (B s tokens in all, context.py), so the shares of all dp x cp ranks sum to the serial mean.
Gradients: each chunk's one all-reduce (SUM) over the stage's dp x cp ranks (the mesh's dpcp group:
it varies edp, ep and cp, never pp), 2(dp C - 1)/(dp C) x P_chunk elements per rank per step.

Checkpoints: every cp rank of a stage holds its chunk's full parameters, so the pipeline's full-shape
gather (dp index 0 of each stage; cp index 0 alone, the others agree) is right as it is.

--recompute (recompute.py): full keeps a chunk's input and re-runs the chunk's forward before its
backward, so each block's attention runs again -- the ring's C-1 K/V hops (2 (C-1) b n h elements) or
Ulysses' 4 forward all-to-alls (4 (C-1) b n h / C) are sent again, real messages booked as `cp-kv` /
`cp-alltoall`. selective drops each block's softmax part (the ring's log-sum-exp, Ulysses' P) and
rebuilds it before the block's backward (gpt_recompute.py -> context_attention.rebuild_softmax): the
ring by running its forward again, hops included (2 (C-1) b n h); Ulysses from its kept q and k, no
message. costmodel/cp_pipeline.py's cp_recompute_kv predicts those bytes.

Built for every schedule (a stage's several chunks are each such a cut). The zero-bubble ones (zb-h1,
zb-v) split each unit's backward into B and W (model/gpt_split.py): a cp block's attention core
backward -- dQ, the ring's K/V hops and its dK/dV partial sums sent back around, or Ulysses' four
all-to-alls -- is on dL/dx's path, so it runs in B (ContextBlock.attend_core_backward); W is the
linear layers' and LayerNorms' weight gradients alone, no message, and the embedding's whole backward
(context.PositionedEmbedding defers it as gpt.py's EmbeddingUnit does; its bucket's hook fires there).
With --tp the stage is context_tensor_stage.py's (every schedule and --recompute there too, on the tp
rank's a/T heads). Under --clock sim costmodel/cp_pipeline_time.py prices the step.
"""

from __future__ import annotations

from ...model.ring_attention import chunk_positions
from ..context import context_units
from ..data import GradientBuckets
from ..resmlp_stack import UnitStack, unit_store
from .engine import PipelineParallel


class ContextChunkStack(UnitStack):
    """Units lo..hi-1 of context.py's model on this cp rank's n tokens: UnitStack's interface, the
    chunk's parameters initialised from (seed, unit) on the full shape as every layout's."""

    def __init__(self, model, layout, cp_comm, rt, lo: int, hi: int):
        self.rt = rt
        self.units = context_units(model, layout, cp_comm, rt)[lo:hi]
        dtype = model.compute_dtype()
        self.store, self.flats = unit_store(self.units, dtype, lambda u: u.init(model.seed, dtype))


class ContextPipelineParallel(PipelineParallel):
    """A pipeline stage whose chunks run on this cp rank's tokens (module docstring)."""

    def __init__(self, sections, mesh):
        self.cp_comm = mesh.groups["cp"]
        super().__init__(sections, mesh)
        C = self.cp_comm.size
        self.positions = chunk_positions(self.cp_comm.rank, C, self.model.seq_len)
        dpcp = mesh.groups["dpcp"]  # the stage's dp x cp ranks; one wrapper for all chunks' tags
        layout = self.layout
        self.buckets = {
            c: GradientBuckets(st.store, dpcp, layout.bucket_mb * 2**20, layout.collectives, layout.overlap)
            for c, st in self.stacks.items()
        }

    def _stack(self, model, layout, mesh, lo: int, hi: int):
        return ContextChunkStack(model, layout, mesh.groups["cp"], mesh.world.runtime, lo, hi)

    def train_step(self, micro_steps_data, global_batch: int) -> float:
        def mine(tokens):  # my tokens of my dp rows: the first stage's inputs, the last's labels (else None)
            return None if tokens is None else tokens[:, self.positions]

        return super().train_step([(mine(x), mine(y)) for x, y in micro_steps_data], global_batch)

    def _loss_grad(self, y, labels, global_batch: int):
        # B x C rows of n = s/C tokens: the loss divides by B s, the global batch's tokens (context.py)
        return super()._loss_grad(y, labels, global_batch * self.cp_comm.size)

    def _boundary_shape(self, rows: int, layer: int) -> tuple[int, int]:
        """The residual stream of `rows` sequences on this cp rank: (rows * n, h)."""
        return (rows * (self.model.seq_len // self.cp_comm.size), self.model.hidden)

    def full_weights(self):
        return super().full_weights() if self.mesh.coords["cp"] == 0 else self._gather_nothing()

    def gather_full(self, local):
        return super().gather_full(local) if self.mesh.coords["cp"] == 0 else self._gather_nothing()

    def _gather_nothing(self):
        """A cp rank other than 0 still takes part in the world's gather (its chunk's weights agree)."""
        self.mesh.world.gather_object(None, root=0)
        return None
