"""mlp/resmlp --tp with --collectives tree or ps: a chunk's steps on every tp rank, as
gpt_tp_group_pipeline.py runs gpt's (tp_group_time.py says why the ranks leave tp's tree and ps
all-reduces apart; steptime.py then keeps such a stage's clock per tp rank).

chunktime.RankCosts' pieces, with each layer's tp ops in the order the model runs them:
  forward   each layer's compute, then: a row layer's g all-reduce of r x its output width; a resmlp
            block's g all-reduce of r d, or under --sp its gather then scatter (resblocks.py)
  backward  --recompute full: the forward's again first; then each layer, last first: its compute
            (zero-bubble B: less its W half), then a column layer's f all-reduce of r x its input
            width (not the first layer's), a block's f all-reduce or --sp's gather then scatter; an mlp
            layer's gradients are ready before them (the hook fires first), a block's after them (its
            LayerNorm's need f) and under --sp after the unit's --sp sum in the final backward (or W)
  W         each layer's W half (no collectives), in the final one its --sp sum
"""

from __future__ import annotations

import numpy as np

from .chunktime import RankCosts, collective_gamma
from .resblocks import sp_grad_sizes
from .tp_group_time import group_ends


def tp_group_of(costs):
    """The runner of `costs`' steps on every tp rank, or None where its tp ranks stay together. gpt's
    chunks carry theirs (GptChunkCosts.tp_group); a RankCosts gets one under tree and ps, made here on
    first use and kept on it (not in chunktime.py: this runner's all-reduces are allreduce_ends.py's,
    which imports chunktime)."""
    if not isinstance(costs, RankCosts) or hasattr(costs, "tp_group"):
        return getattr(costs, "tp_group", None)
    grouped = costs.spec.tp > 1 and costs.spec.collectives in ("tree", "ps")
    costs.tp_group = RankTpGroup(costs, collective_gamma(costs.hw)) if grouped else None
    return costs.tp_group


class RankTpGroup:
    """Every tp rank's end of one step of `costs` (a RankCosts), from every rank's start."""

    def __init__(self, costs, gamma: float):
        self.costs, self.spec, self.gamma = costs, costs.spec, gamma
        sizes = sp_grad_sizes(self.spec) if getattr(self.spec, "sp", False) else []
        self.sync = [[("all-reduce", sizes[i], self.spec.prec.grad)] if sizes else [] for i in self._layers()]

    def _layers(self):
        return range(self.costs.lo, self.costs.hi)

    def _ops(self, r: int, i: int, kind: str, phase: str) -> list:
        W, bpe = self.spec.widths, self.spec.prec.act
        if kind == "block" and getattr(self.spec, "sp", False):
            return [("all-gather", r * W[i], bpe), ("reduce-scatter", r * W[i], bpe)]
        if kind == "block" or (kind, phase) == ("column", "backward") and i > 0:
            return [("all-reduce", r * W[i], bpe)]
        return [("all-reduce", r * W[i + 1], bpe)] if (kind, phase) == ("row", "forward") else []

    def _run(self, ops, t: np.ndarray) -> np.ndarray:
        for op in ops:
            t = np.array(group_ends(op, list(t), self.spec.collectives, self.costs.links["tp"], self.gamma))
        return t

    def _forward(self, r: int, t: np.ndarray) -> np.ndarray:
        for i, kind, compute in zip(self._layers(), self.costs.kinds, self.costs.forward_layers(r)):
            t = self._run(self._ops(r, i, kind, "forward"), t + compute)
        return t

    def step(self, kind: str, r: int, start, first: bool, final: bool, split: bool):
        """(each rank's end, {layer position: each rank's gradients ready} in a final B / W) of the
        step `kind` ("F", "B" or "W") of r rows."""
        c, n = self.costs, self.costs.hi - self.costs.lo
        t, ready = np.broadcast_to(np.asarray(start, dtype=float), (self.spec.tp,)).copy(), {}
        sp = getattr(self.spec, "sp", False)
        if kind == "F":
            return self._forward(r, t) + c.loss(r), ready
        if kind == "W":
            for pos, w in zip(reversed(range(n)), c.weight_layers(r)):
                t = self._run(self.sync[pos] if final else [], t + w)
                ready[pos] = t
            return t, ready
        t = self._forward(r, t) if self.spec.recompute == "full" else t + c.recompute(r)
        weights = c.weight_layers(r) if split else [0.0] * n
        layers = zip(reversed(range(n)), reversed(c.kinds), c.backward_layers(r, first), weights)
        for pos, kind_i, (compute, _), w in layers:
            t = t + compute - w
            ready[pos] = t  # the hook fires before the layer's f all-reduce
            t = self._run(self._ops(r, c.lo + pos, kind_i, "backward"), t)
            if sp and final and not split:  # --sp: its collectives, the sum of its row-shard gradients
                t = self._run(self.sync[pos], t)
            if sp or kind_i == "block":  # a block's LayerNorm gradients need its f (tensor_resmlp.py)
                ready[pos] = t
        return t, ready
