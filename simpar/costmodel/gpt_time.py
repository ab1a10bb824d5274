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
  loss       6RV elements (model/mlp.softmax_cross_entropy), in float32 under mixed precision (the
             half logits are upcast first: model/precision.scaled_loss_grad)
  optimizer  the backend's sweeps per parameter x its bytes (passes.py), once a step; under
             --precision mixed-* the sweeps run over the float32 masters (4 bytes) and the casts add
             14 bytes per parameter (work.MIXED_CAST_BYTES: precision.py's check, unscale, round back)
A step: every micro-step's forward, loss and backward; in the last one each unit's gradients are
ready when its backward ends, and the buckets (in backward order) are all-reduced one after another
on the dp stream as soon as their units are ready (on a CPU profile, host_progress: when backward
ends), every dp rank followed through every bucket's rounds (rounds_time.py); the rank waits for the
last one, then runs the optimizer. The step ends with the slowest rank.
tp's collectives block: each rank's clock runs through them in order (tp_ops). Under --collectives
tree or ps they leave the group's ranks at different times, and the next one starts from there:
tp_group_time.py follows every rank of the group through each; the other algorithms leave them
together (tp's shapes divide), so each rank adds its own share.
--zero 1-3: gpt_zero_time.py (its collectives block); --pp: gpt_pipeline_time.py.
"""

from __future__ import annotations

from . import passes
from .chunktime import collective_gamma, seconds
from .collectives import ALLREDUCE, chunk, ring_allgather, ring_reduce_scatter, to_bytes
from .rounds_time import bucket_ends
from .spec import dp_bucket_layers, split
from .tp_group_time import group_ends
from .work import MIXED_CAST_BYTES

BLOCK_FWD_ELEMS, BLOCK_FWD_SCORES, BLOCK_BWD_ELEMS, BLOCK_BWD_SCORES = 50, 6, 51, 4
EMBED_FWD_ELEMS, EMBED_BWD_ELEMS, HEAD_FWD_ELEMS, HEAD_BWD_ELEMS, ACCUMULATE, LOSS_ELEMS = 3, 4, 8, 10, 3, 6


def unit_seconds(cfg, R: int, sizes: list[int], bpe: int, rate: float, stream: float, overhead: float):
    """([forward seconds per unit], [backward seconds per unit], loss seconds) of R token rows on one
    rank of a tp group of t = cfg.tp (1: serial; every sharded dimension / t, as tensor_gpt.py charges
    it; Rl = R / t rows outside the tensor-parallel regions under --sp)."""
    h, a, s, V, t = cfg.hidden, cfg.heads, cfg.seq_len, cfg.vocab, cfg.tp
    hl, Rl = h // t, (R // t if cfg.sp else R)
    block_flops = 2 * R * (4 * h * hl + 2 * s * hl + 8 * h * hl)
    fwd = [(R * h + 2 * Rl * h) * bpe * stream + overhead]
    bwd = [EMBED_BWD_ELEMS * R * h * bpe * stream]
    for size in sizes[1:-1]:
        elems = 26 * Rl * h + 24 * R * hl + BLOCK_FWD_SCORES * R * (a // t) * s
        fwd.append(block_flops / rate + elems * bpe * stream + overhead)
        elems = (
            24 * Rl * h + 2 * R * h + 25 * R * hl + BLOCK_BWD_SCORES * R * (a // t) * s + ACCUMULATE * size
        )
        bwd.append(2 * block_flops / rate + elems * bpe * stream)
    fwd.append(2 * R * h * (V // t) / rate + HEAD_FWD_ELEMS * Rl * h * bpe * stream + overhead)
    bwd.append(
        4 * R * h * (V // t) / rate + (HEAD_BWD_ELEMS * Rl * h + ACCUMULATE * sizes[-1]) * bpe * stream
    )
    return fwd, bwd, LOSS_ELEMS * R * (V // t) * loss_bpe(bpe) * stream


def loss_bpe(bpe: int) -> int:
    """Bytes per logit the loss works in: float32 under mixed precision (bpe 2), else the activations'."""
    return 4 if bpe == 2 else bpe


def optimizer_seconds(cfg, n: int, bpe: int, stream: float) -> float:
    """The optimizer's sweeps over the n parameters this rank updates (passes.py), and under mixed
    precision (bpe 2) over their float32 masters plus the casts (module docstring)."""
    sweeps = passes.optimizer_passes(passes.backend(cfg), cfg.optimizer, bool(cfg.momentum))
    per_param = sweeps * 4 + MIXED_CAST_BYTES if bpe == 2 else sweeps * bpe
    return per_param * n * stream


def clock_rates(hw, precision: str, on_node: int) -> tuple[float, float, float]:
    """(FLOP/s, seconds per memory-bound byte, seconds per layer call) of one rank with on_node ranks
    sharing its node (simclock.SimClock.matmul, stream, layer_call)."""
    rate = hw.flop_rate(precision) * hw.compute_share(on_node)
    return rate, hw.gamma / 3 / hw.stream_share(on_node), hw.layer_overhead / hw.compute_share(on_node)


def tp_ops(cfg, R: int, bpe: int) -> tuple[list, list, list]:
    """The blocking tp collectives of one micro-step of R token rows, in the order they run, per unit
    ([forward], [backward]: a list of ops each) and of the loss; an op is (kind, elements, bytes per
    element), kind "all-reduce" (the --collectives algorithm) or --sp's and the loss's ring "all-gather"
    and "reduce-scatter" (gpt_tp.py lists them; tensor_gpt.py's f, g and vocab_parallel.py's order)."""
    N, L = R * cfg.hidden, cfg.blocks
    ag, rs, ar = ("all-gather", N, bpe), ("reduce-scatter", N, bpe), ("all-reduce", N, bpe)
    if cfg.tp == 1:
        return [[]] * (L + 2), [[]] * (L + 2), []
    if cfg.sp:  # f-bar, g-bar: a block's attention and MLP each gather, then scatter, both ways
        fwd, bwd = [[rs]] + [[ag, rs, ag, rs]] * L + [[ag]], [[ag]] + [[ag, rs, ag, rs]] * L + [[rs]]
    else:
        fwd, bwd = [[ar]] + [[ar, ar]] * L + [[]], [[]] + [[ar, ar]] * L + [[ar]]
    loss = [("all-gather", cfg.tp * R, loss_bpe(bpe)), ("all-reduce", 2 * R, loss_bpe(bpe))]
    return fwd, bwd, loss


def sp_sync_ops(cfg, bpe: int) -> list:
    """--sp: each unit's LayerNorm gradients summed over tp after its last backward (none for the
    embedding; 4h per block, 2h for the head's LN_f)."""
    h = cfg.hidden
    return [[]] + [[("all-reduce", 4 * h, bpe)]] * cfg.blocks + [[("all-reduce", 2 * h, bpe)]]


def ops_seconds(cfg, ops: list, j: int, secs) -> float:
    """tp rank j's own seconds of `ops` (tp_ops), each priced alone by `secs(cost, bpe, ring)`."""
    out = 0.0
    for kind, n, elem_bytes in ops:
        if kind == "all-reduce":
            out += secs(
                ALLREDUCE[cfg.collectives](n, cfg.tp, j), elem_bytes, cfg.collectives in ("ring", "auto")
            )
        else:
            ring = ring_allgather if kind == "all-gather" else ring_reduce_scatter
            out += secs(ring(n, cfg.tp, j), elem_bytes, True)
    return out


def tp_collectives(cfg, R: int, j: int, bpe: int, secs) -> tuple[list, list, float]:
    """Seconds of the blocking tp collectives of tp rank j per unit ([forward], [backward]) and of the
    loss, `secs(cost, bpe, ring)` pricing one (tp_ops lists them)."""
    fwd, bwd, loss = tp_ops(cfg, R, bpe)
    return (
        [ops_seconds(cfg, u, j, secs) for u in fwd],
        [ops_seconds(cfg, u, j, secs) for u in bwd],
        (ops_seconds(cfg, loss, j, secs)),
    )


def step_seconds(cfg, p: int, sizes: list[int], hw, precision: str, bpe: int) -> dict:
    """{step_s, compute_s, comm_s} of a serial, --dp p and/or --tp [--sp] step (--zero:
    gpt_zero_time.py); `sizes`: one rank's units (its shards under --tp)."""
    from .hardware import group_link

    t = cfg.tp
    rate, stream, overhead = clock_rates(hw, precision, min(p * t, hw.devices_per_node))
    links = {g: group_link(hw, g, p, t, 1) for g in ("dp", "tp")}
    ring, nvls, gamma = cfg.collectives in ("ring", "auto"), cfg.collectives == "auto", collective_gamma(hw)

    def secs(cost, elem_bytes, as_ring, group="tp"):
        return (
            seconds(to_bytes(cost, elem_bytes), links[group], gamma, as_ring, nvls) if cost.messages else 0.0
        )

    # tree and ps leave a tp group's ranks at different times: follow each rank (tp_group_time.py)
    grouped, sync_ops = t > 1 and cfg.collectives in ("tree", "ps"), sp_sync_ops(cfg, bpe)

    def own(ops, j: int) -> float:
        return ops_seconds(cfg, ops, j, secs)

    def run(ops, clocks: list) -> list:  # every tp rank's clock through ops, one after another
        for op in ops:
            if grouped:
                clocks = group_ends(op, clocks, cfg.collectives, links["tp"], gamma)
            else:
                clocks = [c + own([op], j) for j, c in enumerate(clocks)]
        return clocks

    optimizer_s = optimizer_seconds(cfg, sum(sizes), bpe, stream)
    ends, computes, comms, before_dp = [], [], [], []
    buckets, starts = dp_bucket_layers(sizes, bpe, cfg.bucket_mb), {}  # starts: each rank's buckets'
    for d in range(p):
        clocks, compute, comm = [0.0] * t, 0.0, [0.0] * t
        ready: list = [{} for _ in range(t)]
        micro = split(cfg.batch, cfg.grad_accum)
        for k, k_rows in enumerate(micro):
            R = chunk(k_rows, p, d) * cfg.seq_len
            fwd, bwd, loss = unit_seconds(cfg, R, sizes, bpe, rate, stream, overhead)
            fwd_ops, bwd_ops, loss_ops = tp_ops(cfg, R, bpe)
            for i in range(len(sizes)):
                clocks = run(fwd_ops[i], [c + fwd[i] for c in clocks])
            clocks = run(loss_ops, [c + loss for c in clocks])
            backward_start, last = list(clocks), k == len(micro) - 1
            for i in reversed(range(len(sizes))):
                # --sp: each unit's LayerNorm gradients summed over tp right after its last backward
                ops = bwd_ops[i] + (sync_ops[i] if cfg.sp and last else [])
                clocks = run(ops, [c + bwd[i] for c in clocks])
                for j in range(t):
                    ready[j][i] = clocks[j]
            compute += sum(fwd) + loss + sum(bwd)
            every = [op for unit in fwd_ops + bwd_ops + [loss_ops] for op in unit]
            comm = [c + own(every, j) for j, c in enumerate(comm)]
        for j in range(t):
            rank, clock = d * t + j, clocks[j]
            comm[j] += own([op for unit in sync_ops for op in unit], j) if cfg.sp else 0.0
            before_dp.append((clock, compute, comm[j]))  # before dp's traffic (zero_mesh_time.py)
            end, starts[rank] = backward_start[j], []
            if p > 1:  # the last micro-step's buckets, one after another on the dp stream
                for layers in buckets:
                    cost = ALLREDUCE[cfg.collectives](sum(sizes[i] for i in layers), p, d)
                    dp_s = secs(cost, bpe, ring, "dp")
                    start = (
                        clock if (hw.host_progress or not cfg.overlap) else max(ready[j][i] for i in layers)
                    )
                    starts[rank].append(start)
                    end = max(end, start) + dp_s
                    comm[j] += dp_s
            ends.append(max(clock, end) + optimizer_s)
            computes.append(compute + optimizer_s)
            comms.append(comm[j])
    if p > 1 and cfg.collectives != "mpi":  # every dp rank through every bucket's rounds (rounds_time.py):
        # a ps bucket queues at the server behind the last; a tree on p = 3 ends its ranks apart
        elems = [sum(sizes[i] for i in layers) for layers in buckets]
        for j in range(t):  # the dp group of tp index j: ranks d t + j (ps: the server d = 0)
            starts_j = [starts[d * t + j] for d in range(p)]
            done = bucket_ends(cfg.collectives, starts_j, elems, bpe, links["dp"], gamma)
            for d in range(p):
                ends[d * t + j] = max(before_dp[d * t + j][0], done[d]) + optimizer_s
    return {"step_s": max(ends), "compute_s": max(computes), "comm_s": max(comms), "before_dp": before_dp}
