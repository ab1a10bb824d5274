"""The step time of `simpar train --arch gpt --pp S` (any dp, every schedule) in closed form, as the
simulated clock charges it: steptime.py's max-plus recurrences (the schedule's order, the pipeline's
send/recv links, DDP buckets overlapping each chunk's last backward) run over gpt's units, every dp
rank followed through every bucket's rounds (rounds_time.ddp_steps, as the MLP's pipeline: uneven
chunks, the tree's and the parameter server's ranks that end apart).

What each piece of work costs is gpt_time.py's units again (their matmuls at the FLOP rate, memory
passes, the per-call overhead), cut into the pipeline's chunks (gpt_pipeline.py's stages); a micro-batch
of b sequences is R = b s token rows, and a stage boundary carries b s h elements each way.
The zero-bubble schedules (zb-h1, zb-v) split each unit's backward as model/gpt_split.py does
(Qi et al. 2023, sec. 2):
  block  B: dx of Wq Wk Wv Wo and of the MLP (2R 12h^2 FLOPs), the attention's four score matmuls
            (8 R s h), every memory pass of the backward;  W: dW of the same six matrices
            (2R 12h^2) and accumulating the gradients (3 per parameter)
  head   B: dlogits Wout^T (2RhV) and LN_f's backward;  W: dWout (2RhV) and the accumulation
  embedding  no B (its input is tokens): its whole backward is the W pass
with --tp t each matrix is this rank's shard (h x h/t, h x V/t), every tp collective is in B except
the embedding's --sp all-gather, which is part of its W (parallel/tensor_gpt_split.py); steptime
still counts a W pass's seconds as compute, that all-gather's too.
--recompute full runs a chunk's forward (without the loss) again before its backward; selective
recomputes each block's q k^T (2 R s h FLOPs: gpt_recompute.py).
--tp t inside the stages (gpt_tp_pipeline.py): each unit's work is one tp rank's share (gpt_time.
unit_seconds with the local shard sizes), its blocking tp collectives (gpt_time.tp_collectives; the
loss's on the chunk with the head) are part of its forward and backward, --recompute full runs the
forward's again, a boundary carries b s h / t under --sp (steptime's row_share), and under --sp each
unit's LayerNorm gradients are summed over tp in the chunk's last backward (sp_sync) before its
gradients join a bucket. A unit's gradients are ready after its backward's f collective (it runs
before the unit's last LayerNorm backward in tensor_gpt.py), so backward_layers gives (both, 0).
Nothing here imports parallel/ or the model: the order is order.stage_order's, the split of units
into chunks stages.balanced_counts'.
"""

from __future__ import annotations

from types import SimpleNamespace

from .chunktime import collective_gamma, seconds
from .collectives import ALLREDUCE, to_bytes
from .gpt_time import ACCUMULATE, clock_rates, optimizer_seconds, tp_collectives, unit_seconds
from .gpt_tp_group_pipeline import TpGroupRun
from .order import n_chunks, stage_chunks
from .rounds_time import ddp_steps
from .spec import PRECISIONS, dp_bucket_layers, precision_of
from .stages import balanced_counts
from .steptime import step_time


