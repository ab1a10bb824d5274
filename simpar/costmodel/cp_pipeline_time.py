"""The step time of `simpar train --arch gpt --cp C --pp S [--dp D]` in closed form, as the simulated
clock charges it (parallel/pipeline/context_stage.py run under --clock sim). Nothing here imports the
model, the runtime or the code that moves bytes.

It is gpt_pipeline_time.py's step -- steptime.py's max-plus recurrences over the schedule's order, the
pipeline's send/recv links, each chunk's gradient buckets overlapping its last backward -- with three
things changed, all from context_stage.py's rules:

  work     a cp rank's units run on its R = b n rows (n = s/C): gpt_time.unit_seconds with no score
           work (s = 0), and each block's attention priced as cp_time.py prices it: the ring's hops
           (ring_seconds: every hop max(blocks, transfer), its K/V posted before the blocks), or
           Ulysses' blocking all-to-alls (ulysses_seconds), on the cp group's link. Every cp rank of a
           stage does the same work at the same time (its pipeline neighbours are the same for all),
           so its hops line up.
  links    a stage boundary carries the cp rank's own residual stream, b n h elements, on the pp
           group's link (world rank ((stage dp + d) C + c): pp has stride dp C).
  buckets  each chunk's gradients all-reduced over the stage's dp x C ranks (place d C + c), on that
           group's link (stride 1, size dp C).

--recompute (context_stage.py, gpt_recompute.py, context_attention.rebuild_softmax), before a chunk's
backward: full runs the chunk's forward again (without the loss), its blocks' attention hops included;
selective rebuilds each block's softmax part: the ring its whole forward pass again (ring_seconds'
forward F: the hops again, each max(blocks, transfer)), Ulysses its heads' q k^T locally,
2 b s (h/C) s / rate a block (b a/C products of s x d x s).
--schedule zb-h1, zb-v (model/gpt_split.py on a cp block): B is the backward less the W half, so the
attention's backward (its hops, its dK/dV partial sums, or Ulysses' all-to-alls) is in B; W is a
block's six weight matrices' dW, 2 R 12 h^2 / rate, and accumulating 3 per parameter; the head's
2 R h V / rate and the accumulation; the embedding's whole backward (R = b n rows).
With --tp (cp_tp_pipeline_time.py's CpTpChunkCosts, self.local.tp = T) the same terms on the tp rank's
shards: attention of a/T heads over width h/T, Ulysses' q k^T of a/(C T) heads, W's h x h/T and h x V/T.
"""

from __future__ import annotations

from types import SimpleNamespace

from .chunktime import collective_gamma, seconds
from .collectives import ALLREDUCE, to_bytes
from .cp_time import ring_seconds, ulysses_seconds
from .gpt_pipeline_time import GptChunkCosts
from .gpt_time import ACCUMULATE, clock_rates, optimizer_seconds, unit_seconds
from .order import n_chunks, stage_chunks
from .spec import PRECISIONS, dp_bucket_layers, precision_of
from .stages import balanced_counts
from .steptime import step_time


