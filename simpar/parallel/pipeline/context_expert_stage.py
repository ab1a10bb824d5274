"""MoE pipeline stages with context parallelism (--arch gpt --experts E [--ep P] --cp C --pp S [--dp D]
[--tp T [--sp]]; every --schedule, and --recompute).

Three built pieces, joined rather than copied:
  expert_stage.py   a stage's chunk of units as one flat store, the experts of ep rank j sharded over the
                    stage's ep group; micro-batch mb of grad-accum pass g is the serial run's micro-step
                    g M + mb (the feeder cuts G M micro-steps, then splits each over dp), so capacity and
                    the aux loss route exactly the serial run's token groups
  context_stage.py  cp ranks inside each stage: rank (d, c) holds chunks c and 2C-1-c of 2C of each of
                    its sequences (n = s/C tokens), a boundary carries its own b n h (`pp-send-act`,
                    `pp-send-grad` to the rank with the same dp and cp coordinates on the next stage),
                    the loss divides by B C rows of n tokens
  context_expert.py the MoE blocks on a cp rank's tokens (ContextMoEBlock: attention over the stage's cp
                    group, ring or Ulysses) and capacity planned per SEGMENT of m = s/(2C) tokens over the
                    stage's dp x cp group (CpMoEFFN, CpEpExchange: one `control/cp-ep-histogram`
                    all-gather), so each expert keeps exactly the serial run's tokens
The mesh (runtime/mesh.py): pp outermost, then edp, ep, cp; a stage's dp x cp ranks are its `dpcp`
group, the ranks holding an expert its `edpcp` group. Per step each chunk's dense part is all-reduced
over dpcp (`model/grad-allreduce`, D C ranks) and its experts over edpcp (`model/expert-grad-allreduce`,
D/P x C ranks), once, no buckets (expert_stage.py). Bytes: costmodel/cp_moe_pipeline.py.

Checkpoints and --weights-out: expert_stage.py's full shape, from cp rank 0 of each stage (every cp rank
holds the same parameters), so a checkpoint resumes on any layout, serial included.

With --tp T, the full mesh pp x dp x ep x cp x tp: each chunk is context_expert_tensor.py's stack over
its units (attention by a/T heads over the cp group, the vocabulary over tp, the MoE part whole on every
tp rank, capacity per segment as above); each tp rank sends its own copy of the boundary's b n h; the
loss is the vocabulary-parallel one, which divides by B s itself (context_tensor_stage.py's rule).
--sp: each tp rank holds its n/T of the cp rank's rows between units and at the boundaries (b n h / T
a boundary), expert_tensor_gpt.py's row shards on the cp rank's tokens; the LayerNorms' gradients summed
over tp once a step (expert_stage._allreduce).

zb-h1, zb-v and --recompute as expert_stage.py runs them, on cp blocks: B keeps the attention core's cp
traffic (context.py's / context_tensor.py's attend_core_backward: the ring's hops and dK/dV sums, or
Ulysses' all-to-alls), W only local products. --recompute full re-runs a chunk's forward on its own
micro-step (_route sets the segment table's rows too: a later micro-step's forward may have run between),
so the ring's K/V hops (or Ulysses' 4 forward all-to-alls), the segment table's all-gather and each
block's ep-dispatch and ep-combine are sent again; selective rebuilds each block's softmax part
(rebuild_softmax: the ring's forward again, hops re-sent; Ulysses locally). costmodel/cp_moe_pipeline.py
counts all of it. --precision mixed-*: expert_stage.py's (the world votes on a skip, the aux gradient
scaled). --clock sim: costmodel/gpt_moe_pipeline_time.py and moe_split_time.py (config/moe.py refuses --sp
under it: 8 ranks and more, never measured).
"""

from __future__ import annotations

from ...model.moe import micro_rows
from ..context_expert import CpEpExchange, CpMoEFFN, context_moe_units, segment_order
from ..context_expert_tensor import ContextExpertTensorStack
from .context_stage import ContextPipelineParallel
from .engine import PipelineParallel
from .expert_stage import ExpertPipelineParallel, MoEChunkStack


