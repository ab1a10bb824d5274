"""The step time of the MoE transformer with ep inside dp (--arch gpt --experts E --ep P --dp D) in
closed form, as the simulated clock (--clock sim) charges it: model/moe_charges.py's charges and
gpt_time.py's embedding, head, loss and optimizer, written again (nothing here imports the model or
the runtime), with every rank followed through every all-to-all and all-reduce round.

The routing decides the work: with kept[s][e] the assignments of dp rank s that expert e keeps (per
block and micro-step: the run's routing histograms, costmodel/gpt_moe.kept_per_micro_step; without
them balanced routing, n_s K / E each), rank d (ep rank j of the group starting at g = d - j) with
n_d tokens and A_d = sum_e kept[d][e] kept assignments charges, per block,
  forward   attention half (n_d), router n_d h E, gathering 2 A_d h; the dispatch all-to-all; each of
            its experts e on the r_e = sum_{q in group} kept[q][e] rows it received (none: skipped);
            the combine all-to-all; adding back 3 A_d h
  backward  gate gradients 4 A_d h; combine-grad all-to-all; its experts' backward; dispatch-grad
            all-to-all; adding dx back 3 A_d h, the router's two matmuls, the attention half's backward
An all-to-all blocks on the ep group's stream. Pairwise (collectives/alltoall.py): in round r = 1..P-1
ep rank q sends its piece to q + r and receives from q - r; a round ends when its own message has left
(start + bytes / bw) and its peer's has arrived (the peer's round start + bytes / bw + alpha), so
imbalanced experts make ranks wait on one another round by round. Bruck (collectives/bruck.py): the
same recurrence over its ceil(log2 P) rounds, each rank forwarding the pieces it holds. Messages take
the ep group's link as the clock gives them (hardware.group_link of P consecutive ranks, no NCCL
protocol: the all-to-all is point-to-point). At the end of the step the non-expert gradients are
ring all-reduced over the D dp ranks, then each rank's experts' over its D/P expert-data-parallel
ranks (stride P): both rings followed rank by rank from when each rank reaches them (ring_time.py's
rule, both halves in one call, NCCL's protocol chosen once per call on GPU profiles), then the
optimizer. Each step starts together and ends with its slowest rank; the metrics report the median
step, and so does this.
"""

from __future__ import annotations

import numpy as np

from .chunktime import collective_gamma
from .collectives import chunk
from .gpt_time import clock_rates, optimizer_seconds, unit_seconds
from .spec import precision_of, split

# model/moe_charges.py's memory-bound elements, written again (the cost model never imports the model)
ATTN_FWD_ELEMS, ATTN_FWD_SCORES, ATTN_BWD_ELEMS, ATTN_BWD_SCORES = 32, 6, 34, 4
EXPERT_FWD_ELEMS, EXPERT_BWD_ELEMS, ACCUMULATE = 18, 17, 3
PACK_ELEMS, COMBINE_ELEMS, GATE_GRAD_ELEMS, SCATTER_ELEMS = 2, 3, 4, 3


def pairwise_ends(starts: list, rows: list, row_bytes: int, link) -> list:
    """When each of P ranks ends a pairwise all-to-all started at starts[q]; rows[a][b]: rows a sends b."""
    P, t = len(starts), list(starts)
    for r in range(1, P):
        t = [
            max(
                t[q] + rows[q][(q + r) % P] * row_bytes / link.bw,
                t[(q - r) % P] + rows[(q - r) % P][q] * row_bytes / link.bw + link.alpha,
            )
            for q in range(P)
        ]
    return t


def bruck_ends(starts: list, rows: list, row_bytes: int, link) -> list:
    """The same for Bruck's all-to-all: in round k rank q sends q + 2^k, in one message, the pieces
    it holds at positions j with bit k set (collectives/bruck.py; their sizes followed round by round)."""
    P, t = len(starts), list(starts)
    held = [[rows[q][(q + j) % P] for j in range(P)] for q in range(P)]
    for k in range((P - 1).bit_length()):
        hop = 1 << k
        moving = [j for j in range(1, P) if j & hop]
        out = [sum(held[q][j] for j in moving) * row_bytes for q in range(P)]
        t = [
            max(t[q] + out[q] / link.bw, t[(q - hop) % P] + out[(q - hop) % P] / link.bw + link.alpha)
            for q in range(P)
        ]
        held = [[held[(q - hop) % P][j] if j in moving else held[q][j] for j in range(P)] for q in range(P)]
    return t


ALLTOALL_ENDS = {"pairwise": pairwise_ends, "bruck": bruck_ends}


