"""MoE blocks with context and tensor parallelism (--arch gpt --experts E [--ep P] --cp C --tp T [--dp D]).

Three pieces built elsewhere, put together; nothing new is computed here:
  expert_tensor_gpt.py   a tp group runs the MoE transformer: attention split by heads, the embedding,
                         head and loss over the vocabulary, the MoE part (LayerNorm 2, router, this ep
                         rank's E/P experts) REPLICATED on every tp rank, whole on the whole stream;
  context_tensor.py      a tp group holds n = s/C tokens of each sequence (chunks c and 2C-1-c): the
                         embedding adds their global positions, the attention of its a/T heads reaches
                         the other cp ranks' tokens (ring: K/V blocks of h/T; Ulysses: all-to-alls);
  context_expert.py      capacity planned per sequence SEGMENT (m = s/(2C) tokens) from the segment
                         table gathered over the dp x cp group, so exactly the serial run's tokens drop.

The mesh (runtime/mesh.py): world rank ((d C) + c) T + k. Every group a piece needs varies only its
own axes, so each piece runs unchanged at fixed other coordinates: the tp group (attention's f and g,
the vocabulary's ops) at fixed (d, c); the cp group (K/V) at fixed (d, k); the ep group (the four
all-to-alls) and the dpcp group (the segment table, `control/cp-ep-histogram`) at fixed tp index k.
After attention's g every tp rank of a cp rank holds the same x2, so its router picks the same routes
and its segment table is the same: each tp index repeats the ep traffic of context_expert.py (T copies,
as expert_tensor_gpt.py's).

Gradients, once per step: the dense shards (tp shard k of the attention, embedding and head; the
router and LayerNorms whole) all-reduced over the D C ranks of the `dpcp` group of tp index k
(`model/grad-allreduce`, one call); ep rank j's experts over the D/P x C ranks holding them (`edpcp`,
`model/expert-grad-allreduce`). The loss divides by B s (context.py), tp index 0 reports each share.
--sp: expert_tensor_gpt.py's row shards on the cp rank's b n rows (each tp rank keeps n/T of them
between units; the MoE input all-gathered, so every tp rank routes every row; the embedding adds the
global positions of its shard, context_tensor.PositionedShardedEmbedding). zb-h1/zb-v and --recompute
selective reach the cp attention through attend_core_backward and rebuild_softmax (context_tensor.py's).
Full shape and checkpoints: expert_tensor_gpt.py's gather from cp rank 0 (every cp rank holds the same
parameters), so a checkpoint resumes serially. Closed form: costmodel/cp_moe_tp.py.
"""

from __future__ import annotations

from .context_expert import ContextExpertParallel, CpEpExchange, CpMoEFFN
from .context_tensor import ContextTensorStack
from .expert_tensor_gpt import ExpertTensorParallel, ExpertTensorStack, ShardedMoEBlock


class ContextExpertTensorStack(ExpertTensorStack):
    """ExpertTensorStack on this cp rank's n tokens: attention over the cp group (context_tensor.py's),
    capacity planned per segment over dp x cp (context_expert.py's CpMoEFFN)."""

    ffn_class = CpMoEFFN
    block_types = (ShardedMoEBlock,)
    take_sequence_share = ContextTensorStack.take_sequence_share
    attend = ContextTensorStack.attend
    attend_backward = ContextTensorStack.attend_backward
    attend_core_backward = ContextTensorStack.attend_core_backward  # zb's B pass (expert_tensor_split.py)
    rebuild_softmax = ContextTensorStack.rebuild_softmax  # --recompute selective (gpt_recompute.py)

    def __init__(self, model, layout, mesh, mine: range, exchange, indices=None):
        super().__init__(model, layout, mesh, mine, exchange, indices)  # indices: a pipeline chunk's units
        self.take_sequence_share(model, layout, mesh)


class ContextExpertTensorParallel(ExpertTensorParallel):
    """--experts E [--ep P] --cp C --tp T [--dp D] on --arch gpt (module docstring)."""

    routing_summary = ContextExpertParallel.routing_summary  # per segment: T and kept, global order

    def __init__(self, sections, mesh):
        self.cp, self.dpcp = mesh.groups["cp"], mesh.groups["dpcp"]
        super().__init__(sections, mesh)
        self.edp, self.replicas = mesh.groups["edpcp"], self.dpcp  # every cp rank holds the same
        for i, ffn in self.stack.ffns.items():  # CpMoEFFN's plan keeps (T, kept per segment)
            ffn.record = lambda H, kept, f=ffn, i=i: self.routing[-1].__setitem__(i, f.last)

    def make_stack(self, mesh) -> ContextExpertTensorStack:
        self.exchange = CpEpExchange(self)  # the ep all-to-alls and the segment table over dpcp
        return ContextExpertTensorStack(self.model, self.layout, mesh, self.mine, self.exchange)

    def my_tokens(self, x, y, rows: int):
        """Chunks c and 2C-1-c of my dp rows; the micro-step's global rows for the segment table."""
        self.exchange.rows = rows
        mine = self.stack.positions
        return x[:, mine], y[:, mine]

    def _gather(self, flat, op: str):
        """expert_tensor_gpt.py's gather at cp rank 0 (all cp ranks hold the same parameters)."""
        return super()._gather(flat, op) if self.cp.rank == 0 else None