class CpChunkCosts(GptChunkCosts):
    """GptChunkCosts on cp rank c's n = s/C tokens: its blocks' attention is cp_time.py's hops."""

    def __init__(self, cfg, spec, hw, links, bounds, sizes, optimizer_s, c: int):
        super().__init__(cfg, spec, hw, links, bounds, sizes, optimizer_s)
        self.c = c
        # the units without their score work (s = 0): the attention's hops are added per block
        self.local = SimpleNamespace(
            hidden=cfg.hidden, heads=cfg.heads, seq_len=0, vocab=cfg.vocab, tp=1, sp=False,
            blocks=cfg.blocks, collectives=cfg.collectives,
        )  # fmt: skip

    def _units(self, r: int):
        if r not in self._memo:
            C, s, L = self.cfg.cp, self.cfg.seq_len, self.cfg.blocks
            n = s // C
            fwd, bwd, loss = unit_seconds(
                self.local, r * n, self.sizes, self.bpe, self.rate, self.stream, self.overhead
            )
            attn_f, attn_b = self._attention(r)
            fwd = [t + (attn_f if 0 < u <= L else 0.0) for u, t in enumerate(fwd)]
            bwd = [t + (attn_b if 0 < u <= L else 0.0) for u, t in enumerate(bwd)]
            self._memo[r] = fwd[self.lo : self.hi], bwd[self.lo : self.hi], loss
        return self._memo[r]

    def _attention(self, r: int):
        """(forward, backward) seconds of one block's attention for r sequences (cp_time.py), over the
        rank's heads: all a (a/T of width h/T with --tp, cp_tp_pipeline_time.py)."""
        C, T, n = self.cfg.cp, self.local.tp, self.cfg.seq_len // self.cfg.cp
        h, a = self.cfg.hidden // T, self.cfg.heads // T
        attention = ring_seconds if self.cfg.cp_algo == "ring" else ulysses_seconds
        f, b, _ = attention(r, n, h, a, C, self.bpe, self.rate, self.stream, self.links["cp"])
        return f, b

    def _blocks(self) -> int:
        return sum(1 for u in range(self.lo, self.hi) if 0 < u <= self.cfg.blocks)

    def recompute(self, r: int) -> float:
        if self.cfg.recompute == "selective" and self.cfg.cp_algo == "ring":  # the ring's forward again
            return self._blocks() * self._attention(r)[0]
        if self.cfg.recompute == "selective":  # Ulysses: q k^T of my a/(C T) heads over all s tokens
            s, h, C = self.cfg.seq_len, self.cfg.hidden, self.cfg.cp
            return self._blocks() * 2 * r * s * s * (h // (C * self.local.tp)) / self.rate
        return super().recompute(r)  # full: self.forward(r, loss=False), the hops included

    def weight_layers(self, r: int) -> list[float]:
        """The W pass of each unit on R = r n rows, the last unit first (module docstring)."""
        R, h, L = r * self.cfg.seq_len // self.cfg.cp, self.cfg.hidden, self.cfg.blocks
        T = self.local.tp  # --tp: this rank's shards, h x h/T and h x V/T (tensor_gpt_split.py)
        out = []
        for u in reversed(range(self.lo, self.hi)):
            accumulate = ACCUMULATE * self.sizes[u] * self.bpe * self.stream
            if u == 0:  # the embedding: its whole backward (--tp --sp: its all-gather of dL/dx too)
                out.append(self._units(r)[1][0] + (self._tp(r)[1][0] if T > 1 else 0.0))
            elif u <= L:
                out.append(2 * R * 12 * h * (h // T) / self.rate + accumulate)
            else:
                out.append(2 * R * h * (self.cfg.vocab // T) / self.rate + accumulate)
        return out

    def bucket_seconds(self, s_sizes: list, d: int) -> list[tuple[list[int], float]]:
        """This chunk's buckets, each all-reduced over the stage's dp x C ranks from place d C + c."""
        p, cfg, grad = self.spec.dp * self.cfg.cp, self.cfg, self.spec.prec.grad
        if p == 1:
            return []
        ring, nvls = cfg.collectives in ("ring", "auto"), cfg.collectives == "auto"  # as GptChunkCosts'
        out = []
        for layers in dp_bucket_layers(s_sizes, grad, cfg.bucket_mb):
            cost = to_bytes(
                ALLREDUCE[cfg.collectives](sum(s_sizes[i] for i in layers), p, d * cfg.cp + self.c), grad
            )
            out.append((layers, seconds(cost, self.links["dp"], collective_gamma(self.hw), ring, nvls)))
        return out


def cp_pipeline_step_seconds(cfg, dp: int, sizes: list[int], hw) -> dict:
    """{step_s, compute_s, comm_s, bubble_s} of one --cp C --pp S step on dp x C ranks per stage: the
    slowest (dp, cp) place's pipeline chain (steptime.step_time)."""
    from .hardware import group_link

    S, C, sched = cfg.pp, cfg.cp, cfg.schedule
    Vs = cfg.virtual_stages if sched == "interleaved" else 1
    prec = PRECISIONS[precision_of(cfg)]
    K = n_chunks(sched, S, Vs)
    counts = cfg.stage_layers or balanced_counts(sizes, K)
    bounds = [(sum(counts[:k]), sum(counts[: k + 1])) for k in range(K)]
    spec = SimpleNamespace(
        pp=S, dp=dp, tp=1, sp=False, world=dp * C * S, batch=cfg.batch, grad_accum=cfg.grad_accum,
        microbatches_used=cfg.microbatches, virtual_stages=Vs, schedule=sched, overlap=cfg.overlap,
        prec=prec, widths=[cfg.seq_len // C * cfg.hidden] * (len(sizes) + 1),
    )  # fmt: skip
    links = {
        "cp": group_link(hw, "dp", C, 1, 1),
        "dp": group_link(hw, "dp", dp * C, 1, S),
        "pp": group_link(hw, "pp", dp * C, 1, S),
        "tp": group_link(hw, "tp", dp * C, 1, S),
    }
    _, stream, _ = clock_rates(hw, precision_of(cfg), min(dp * C * S, hw.devices_per_node))
    best = slowest_step(spec, hw, links, sched, S, Vs, bounds, sizes, dp, C, stream, cfg, CpChunkCosts)
    parts = best["parts"]
    return {
        "step_s": best["makespan"],
        "compute_s": parts["compute"],
        "comm_s": parts["pp"] + parts["dp"],
        "bubble_s": parts["bubble"],
    }


def slowest_step(spec, hw, links, sched, S, Vs, bounds, sizes, dp, C, stream, cfg, chunk_costs) -> dict:
    """steptime's step for every (dp, cp) coordinate's pipeline, chunks priced by `chunk_costs`
    (CpChunkCosts, or cp_tp_pipeline_time's CpTpChunkCosts on a tp rank's `sizes`): the slowest is the
    step, since the gradient all-reduce waits for every rank."""
    prec = PRECISIONS[precision_of(cfg)]
    best = None
    for d in range(dp):
        for c in range(C):
            stages = {}
            for s in range(S):
                mine = stage_chunks(sched, S, Vs, s)
                opt_s = optimizer_seconds(
                    cfg, sum(sum(sizes[slice(*bounds[k])]) for k in mine), prec.act, stream
                )
                costs = {k: chunk_costs(cfg, spec, hw, links, bounds[k], sizes, opt_s, c) for k in mine}
                stages[s] = (costs, d, {k: sizes[slice(*bounds[k])] for k in mine})
            timed = step_time(spec, hw, links, stages, 0.0, [0.0] * S)
            if best is None or timed["makespan"] > best["makespan"]:
                best = timed
    return best
