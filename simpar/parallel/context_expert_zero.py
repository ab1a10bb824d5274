"""ZeRO with experts under context parallelism (--arch gpt --experts E --ep P --cp C --dp D --zero 1|2|3):
context_expert.py's layout with its model states sharded as expert_zero.py shards expert_gpt.py's.

Under --cp every cp rank holds the whole model and its gradient is one more share of the serial one
(context_zero.py), so each part shards over the group that sums its gradient in context_expert.py: the
dense parameters over the D C ranks of the mesh's `dpcp` group, the experts of ep rank j over the
(D/P) C ranks of `edpcp` (every edp and cp coordinate holding them). expert_zero.py's unit-by-unit
stages run unchanged over those two groups; only what context_expert.py adds differs: the units
(this cp rank's tokens, the attention reaching the rest over cp), the MoE FFN's capacity planned per
segment over dp x cp (CpMoEFFN), and the loss dividing by the global batch's B s tokens. Bytes:
expert_zero.py's formulas with D -> D C and D/P -> (D/P) C (costmodel/gpt_moe_zero.py), plus
context_expert.py's K/V and all-to-all traffic (costmodel/cp_moe.py). Checkpoints: chunks gathered to
dpcp and edpcp rank 0 (cp rank 0), then expert_gpt.py's gather from cp rank 0's first ep group.
"""

from __future__ import annotations

from ..model.ring_attention import chunk_positions
from .context_expert import ContextExpertParallel, CpEpExchange, CpMoEFFN, context_moe_units
from .expert_zero import ExpertZero


class ContextExpertZero(ExpertZero):
    """ZeRO stage 1, 2 or 3 over dpcp (dense) and edpcp (experts) on context_expert.py's units."""

    ffn_class = CpMoEFFN
    routing_summary = ContextExpertParallel.routing_summary  # the segment table's summary

    def __init__(self, sections, mesh):
        self.cp, self.dpcp = mesh.groups["cp"], mesh.groups["dpcp"]
        super().__init__(sections, mesh)
        self.cp_positions = chunk_positions(self.cp.rank, self.cp.size, self.model.seq_len)
        self.exchange = CpEpExchange(self)
        for i, ffn in self.ffns.items():
            ffn.x = self.exchange
            ffn.record = lambda H, kept, f=ffn, i=i: self.routing[-1].__setitem__(i, f.last)

    def _sharding_groups(self, mesh) -> tuple:
        return mesh.groups["dpcp"], mesh.groups["edpcp"]

    def make_units(self) -> list:
        return context_moe_units(self.model, self.layout, self.cp, self.rt)

    def _micro_step(self, x, y, rows: int, global_batch: int, last: bool) -> float:
        """My tokens of my rows; B x C rows of n = s/C tokens: the loss divides by B s (context.py)."""
        self.exchange.rows, s = rows, self.model.seq_len
        x, y = x[:, self.cp_positions], y[:, self.cp_positions]
        return self._pass(x, y, rows * s, global_batch * s, global_batch * self.cp.size, last)
