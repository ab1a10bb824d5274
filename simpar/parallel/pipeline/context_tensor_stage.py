"""cp x tp inside pipeline stages (--arch gpt --cp C --tp T --pp S [--dp D]): pp x dp x cp x tp.

The mesh (runtime/mesh.py) nests pp, dp, cp, tp from the outside in: world rank
((stage dp + d) C + c) T + j. A stage is dp x C x T ranks; each of its chunks (context_stage.py's cut
of the units at the pipeline's boundaries) runs as context_tensor.py runs the whole model: cp rank c
holds n = s/C tokens of each sequence (chunks c and 2C-1-c of 2C), tp rank j of it a/T heads, h/T of
q, k, v, 4h/T of the MLP and V/T of the vocabulary (Megatron-LM, Shoeybi et al. 2019; Korthikanti et
al. 2022 for CP with TP). Attention's ring (or all-to-all) stays inside the stage's cp group of the
same tp index, tp's f and g inside the cp rank's tp group.

The boundary rule: what a chunk hands on is the residual stream of its cp rank's n tokens, replicated
on every tp rank of that cp rank (g's all-reduce made it whole). So tp rank j of cp rank c sends its
own copy, b n h elements per micro-batch ("pp-send-act"; its gradient "pp-send-grad" back), to the rank
with the same (dp, cp, tp) coordinates on the next stage (mesh.pp_comm varies pp only) -- 1/C of a
tp x pp pipeline's b s h. Under --sp (Korthikanti et al. 2022, sec. 4.2.2) the stream between stages is
sequence-sharded as inside the chunk: tp rank j sends only rows j R/T .. (j+1) R/T of the cp rank's
R = b n rows, b n h / T (config/rules.py makes T divide n); micro-batches stay whole sequences
(tokens, labels), the shard is cut inside the chunk (context_tensor.py), not over sequences.

The loss (last stage): the vocabulary-parallel cross-entropy over the tp group on the cp rank's b n
rows, divided by the global batch's B s tokens (context_tensor.py), tp index 0 reporting each cp
rank's share. Gradients: each chunk's shards all-reduced (SUM) over the stage's dp x C ranks of the
same tp index (the mesh's dpcp group). Checkpoints: cp index 0's tp groups assemble the chunks
(engine.py), the other cp ranks agree (context_stage.py).

Built for every schedule (a stage's several chunks are each such a stack), with or without --sp; under
--clock sim costmodel/cp_tp_pipeline_time.py prices the step.
--recompute (recompute.py) as context_stage.py's over this rank's a/T heads: full re-runs the chunk's
forward -- each block's ring hops (2 (C-1) b n h/T) or Ulysses' forward all-to-alls, and the forward's
tp collectives, again; selective drops each block's softmax part and rebuilds it before the backward
(gpt_recompute.py -> ContextTensorStack.rebuild_softmax: the ring's forward again, hops included;
Ulysses' P locally). The zero-bubble schedules split each unit as tensor_gpt_split.py does: B holds the
cp attention's backward (ContextTensorStack.attend_core_backward: hops, dK/dV partial sums, or the
all-to-alls) and tp's input-gradient collectives, W the rank's local dW alone (the embedding's whole
backward). costmodel/cp_tp_pipeline.py predicts both.
"""

from __future__ import annotations

from ..context_tensor import ContextTensorStack
from .context_stage import ContextPipelineParallel
from .engine import PipelineParallel


class ContextTensorPipelineParallel(ContextPipelineParallel):
    """A pipeline stage whose chunks are cp x tp stacks (module docstring)."""

    def _stack(self, model, layout, mesh, lo: int, hi: int):
        return ContextTensorStack(model, layout, mesh, list(range(lo, hi)))

    def _loss_grad(self, y, labels, global_batch: int):
        # vocab_loss_grad divides by global_batch x seq_len = B s already: the cp ranks' shares add up
        return PipelineParallel._loss_grad(self, y, labels, global_batch)

    def _boundary_shape(self, rows: int, layer: int) -> tuple[int, int]:
        """The cp rank's residual stream of `rows` sequences, (rows n, h); --sp: this tp rank's
        contiguous shard of those rows, (rows n / T, h) (config/rules.py makes T divide n)."""
        rows_n = rows * (self.model.seq_len // self.cp_comm.size)
        return (rows_n // self.mesh.tp if self.layout.sp else rows_n, self.model.hidden)
