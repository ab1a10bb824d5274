"""ZeRO over dp x cp (--cp C --zero 1|2|3, --arch gpt): the model states sharded over the dpcp group.

Under context parallelism every cp rank holds the whole model and its gradient is one more share of
the serial gradient, exactly as a dp rank's (context.py): the gradient sum runs over the p = dp C ranks
of the mesh's `dpcp` group. So ZeRO (zero.py; Rajbhandari et al. 2020, sec. 5) shards over those p
ranks unchanged -- Megatron's distributed optimizer does the same with CP (its data-parallel group
"with CP"): stage 1 reduce-scatters the flat gradient and all-gathers the updated parameters, stages
2 and 3 do so unit by unit, stage 3 gathering every unit for forward and again for backward.

Only two things differ from zero.py's dp-only run, both taken from context.py:
  - the units are context_units: this cp rank's tokens (chunks r and 2C-1-r of each sequence), the
    blocks' attention reaching the rest over the cp group (K/V traffic as --cp without --zero);
  - the loss divides by the global batch's B s tokens, given as B x C rows of n = s/C tokens.
Bytes per rank per step (model): stage 1/2 reduce-scatter + all-gather of P over p ranks, i.e.
2(p-1)/p P elements (to a chunk's rounding); stage 3 one reduce-scatter and two all-gathers of
every unit, 3(p-1)/p P -- zero.py's formulas with p = dp C (costmodel/cp_zero.py).

Checkpoints: chunks in dpcp-rank order concatenate back to the whole (dpcp rank d C + c is the world
rank with pp = tp = 1), so zero.py's gather and slice are right: a cp --zero checkpoint resumes
serially and the other way round.
"""

from __future__ import annotations

from ..model.ring_attention import chunk_positions
from .context import ContextStack, context_units
from .zero import ZeroDataParallel


class ContextZero(ZeroDataParallel):
    """ZeRO stage 1, 2 or 3 over the dpcp group on cp's units (module docstring)."""

    def __init__(self, sections, mesh):
        self.cp_comm = mesh.groups["cp"]
        self.positions = chunk_positions(self.cp_comm.rank, self.cp_comm.size, sections.model.seq_len)
        super().__init__(sections, mesh)

    def _sharding_group(self, mesh):
        return mesh.groups["dpcp"]

    def _make_units(self) -> list:
        return context_units(self.model, self.layout, self.cp_comm, self.rt)

    def _make_stack(self):
        return ContextStack(self.model, self.layout, self.cp_comm, self.rt)

    def _forward_backward(self, x, y, global_batch: int, last: bool) -> float:
        x, y = x[:, self.positions], y[:, self.positions]  # my tokens of my dp rows
        # B x C rows of n = s/C tokens: the loss divides by B s, the global batch's tokens
        return super()._forward_backward(x, y, global_batch * self.cp_comm.size, last)