class GptChunkCosts:
    """Seconds of one rank's work on gpt units lo..hi-1 (one pipeline chunk), per micro-batch of r
    sequences: the interface steptime.step_time reads (chunktime.RankCosts' for resmlp's layers)."""

    def __init__(self, cfg, spec, hw, links: dict, bounds: tuple[int, int], sizes: list[int], optimizer_s):
        self.cfg, self.spec, self.hw, self.links = cfg, spec, hw, links
        self.lo, self.hi = bounds
        self.sizes, self.bpe = sizes, spec.prec.act
        self.rate, self.stream, self.overhead = clock_rates(
            hw, precision_of(cfg), min(spec.world, hw.devices_per_node)
        )
        self.optimizer_s = optimizer_s  # the whole rank's sweep, once a step
        self.sp_sync: list = []  # --sp: each unit's LayerNorm gradients summed over tp
        if cfg.sp:
            ar, h = ALLREDUCE[cfg.collectives], cfg.hidden
            sync = [0.0] + [self._secs(ar(4 * h, cfg.tp, 0), self.bpe)] * cfg.blocks
            self.sp_sync = (sync + [self._secs(ar(2 * h, cfg.tp, 0), self.bpe)])[self.lo : self.hi]
        self._memo: dict = {}
        self._tp_memo: dict = {}
        # tree and ps leave the tp ranks apart: steptime follows each (gpt_tp_group_pipeline.py)
        grouped = cfg.tp > 1 and cfg.collectives in ("tree", "ps") and getattr(cfg, "cp", 1) == 1
        self.tp_group = TpGroupRun(self) if grouped else None

    def _secs(self, cost, elem_bytes: int, as_ring: bool | None = None) -> float:
        """Seconds of one tp collective (tp rank 0's share: the shapes divide, every rank's is the same).
        `as_ring`: whether it runs as NCCL's ring -- None: an all-reduce, the ring under --collectives
        ring or auto; True: --sp's and the loss's all-gathers and reduce-scatters, the ring whatever
        --collectives says (tensor_gpt.py, vocab_parallel.py), so priced by op_time's NCCL branch."""
        if not cost.messages:
            return 0.0
        ring = self.cfg.collectives in ("ring", "auto") if as_ring is None else as_ring
        nvls = self.cfg.collectives == "auto"
        return seconds(to_bytes(cost, elem_bytes), self.links["tp"], collective_gamma(self.hw), ring, nvls)

    def _tp(self, r: int):
        """([forward], [backward]) tp collective seconds of this chunk's units, and the loss's."""
        if r not in self._tp_memo:
            R = r * self.cfg.seq_len
            fwd, bwd, loss = tp_collectives(self.cfg, R, 0, self.bpe, self._secs)
            self._tp_memo[r] = fwd[self.lo : self.hi], bwd[self.lo : self.hi], loss
        return self._tp_memo[r]

    def _has_head(self) -> bool:
        return self.hi == len(self.sizes)

    def _units(self, r: int):
        """([forward], [backward], loss) seconds of this chunk's units for r sequences."""
        if r not in self._memo:
            fwd, bwd, loss = unit_seconds(
                self.cfg, r * self.cfg.seq_len, self.sizes, self.bpe, self.rate, self.stream, self.overhead
            )
            self._memo[r] = fwd[self.lo : self.hi], bwd[self.lo : self.hi], loss
        return self._memo[r]

    def forward(self, r: int, loss: bool = True) -> float:
        fwd, _, loss_s = self._units(r)
        tp_fwd, _, tp_loss = self._tp(r)
        return sum(fwd) + sum(tp_fwd) + (loss_s + tp_loss if loss and self._has_head() else 0.0)

    def forward_tp(self, r: int, loss: bool = True) -> float:
        tp_fwd, _, tp_loss = self._tp(r)
        return sum(tp_fwd) + (tp_loss if loss and self._has_head() else 0.0)

    def backward_tp(self, r: int) -> float:
        redo = self.forward_tp(r, loss=False) if self.cfg.recompute == "full" else 0.0
        return redo + sum(self._tp(r)[1])

    def recompute(self, r: int) -> float:
        if self.cfg.recompute == "full":
            return self.forward(r, loss=False)
        if self.cfg.recompute == "selective":  # q k^T of every block in the chunk (this rank's heads)
            L, s, h = self.cfg.blocks, self.cfg.seq_len, self.cfg.hidden
            blocks = sum(1 for u in range(self.lo, self.hi) if 0 < u <= L)
            return blocks * 2 * r * s * s * (h // self.cfg.tp) / self.rate
        return 0.0

    def backward_layers(self, r: int, first: bool = False) -> list[tuple[float, float]]:
        """(compute and tp collectives, 0) of each unit's backward, the last unit first."""
        return [(b + c, 0.0) for b, c in zip(reversed(self._units(r)[1]), reversed(self._tp(r)[1]))]

    def backward(self, r: int, first: bool = False) -> float:
        return self.recompute(r) + sum(self._units(r)[1]) + sum(self._tp(r)[1])

    def weight_layers(self, r: int) -> list[float]:
        """The W pass of each unit, the last unit first (module docstring)."""
        R, h, L, t = r * self.cfg.seq_len, self.cfg.hidden, self.cfg.blocks, self.cfg.tp
        hl, Vl = h // t, self.cfg.vocab // t  # this tp rank's shares (all of it at t = 1)
        out = []
        for u in reversed(range(self.lo, self.hi)):
            accumulate = ACCUMULATE * self.sizes[u] * self.bpe * self.stream
            if u == 0:  # the embedding's whole backward, its --sp all-gather of dL/dx included
                out.append(self._units(r)[1][0] + self._tp(r)[1][0])
            elif u <= L:
                out.append(2 * R * 12 * h * hl / self.rate + accumulate)
            else:
                out.append(2 * R * h * Vl / self.rate + accumulate)
        return out

    def weight(self, r: int) -> float:
        return sum(self.weight_layers(r))

    def backward_input(self, r: int) -> float:
        """The B half: the backward (with its recompute) less the W half."""
        return self.backward(r) - self.weight(r)

    def bucket_seconds(self, s_sizes: list, d: int) -> list[tuple[list[int], float]]:
        """DDP buckets of this chunk (positions in it, all-reduce seconds) over the dp group."""
        p, cfg, grad = self.spec.dp, self.cfg, self.spec.prec.grad
        if p == 1:
            return []
        ring, nvls = cfg.collectives in ("ring", "auto"), cfg.collectives == "auto"
        out = []
        for layers in dp_bucket_layers(s_sizes, grad, cfg.bucket_mb):
            cost = to_bytes(ALLREDUCE[cfg.collectives](sum(s_sizes[i] for i in layers), p, d), grad)
            out.append((layers, seconds(cost, self.links["dp"], collective_gamma(self.hw), ring, nvls)))
        return out


def pipeline_step_seconds(cfg, p: int, sizes: list[int], hw, local: list[int] | None = None) -> dict:
    """{step_s, compute_s, comm_s} of one --pp step on S stages x p data-parallel ranks: the slowest
    dp index's pipeline chain (steptime.step_time) -- the step ends with the slowest rank. `sizes`:
    the whole units (they cut the stages); `local`: a tp rank's shares of them (--tp; default sizes)."""
    from .hardware import group_link

    S, sched, t = cfg.pp, cfg.schedule, cfg.tp
    local = sizes if local is None else local
    Vs = cfg.virtual_stages if sched == "interleaved" else 1
    prec = PRECISIONS[precision_of(cfg)]
    C = n_chunks(sched, S, Vs)
    counts = cfg.stage_layers or balanced_counts(sizes, C)
    bounds = [(sum(counts[:k]), sum(counts[: k + 1])) for k in range(C)]
    spec = SimpleNamespace(
        pp=S, dp=p, tp=t, sp=cfg.sp, world=p * S * t, batch=cfg.batch, grad_accum=cfg.grad_accum,
        collectives=cfg.collectives,
        microbatches_used=cfg.microbatches, virtual_stages=Vs, schedule=sched, overlap=cfg.overlap,
        prec=prec, widths=[cfg.seq_len * cfg.hidden] * (len(sizes) + 1),
    )  # fmt: skip
    links = {g: group_link(hw, g, p, t, S) for g in ("dp", "pp", "tp")}
    _, stream, _ = clock_rates(hw, precision_of(cfg), min(p * S * t, hw.devices_per_node))
    timed, stages_of = {}, {}
    for d in range(p):
        stages = {}
        for s in range(S):
            mine = stage_chunks(sched, S, Vs, s)
            opt_s = optimizer_seconds(cfg, sum(sum(local[slice(*bounds[c])]) for c in mine), prec.act, stream)
            costs = {c: GptChunkCosts(cfg, spec, hw, links, bounds[c], local, opt_s) for c in mine}
            stages[s] = (costs, d, {c: local[slice(*bounds[c])] for c in mine})
        timed[d], stages_of[d] = step_time(spec, hw, links, stages, 0.0, [0.0] * S), stages
    if p > 1 and cfg.collectives != "mpi":  # every dp rank through every bucket's rounds (rounds_time.py)
        timed = ddp_steps(spec, hw, links, stages_of, timed, [0.0] * S)
    best = max(timed.values(), key=lambda one: one["makespan"])
    parts = best["parts"]
    return {
        "step_s": best["makespan"],
        "compute_s": parts["compute"],
        "comm_s": parts["pp"] + parts["dp"] + parts["tp"],
        "bubble_s": parts["bubble"],
    }