class ContextExpertPipelineParallel(ExpertPipelineParallel, ContextPipelineParallel):
    """An MoE pipeline stage on this cp rank's tokens (MRO: expert_stage's micro-steps and gradients,
    then context_stage's token slicing, loss and boundary shape, then the pipeline engine)."""

    def __init__(self, sections, mesh):
        self.cp = mesh.groups["cp"]  # CpEpExchange's names for the stage's groups
        self.dpcp = mesh.groups["dpcp"]
        self.exchange = None  # one for all chunks: _forward sets its micro-step's rows
        super().__init__(sections, mesh)
        self.replicas, self.edp = self.dpcp, mesh.groups["edpcp"]  # gradients over every cp rank too
        for st in self.stacks.values():
            for i, ffn in st.ffns.items():  # keep (T, kept per segment): the summary's and the cost model's
                ffn.record = lambda H, kept, f=ffn, i=i: self.routing[self._micro].__setitem__(i, f.last)

    def _stack(self, model, layout, mesh, lo: int, hi: int):
        # inside PipelineParallel.__init__: self.model, layout and the groups above are set
        self.exchange = self.exchange or CpEpExchange(self)
        if mesh.tp > 1:  # the full mesh: context_expert_tensor.py's stack over the chunk's units
            return ContextExpertTensorStack(model, layout, mesh, self.mine, self.exchange, range(lo, hi))
        units = context_moe_units(model, layout, mesh.groups["cp"], mesh.world.runtime)
        return MoEChunkStack(model, mesh.world.runtime, lo, hi, self.mine, self.exchange, units, CpMoEFFN)

    def _boundary_shape(self, rows: int, layer: int) -> tuple[int, int]:
        """context_stage.py's (rows n, h); --sp: this tp rank's contiguous shard, rows n / T (as
        context_tensor_stage.py's boundaries)."""
        rows_n, h = super()._boundary_shape(rows, layer)
        return (rows_n // self.mesh.tp if self.layout.sp else rows_n, h)

    def _loss_grad(self, y, labels, global_batch: int):
        if self.mesh.tp > 1:  # vocab_loss_grad divides by B s already (context_tensor_stage.py's reason)
            return PipelineParallel._loss_grad(self, y, labels, global_batch)
        return super()._loss_grad(y, labels, global_batch)

    def _route(self, mb: int, stack) -> None:
        """expert_stage.py's micro-step, and its global rows for the segment table: before each forward
        and before --recompute full's second one (a later micro-step's forward may have run between)."""
        G, M = self.optimisation.grad_accum, self.M
        self.exchange.rows = micro_rows(self._global_batch, G * M, self._pass * M + mb)
        super()._route(mb, stack)

    def routing_summary(self) -> dict:
        """expert_stage.py's keys over every stage's blocks, plus context_expert.py's: routed_by_segment
        (T per micro-step and block, 2C B_k x E in global order: what costmodel/cp_moe_pipeline.py
        reads) and routed_by_rank / kept_by_rank per rank of a stage's dp x cp group (d C + c)."""
        out = super().routing_summary()
        routing, order = self._all_routing, out["layers"]
        D, C = self.mesh.dp, self.cp.size

        def by_rank(step, i, which):
            table = step[i][which]
            return [table[seg].sum(axis=0).tolist() for seg in segment_order(len(table) // (2 * C), D, C)]

        return out | {
            "cp": C,
            "routed_by_segment": [[step[i][0].tolist() for i in order] for step in routing],
            "routed_by_rank": [[by_rank(step, i, 0) for i in order] for step in routing],
            "kept_by_rank": [[by_rank(step, i, 1) for i in order] for step in routing],
        }

    def _gather(self, local, op: str):
        """expert_stage.py's gather from cp rank 0 of each stage; the others take part in the world's
        gather with nothing (their parameters agree)."""
        if self.cp.rank == 0:
            return super()._gather(local, op)
        self.mesh.world.gather_object(None, root=0)
        return None
