"""The step time of `simpar train --arch gpt --cp C --tp T --pp S [--dp D]` in closed form, as the
simulated clock charges it (parallel/pipeline/context_tensor_stage.py run under --clock sim). Nothing
here imports the model, the runtime or the code that moves bytes.

It is cp_pipeline_time.py's step (steptime.py's max-plus recurrences over the schedule's order, the
pipeline's send/recv links, each chunk's gradient buckets overlapping its last backward, every chunk's
attention priced as cp_time.py's ring hops or all-to-alls) with cp_time.py's --tp inside each cp rank:

  work     a (cp c, tp j) rank runs gpt_time.unit_seconds' tp units (its shards: h/T of q, k, v, 4h/T
           of the MLP, V/T of the vocabulary) on its R = b n rows (n = s/C) with no score work, plus
           each block's attention of its a/T heads over width h/T (cp_time.ring_seconds or
           ulysses_seconds) on the cp group's link
  tp       gpt_time.tp_collectives on R = b n rows, blocking, on the tp link: the blocks' f and g,
           the vocabulary embedding's and head's all-reduces, the loss's all-gather and all-reduce
           (every tp rank's share is the same: the shapes divide); --sp: gather/scatter pairs, and
           each unit's LayerNorm gradients summed over tp in the chunk's last backward
  links    world rank ((stage dp + d) C + c) T + j (mesh.py): tp consecutive, cp stride T (size C),
           the dpcp group stride T (size dp C), pp stride dp C T; a boundary carries the cp rank's
           residual stream, b n h elements (b n h / T of its tp shard under --sp)
  buckets  each chunk's P_T shards all-reduced over the stage's dp x C ranks of the same tp index
           (place d C + c)
  recompute cp_pipeline_time.py's over the rank's shards: full the chunk's forward again (its tp
           collectives and hops included); selective the ring's forward of a/T heads again, or
           Ulysses' q k^T of its a/(C T) heads, 2 b s (h/(C T)) s / rate a block
  zb-h1/v  W is each block's six shards' dW, 2 R 12 h (h/T) / rate, the head's 2 R h (V/T) / rate, and
           accumulating 3 per local parameter; the embedding's whole backward (its --sp all-gather
           too); B the backward (with its recompute) less W (tensor_gpt_split.py)
The step ends with the slowest (dp, cp) place's chain; tp ranks of a place do the same work.
"""

from __future__ import annotations

from types import SimpleNamespace

from .cp_pipeline_time import CpChunkCosts, slowest_step
from .gpt_time import clock_rates, tp_collectives, unit_seconds
from .order import n_chunks
from .spec import PRECISIONS, precision_of
from .stages import balanced_counts


class CpTpChunkCosts(CpChunkCosts):
    """CpChunkCosts on a tp rank's shards: tp units, a/T heads of attention, tp's blocking collectives."""

    def __init__(self, cfg, spec, hw, links, bounds, local, optimizer_s, c: int):
        super().__init__(cfg, spec, hw, links, bounds, local, optimizer_s, c)
        self.local.tp, self.local.sp = cfg.tp, cfg.sp  # the units as tensor_gpt.py's, no score work

    def _units(self, r: int):
        if r not in self._memo:
            C, L = self.cfg.cp, self.cfg.blocks
            n = self.cfg.seq_len // C
            fwd, bwd, loss = unit_seconds(
                self.local, r * n, self.sizes, self.bpe, self.rate, self.stream, self.overhead
            )
            attn_f, attn_b = self._attention(r)  # this tp rank's a/T heads of width h/T
            fwd = [t + (attn_f if 0 < u <= L else 0.0) for u, t in enumerate(fwd)]
            bwd = [t + (attn_b if 0 < u <= L else 0.0) for u, t in enumerate(bwd)]
            self._memo[r] = fwd[self.lo : self.hi], bwd[self.lo : self.hi], loss
        return self._memo[r]

    def _tp(self, r: int):
        if r not in self._tp_memo:
            R = r * (self.cfg.seq_len // self.cfg.cp)  # the cp rank's rows, not b s
            fwd, bwd, loss = tp_collectives(self.local, R, 0, self.bpe, self._secs)
            self._tp_memo[r] = fwd[self.lo : self.hi], bwd[self.lo : self.hi], loss
        return self._tp_memo[r]


def cp_tp_pipeline_step_seconds(cfg, dp: int, sizes: list[int], local: list[int], hw) -> dict:
    """{step_s, compute_s, comm_s, bubble_s} of one --cp C --tp T --pp S step: the slowest (dp, cp)
    place's pipeline chain (steptime.step_time). `sizes`: the whole units (they cut the chunks);
    `local`: a tp rank's shards of them (gpt_tp.local_unit_sizes)."""
    from .hardware import group_link

    S, C, T, sched = cfg.pp, cfg.cp, cfg.tp, cfg.schedule
    Vs = cfg.virtual_stages if sched == "interleaved" else 1
    prec = PRECISIONS[precision_of(cfg)]
    K = n_chunks(sched, S, Vs)
    counts = cfg.stage_layers or balanced_counts(sizes, K)
    bounds = [(sum(counts[:k]), sum(counts[: k + 1])) for k in range(K)]
    spec = SimpleNamespace(
        pp=S, dp=dp, tp=T, sp=cfg.sp, world=dp * C * T * S, batch=cfg.batch, grad_accum=cfg.grad_accum,
        microbatches_used=cfg.microbatches, virtual_stages=Vs, schedule=sched, overlap=cfg.overlap,
        prec=prec, widths=[cfg.seq_len // C * cfg.hidden] * (len(sizes) + 1),
    )  # fmt: skip
    links = {
        "cp": group_link(hw, "dp", C, T, S),
        "dp": group_link(hw, "dp", dp * C, T, S),
        "pp": group_link(hw, "pp", dp * C, T, S),
        "tp": group_link(hw, "tp", dp * C, T, S),
    }
    _, stream, _ = clock_rates(hw, precision_of(cfg), min(spec.world, hw.devices_per_node))
    best = slowest_step(spec, hw, links, sched, S, Vs, bounds, local, dp, C, stream, cfg, CpTpChunkCosts)
    parts = best["parts"]
    return {
        "step_s": best["makespan"],
        "compute_s": parts["compute"],
        "comm_s": parts["pp"] + parts["dp"] + parts["tp"],
        "bubble_s": parts["bubble"],
    }
