"""The step time of `simpar train --arch gpt` (serial and --dp) in closed form, as the simulated clock
(--clock sim) charges it: what gpt.py's units, the loss and the optimizer charge, written again here
(nothing here imports the model or the runtime), and data parallelism's gradient buckets overlapping
the last backward (steptime.py's rule for the MLP: Li et al. 2020, sec. 3.2).

Per micro-step of R token rows (b sequences of s), width h, a heads, vocabulary V, bpe bytes per
activation; matmuls at the FLOP rate, memory-bound bytes at gamma/3 seconds per byte (hardware.py):
  embedding  forward 3Rh elements + a call; backward 4Rh
  block      forward 2R(4h^2 + 2sh + 8h^2) FLOPs, 50Rh + 6Ras elements + a call; backward twice the
             FLOPs, 51Rh + 4Ras elements + 3 per parameter (accumulating the gradients)
  head       forward 2RhV FLOPs, 8Rh elements + a call; backward 4RhV FLOPs, 10Rh + 3 per parameter
  loss       6RV elements (model/mlp.softmax_cross_entropy)
  optimizer  the backend's sweeps per parameter x its bytes (passes.py), once a step
A step: every micro-step's forward, loss and backward; in the last one each unit's gradients are
ready when its backward ends, and the buckets (in backward order) are all-reduced one after another
on the dp stream as soon as their units are ready (on a CPU profile, host_progress: when backward
ends); the rank waits for the last one, then runs the optimizer. The step ends with the slowest rank.
"""

from __future__ import annotations

from . import passes
from .chunktime import collective_gamma, seconds
from .collectives import ALLREDUCE, chunk, to_bytes
from .spec import dp_bucket_layers, split

BLOCK_FWD_ELEMS, BLOCK_FWD_SCORES, BLOCK_BWD_ELEMS, BLOCK_BWD_SCORES = 50, 6, 51, 4
EMBED_FWD_ELEMS, EMBED_BWD_ELEMS, HEAD_FWD_ELEMS, HEAD_BWD_ELEMS, ACCUMULATE, LOSS_ELEMS = 3, 4, 8, 10, 3, 6


def unit_seconds(cfg, R: int, sizes: list[int], bpe: int, rate: float, stream: float, overhead: float):
    """([forward seconds per unit], [backward seconds per unit], loss seconds) for R token rows."""
    h, a, s, V = cfg.hidden, cfg.heads, cfg.seq_len, cfg.vocab
    block_flops = 2 * R * (4 * h * h + 2 * s * h + 8 * h * h)
    fwd = [EMBED_FWD_ELEMS * R * h * bpe * stream + overhead]
    bwd = [EMBED_BWD_ELEMS * R * h * bpe * stream]
    for size in sizes[1:-1]:
        fwd.append(
            block_flops / rate
            + (BLOCK_FWD_ELEMS * R * h + BLOCK_FWD_SCORES * R * a * s) * bpe * stream
            + overhead
        )
        bwd.append(
            2 * block_flops / rate
            + (BLOCK_BWD_ELEMS * R * h + BLOCK_BWD_SCORES * R * a * s + ACCUMULATE * size) * bpe * stream
        )
    fwd.append(2 * R * h * V / rate + HEAD_FWD_ELEMS * R * h * bpe * stream + overhead)
    bwd.append(4 * R * h * V / rate + (HEAD_BWD_ELEMS * R * h + ACCUMULATE * sizes[-1]) * bpe * stream)
    return fwd, bwd, LOSS_ELEMS * R * V * bpe * stream


def step_seconds(cfg, p: int, sizes: list[int], hw, precision: str, bpe: int) -> dict:
    """{step_s, compute_s, comm_s} of a serial or --dp p step (no --zero, --tp or mixed precision)."""
    from .hardware import group_link

    on_node = min(p, hw.devices_per_node)
    rate = hw.flop_rate(precision) * hw.compute_share(on_node)
    stream = hw.gamma / 3 / hw.stream_share(on_node)
    overhead = hw.layer_overhead / hw.compute_share(on_node)
    link = group_link(hw, "dp", p, 1, 1)
    ring = cfg.collectives in ("ring", "auto")
    optimizer_s = (
        passes.optimizer_passes(passes.backend(cfg), cfg.optimizer, bool(cfg.momentum)) * sum(sizes) * bpe
    ) * stream
    ends, computes, comms = [], [], []
    for d in range(p):
        t = compute = comm = 0.0
        micro = split(cfg.batch, cfg.grad_accum)
        for k, k_rows in enumerate(micro):
            R = chunk(k_rows, p, d) * cfg.seq_len
            fwd, bwd, loss = unit_seconds(cfg, R, sizes, bpe, rate, stream, overhead)
            t += sum(fwd) + loss
            backward_start, ready = t, {}
            for i in reversed(range(len(sizes))):
                t += bwd[i]
                ready[i] = t
            compute += sum(fwd) + loss + sum(bwd)
        end = backward_start
        if p > 1:  # the last micro-step's buckets, one after another on the dp stream
            for layers in dp_bucket_layers(sizes, bpe, cfg.bucket_mb):
                cost = ALLREDUCE[cfg.collectives](sum(sizes[i] for i in layers), p, d)
                secs = seconds(
                    to_bytes(cost, bpe), link, collective_gamma(hw), ring, cfg.collectives == "auto"
                )
                start = t if (hw.host_progress or not cfg.overlap) else max(ready[i] for i in layers)
                end = max(end, start) + secs
                comm += secs
        ends.append(max(t, end) + optimizer_s)
        computes.append(compute + optimizer_s)
        comms.append(comm)
    return {"step_s": max(ends), "compute_s": max(computes), "comm_s": max(comms)}
