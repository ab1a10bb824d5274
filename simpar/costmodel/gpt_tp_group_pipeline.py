"""gpt --tp --pp with --collectives tree or ps: a pipeline chunk's steps with every tp rank followed.

Tree and parameter-server all-reduces leave a tp group's ranks at different times (tp_group_time.py),
and in a pipeline each tp rank also waits for its own neighbour stage's message: so steptime.py runs
a stage's clock as one number per tp rank, and asks this runner for each step's end on every rank
from every rank's start. A step is its compute (the same on every tp rank: GptChunkCosts' seconds
less its tp collectives) and its tp ops in the order tensor_gpt.py runs them (gpt_time.tp_ops, the
loss's on the chunk with the head, --sp's LayerNorm sums in the chunk's final backward or W pass):
  F  each unit's forward, then its ops (the loss and its ops after the head)
  B  --recompute full: the forward's ops first; then each unit, last first: its backward, its ops,
     in the final one its --sp sum -- its gradients are ready for the buckets then (zero-bubble B:
     every unit's ops but the embedding's, which run in its W pass)
  W  each unit, last first: its weight pass (the embedding: its ops), in the final one its --sp sum
Compute is added before a unit's ops; where exactly within a unit does not move its end, as every
collective's ends shift with its starts (tp_group_time.py), but the units' ready times need the order.
"""

from __future__ import annotations

import numpy as np

from .chunktime import collective_gamma
from .gpt_time import sp_sync_ops, tp_ops
from .tp_group_time import group_ends


class TpGroupRun:
    """Every tp rank's end of one step of `costs` (a GptChunkCosts), from every rank's start."""

    def __init__(self, costs):
        self.costs, self.cfg = costs, costs.cfg
        self.link, self.gamma = costs.links["tp"], collective_gamma(costs.hw)

    def _ops(self, r: int):
        c = self.costs
        fwd, bwd, loss = tp_ops(self.cfg, r * self.cfg.seq_len, c.bpe)
        sync = sp_sync_ops(self.cfg, c.bpe) if self.cfg.sp else [[]] * len(fwd)
        units = range(c.lo, c.hi)
        return [fwd[u] for u in units], [bwd[u] for u in units], loss, [sync[u] for u in units]

    def _run(self, ops, clocks: np.ndarray) -> np.ndarray:
        for op in ops:
            clocks = np.array(group_ends(op, list(clocks), self.cfg.collectives, self.link, self.gamma))
        return clocks

    def step(self, kind: str, r: int, start, first: bool, final: bool, split: bool):
        """(each rank's end, {unit position: each rank's gradients ready} in a final B / W) of the
        step `kind` ("F", "B" or "W") of r sequences."""
        c = self.costs
        fwd_ops, bwd_ops, loss_ops, sync = self._ops(r)
        t, ready = np.broadcast_to(np.asarray(start, dtype=float), (self.cfg.tp,)).copy(), {}
        if kind == "F":
            fwd, _, loss_s = c._units(r)
            for u, ops in enumerate(fwd_ops):
                t = self._run(ops, t + fwd[u])
            if c._has_head():
                t = self._run(loss_ops, t + loss_s)
            return t, ready
        n = c.hi - c.lo
        if kind == "W":
            weight = c.weight_layers(r)  # last unit first; the embedding's holds its ops' seconds
            for i, pos in enumerate(reversed(range(n))):
                embed = c.lo + pos == 0
                own = c._tp(r)[1][pos] if embed else 0.0
                t = self._run(bwd_ops[pos] if embed else [], t + weight[i] - own)
                t = self._run(sync[pos] if final else [], t)
                ready[pos] = t
            return t, ready
        if self.cfg.recompute == "full":
            t = self._run([op for ops in fwd_ops for op in ops], t + c.recompute(r) - c.forward_tp(r, False))
        elif self.cfg.recompute == "selective":
            t = t + c.recompute(r)
        _, bwd, _ = c._units(r)
        weight = list(reversed(c.weight_layers(r))) if split else [0.0] * n
        for pos in reversed(range(n)):
            if split and c.lo + pos == 0:  # the embedding's whole backward is its W pass
                continue
            t = self._run(bwd_ops[pos], t + bwd[pos] - weight[pos])
            if final and not split:
                t = self._run(sync[pos], t)
            ready[pos] = t
        return t, ready