def ring_allreduce_ends(n: int, bpe: int, starts: list, link, gamma: float) -> list:
    """When each of p ranks ends a blocking ring all-reduce (reduce-scatter then all-gather, one call:
    collectives/ring.py) of n elements started at starts[r]; ring_time.ring_ends' round rule."""
    p = len(starts)
    if p == 1:
        return list(starts)
    sizes = np.array([chunk(n, p, i) * bpe for i in range(p)], dtype=float)
    alpha, bw, cursor = link.alpha, link.bw, np.array(starts, dtype=float)
    tuning = getattr(link, "tuning", None)
    if tuning is not None and tuning.proto:  # NCCL's protocol for this call (simclock.collective_timing)
        timing = tuning.choose("all-reduce", -(-n // p) * bpe, nvls=False)
        alpha, bw, cursor = timing.hop, timing.bw, cursor + timing.base
    ranks = np.arange(p)
    for scatter in (True, False):
        for k in range(p - 1):
            sent = (ranks - k - 1) % p if scatter else (ranks - k) % p
            left = cursor + sizes[sent] / bw
            cursor = np.maximum(left, np.roll(left + alpha, 1))
            if scatter:
                cursor = cursor + sizes[np.roll(sent, 1)] * gamma
    return cursor.tolist()


def moe_step_seconds(cfg, D: int, hw, micro: list, param_counts: tuple, bpe: int, grad_bpe: int) -> dict:
    """{step_s, compute_s, comm_s, steps_s}: the median step (module docstring) and its compute and the
    rest (all-to-all, all-reduce and waiting) of the slowest rank; `micro`: kept_per_micro_step's
    [(k, [kept D x E per block])], step-major; param_counts: (non-expert M, one rank's experts)."""
    from .hardware import group_link

    P, G, E, h, a, s = cfg.ep, cfg.grad_accum, cfg.experts, cfg.hidden, cfg.heads, cfg.seq_len
    per, L, V = E // P, cfg.blocks, cfg.vocab
    rate, stream, overhead = clock_rates(hw, precision_of(cfg), min(D, hw.devices_per_node))
    ep_link = group_link(hw, "tp", D // P, P, 1)  # P consecutive ranks
    dp_link, edp_link = group_link(hw, "dp", D, 1, 1), group_link(hw, "dp", D // P, P, 1)
    exchange, gamma = ALLTOALL_ENDS[cfg.alltoall], collective_gamma(hw)
    dense_block = 4 * h * h + 8 * h + h * E
    expert_params = 8 * h * h + 5 * h
    seqs = split(cfg.batch, G)

    def attention(n, backward):
        flops = 2 * n * (4 * h * h + 2 * s * h) / rate
        if backward:
            elems = ATTN_BWD_ELEMS * n * h + ATTN_BWD_SCORES * n * a * s + ACCUMULATE * dense_block
            return 2 * flops + elems * bpe * stream
        return flops + (ATTN_FWD_ELEMS * n * h + ATTN_FWD_SCORES * n * a * s) * bpe * stream + overhead

    def expert(r, backward):
        if r == 0:
            return 0.0
        if backward:
            return (
                32 * r * h * h / rate + (EXPERT_BWD_ELEMS * r * h + ACCUMULATE * expert_params) * bpe * stream
            )
        return 16 * r * h * h / rate + EXPERT_FWD_ELEMS * r * h * bpe * stream

    def all_to_all(now, rows_of_group):
        for g in range(0, D, P):
            ends = exchange(now[g : g + P], rows_of_group(g), h * bpe, ep_link)
            now[g : g + P] = ends

    steps, computes, optimizer_s = [], [], optimizer_seconds(cfg, sum(param_counts), bpe, stream)
    for first in range(0, len(micro), G):
        now, compute = [0.0] * D, [0.0] * D

        def charge(d, seconds):
            now[d] += seconds
            compute[d] += seconds

        for k, blocks in micro[first : first + G]:
            n = [chunk(seqs[k], D, d) * s for d in range(D)]
            units = [
                unit_seconds(cfg, n[d], [(V + s) * h, 2 * h + h * V], bpe, rate, stream, overhead)
                for d in range(D)
            ]
            A = [[sum(kept[d]) for d in range(D)] for kept in blocks]
            dispatch = [
                lambda g, kept=kept: [
                    [sum(kept[g + q][t * per : (t + 1) * per]) for t in range(P)] for q in range(P)
                ]
                for kept in blocks
            ]
            combine = [lambda g, f=f: [list(col) for col in zip(*f(g))] for f in dispatch]
            received = [
                [
                    [
                        sum(kept[d - d % P + q][e] for q in range(P))
                        for e in range(d % P * per, (d % P + 1) * per)
                    ]
                    for d in range(D)
                ]
                for kept in blocks
            ]
            for d in range(D):
                charge(d, units[d][0][0])
            for b in range(L):
                for d in range(D):
                    charge(
                        d,
                        attention(n[d], False)
                        + 2 * n[d] * h * E / rate
                        + PACK_ELEMS * A[b][d] * h * bpe * stream,
                    )
                all_to_all(now, dispatch[b])
                for d in range(D):
                    charge(d, sum(expert(r, False) for r in received[b][d]))
                all_to_all(now, combine[b])
                for d in range(D):
                    charge(d, COMBINE_ELEMS * A[b][d] * h * bpe * stream)
            for d in range(D):
                fwd, bwd, loss = units[d]
                charge(d, fwd[1] + loss + bwd[1])
            for b in reversed(range(L)):
                for d in range(D):
                    charge(d, GATE_GRAD_ELEMS * A[b][d] * h * bpe * stream)
                all_to_all(now, dispatch[b])
                for d in range(D):
                    charge(d, sum(expert(r, True) for r in received[b][d]))
                all_to_all(now, combine[b])
                for d in range(D):
                    router = 4 * n[d] * h * E / rate
                    charge(d, SCATTER_ELEMS * A[b][d] * h * bpe * stream + router + attention(n[d], True))
            for d in range(D):
                charge(d, units[d][1][0])
        now = ring_allreduce_ends(param_counts[0], grad_bpe, now, dp_link, gamma)
        for j in range(P):  # each expert-data-parallel group: ranks j, j + P, ...
            now[j::P] = ring_allreduce_ends(param_counts[1], grad_bpe, now[j::P], edp_link, gamma)
        steps.append(max(now) + optimizer_s)
        computes.append(max(compute) + optimizer_s)
    middle = int(np.argsort(steps)[len(steps) // 2]) if len(steps) % 2 else None
    step_s = float(np.median(steps))
    compute_s = computes[middle] if middle is not None else float(np.median(computes))
    return {"step_s": step_s, "compute_s": compute_s, "comm_s": step_s - compute_s, "steps_s": steps}
