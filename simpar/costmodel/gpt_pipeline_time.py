"""The step time of `simpar train --arch gpt --pp S` (any dp, every schedule) in closed form, as the
simulated clock charges it: steptime.py's max-plus recurrences (the schedule's order, the pipeline's
send/recv links, DDP buckets overlapping each chunk's last backward) run over gpt's units.

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
--recompute full runs a chunk's forward (without the loss) again before its backward; selective
recomputes each block's q k^T (2 R s h FLOPs: gpt_recompute.py).
Nothing here imports parallel/ or the model: the order is order.stage_order's, the split of units
into chunks stages.balanced_counts'.
"""

from __future__ import annotations

from types import SimpleNamespace

from .chunktime import collective_gamma, seconds
from .collectives import ALLREDUCE, to_bytes
from .gpt_time import ACCUMULATE, clock_rates, optimizer_seconds, unit_seconds
from .order import n_chunks, stage_chunks
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
        self.sp_sync: list = []  # no --sp without --tp
        self._memo: dict = {}

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
        return sum(fwd) + (loss_s if loss and self.hi == len(self.sizes) else 0.0)

    def forward_tp(self, r: int) -> float:
        return 0.0

    def backward_tp(self, r: int) -> float:
        return 0.0

    def recompute(self, r: int) -> float:
        if self.cfg.recompute == "full":
            return self.forward(r, loss=False)
        if self.cfg.recompute == "selective":  # q k^T of every block in the chunk
            L, s, h = self.cfg.blocks, self.cfg.seq_len, self.cfg.hidden
            blocks = sum(1 for u in range(self.lo, self.hi) if 0 < u <= L)
            return blocks * 2 * r * s * s * h / self.rate
        return 0.0

    def backward_layers(self, r: int, first: bool = False) -> list[tuple[float, float]]:
        """(compute, 0) of each unit's backward, the last unit first (no tp collectives)."""
        return [(b, 0.0) for b in reversed(self._units(r)[1])]

    def backward(self, r: int, first: bool = False) -> float:
        return self.recompute(r) + sum(self._units(r)[1])

    def weight_layers(self, r: int) -> list[float]:
        """The W pass of each unit, the last unit first (module docstring)."""
        R, h, V, L = r * self.cfg.seq_len, self.cfg.hidden, self.cfg.vocab, self.cfg.blocks
        out = []
        for u in reversed(range(self.lo, self.hi)):
            if u == 0:
                out.append(self._units(r)[1][0])  # the embedding's whole backward
            elif u <= L:
                out.append(
                    2 * R * 12 * h * h / self.rate + ACCUMULATE * self.sizes[u] * self.bpe * self.stream
                )
            else:
                out.append(2 * R * h * V / self.rate + ACCUMULATE * self.sizes[u] * self.bpe * self.stream)
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


def pipeline_step_seconds(cfg, p: int, sizes: list[int], hw) -> dict:
    """{step_s, compute_s, comm_s} of one --pp step on S stages x p data-parallel ranks: the slowest
    dp index's pipeline chain (steptime.step_time) -- the step ends with the slowest rank."""
    from .hardware import group_link

    S, sched = cfg.pp, cfg.schedule
    Vs = cfg.virtual_stages if sched == "interleaved" else 1
    prec = PRECISIONS[precision_of(cfg)]
    C = n_chunks(sched, S, Vs)
    counts = cfg.stage_layers or balanced_counts(sizes, C)
    bounds = [(sum(counts[:k]), sum(counts[: k + 1])) for k in range(C)]
    spec = SimpleNamespace(
        pp=S, dp=p, tp=1, sp=False, world=p * S, batch=cfg.batch, grad_accum=cfg.grad_accum,
        microbatches_used=cfg.microbatches, virtual_stages=Vs, schedule=sched, overlap=cfg.overlap,
        prec=prec, widths=[cfg.seq_len * cfg.hidden] * (len(sizes) + 1),
    )  # fmt: skip
    links = {g: group_link(hw, g, p, 1, S) for g in ("dp", "pp")}
    _, stream, _ = clock_rates(hw, precision_of(cfg), min(p * S, hw.devices_per_node))
    best = None
    for d in range(p):
        stages = {}
        for s in range(S):
            mine = stage_chunks(sched, S, Vs, s)
            opt_s = optimizer_seconds(cfg, sum(sum(sizes[slice(*bounds[c])]) for c in mine), prec.act, stream)
            costs = {c: GptChunkCosts(cfg, spec, hw, links, bounds[c], sizes, opt_s) for c in mine}
            stages[s] = (costs, d, {c: sizes[slice(*bounds[c])] for c in mine})
        timed = step_time(spec, hw, links, stages, 0.0, [0.0] * S)
        if best is None or timed["makespan"] > best["makespan"]:
            best = timed
    parts = best["parts"]
    return {
        "step_s": best["makespan"],
        "compute_s": parts["compute"],
        "comm_s": parts["pp"] + parts["dp"],
        "bubble_s": parts["bubble"],
    }
