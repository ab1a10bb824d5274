"""The step time of the MoE transformer (--arch gpt --experts E --ep P --dp D, with --cp C or --tp T) in
closed form, as the simulated clock (--clock sim) charges it: model/moe_charges.py's charges and
gpt_time.py's embedding, head, loss, tp collectives and optimizer, written again (nothing here imports
the model or the runtime), with every rank followed through every all-to-all round, cp hop and
all-reduce round (moe_rounds.py, cp_hop_time.py).

The routing decides the work: with kept[d][e] the assignments of dp rank d (with --cp: of rank (d, c))
that expert e keeps (per block and micro-step: the run's routing histograms, gpt_moe.kept_per_micro_step
or cp_moe.micro_kept; without them balanced routing, n K / E each), a rank with n tokens, A = sum_e
kept[d][e] kept assignments and ep rank j of its group charges, per block,
  forward   [--cp: its cp group's hops] attention half (n; --tp: its share, then g's all-reduce),
            router n h E, gathering 2 A h; the dispatch all-to-all; each of its experts e on the
            r_e = sum_{q in group} kept[q][e] rows it received (none: skipped); the combine
            all-to-all; adding back 3 A h
  backward  gate gradients 4 A h; combine-grad all-to-all; its experts' backward; dispatch-grad
            all-to-all; adding dx back 3 A h, the router's two matmuls, [--cp: the hops backward]
            the attention half's backward (--tp: f's all-reduce)
An all-to-all blocks on the ep group (the ranks of one cp and tp coordinate, consecutive dp ranks), so
imbalanced experts make ranks wait on one another round by round. A tp group's ranks do the same work
(the MoE part is replicated on them: parallel/expert_tensor_gpt.py), so its collectives cost each rank
gpt_time.tp_collectives' seconds. After backward the dense gradients (a tp rank's shards) are ring
all-reduced over dp (x cp), then each rank's experts over their replicas (edp, x cp), both followed
rank by rank from when each rank reaches them; then the optimizer. Each step starts together and ends
with its slowest rank; the metrics report the median step, and so does this.
"""

from __future__ import annotations

import numpy as np

from .chunktime import collective_gamma
from .collectives import chunk
from .gpt_time import clock_rates, optimizer_seconds, unit_seconds
from .moe_rounds import ALLTOALL_ENDS, members_link, ring_allreduce_ends
from .spec import precision_of, split

# model/moe_charges.py's memory-bound elements, written again (the cost model never imports the model)
ATTN_FWD_WHOLE, ATTN_FWD_SHARD, ATTN_FWD_SCORES = 24, 8, 6
ATTN_BWD_WHOLE, ATTN_BWD_SHARD, ATTN_BWD_SCORES = 25, 9, 4
EXPERT_FWD_ELEMS, EXPERT_BWD_ELEMS, ACCUMULATE = 18, 17, 3
PACK_ELEMS, COMBINE_ELEMS, GATE_GRAD_ELEMS, SCATTER_ELEMS = 2, 3, 4, 3


class Layout:
    """World rank w = (d C + c) T + k (pp = 1; --cp and --tp not together): its coordinates, its ep,
    cp, tp and gradient groups (dense: dp x cp at one tp index; experts: edp x cp), and their links."""

    def __init__(self, cfg, D: int, hw):
        C, T, P = getattr(cfg, "cp", 1), cfg.tp, cfg.ep
        self.D, self.C, self.T, self.P, self.W = D, C, T, P, D * C * T
        ranks = range(self.W)
        self.d = [w // (C * T) for w in ranks]
        self.c = [w // T % C for w in ranks]
        self.k = [w % T for w in ranks]
        place = lambda d, c, k: (d * C + c) * T + k  # noqa: E731
        self.ep = [
            [place(g + q, c, k) for q in range(P)] for c in range(C) for k in range(T) for g in range(0, D, P)
        ]
        self.cp = [[place(d, c, k) for c in range(C)] for d in range(D) for k in range(T)]
        self.dp = [[w for w in ranks if self.k[w] == k] for k in range(T)]
        self.edp = [
            [w for w in ranks if self.k[w] == k and self.d[w] % P == j] for j in range(P) for k in range(T)
        ]
        groups = {"ep": self.ep, "cp": self.cp, "dp": self.dp, "edp": self.edp, "tp": [list(range(T))]}
        self.links = {name: members_link(hw, members[0]) for name, members in groups.items()}


def moe_step_seconds(cfg, D: int, hw, micro: list, param_counts: tuple, bpe: int, grad_bpe: int) -> dict:
    """{step_s, compute_s, comm_s, steps_s}: the median step (module docstring) and its compute and the
    rest (all-to-all, all-reduce and waiting) of the slowest rank; `micro`: [(k, [kept per block])],
    step-major, kept[d][e] (gpt_moe.kept_per_micro_step) or with --cp C kept[c][d][e]
    (cp_moe.micro_kept); param_counts: (non-expert parameters of one rank -- its tp shards --, its
    experts)."""
    from .chunktime import seconds
    from .collectives import to_bytes
    from .cp_hop_time import attention_ends
    from .cp_time import ring_seconds, ulysses_seconds
    from .gpt_time import tp_collectives

    lay = Layout(cfg, D, hw)
    C, T, W, P = lay.C, lay.T, lay.W, lay.P
    if C == 1:
        micro = [(k, [[kept] for kept in blocks]) for k, blocks in micro]
    G, E, h, a, s, L, V = (
        cfg.grad_accum,
        cfg.experts,
        cfg.hidden,
        cfg.heads,
        cfg.seq_len,
        cfg.blocks,
        cfg.vocab,
    )
    per, keys = E // P, s if C == 1 else 0  # under --cp the scores are charged hop by hop (cp_hop_time)
    hl, al = h // T, a // T  # a tp rank's share of the attention (expert_tensor_gpt.py)
    rate, stream, overhead = clock_rates(hw, precision_of(cfg), min(W, hw.devices_per_node))
    exchange, gamma = ALLTOALL_ENDS[cfg.alltoall], collective_gamma(hw)
    dense_block = 4 * h * h // T + 3 * h // T + 5 * h + h * E  # its tp shard (gpt_moe_tp.dense_shard)
    expert_params, seqs = 8 * h * h + 5 * h, split(cfg.batch, G)
    edge = [V * h // T + s * h, 2 * h + h * V // T]  # the embedding's and head's (vocabulary) shards
    hops = ring_seconds if getattr(cfg, "cp_algo", "ring") == "ring" else ulysses_seconds

    def tp_secs(cost, elem_bytes, as_ring):  # gpt_time.tp_collectives' pricing, on the tp link
        return (
            seconds(to_bytes(cost, elem_bytes), lay.links["tp"], gamma, as_ring, False)
            if cost.messages
            else 0.0
        )

    def attention(n, backward):  # the attention half (model/moe_charges.charge_attention)
        flops = 2 * n * (3 * h * hl + hl * h + 2 * hl * keys) / rate
        if backward:
            elems = (ATTN_BWD_WHOLE * h + ATTN_BWD_SHARD * hl + ATTN_BWD_SCORES * al * keys) * n
            return 2 * flops + (elems + ACCUMULATE * dense_block) * bpe * stream
        elems = (ATTN_FWD_WHOLE * h + ATTN_FWD_SHARD * hl + ATTN_FWD_SCORES * al * keys) * n
        return flops + elems * bpe * stream + overhead

    def expert(r, backward):  # one expert on the r rows it received (none: skipped)
        if r == 0:
            return 0.0
        if backward:
            return (
                32 * r * h * h / rate + (EXPERT_BWD_ELEMS * r * h + ACCUMULATE * expert_params) * bpe * stream
            )
        return 16 * r * h * h / rate + EXPERT_FWD_ELEMS * r * h * bpe * stream

    steps, computes, optimizer_s = [], [], optimizer_seconds(cfg, sum(param_counts), bpe, stream)
    for first in range(0, len(micro), G):
        now, compute = [0.0] * W, [0.0] * W

        def charge(w, seconds):
            now[w] += seconds
            compute[w] += seconds

        def mine(kept, w):  # rank w's kept assignments per expert (its dp and cp coordinates')
            return kept[lay.c[w]][lay.d[w]]

        def all_to_all(kept, transpose: bool):  # every ep group, each rank from its own clock
            for group in lay.ep:
                rows = [[sum(mine(kept, w)[t * per : (t + 1) * per]) for t in range(P)] for w in group]
                rows = [list(col) for col in zip(*rows)] if transpose else rows
                for w, end in zip(group, exchange([now[w] for w in group], rows, h * bpe, lay.links["ep"])):
                    now[w] = end

        def cp_attention(b, backward):  # the hops of every cp group, each rank from its own clock
            for group in lay.cp if C > 1 else []:
                starts, link = [now[w] for w in group], lay.links["cp"]
                ends = attention_ends(
                    cfg.cp_algo, starts, b[group[0]], s // C, h, a, bpe, rate, stream, link, backward
                )
                for w, end in zip(group, ends):
                    now[w] = end

        for k, blocks in micro[first : first + G]:
            b = [chunk(seqs[k], D, lay.d[w]) for w in range(W)]  # the rank's sequences, s / C tokens each
            n = [b[w] * s // C for w in range(W)]
            units = [unit_seconds(cfg, n[w], edge, bpe, rate, stream, overhead) for w in range(W)]
            tp_c = [tp_collectives(cfg, n[w], lay.k[w], bpe, tp_secs) for w in range(W)]
            A = [[sum(mine(kept, w)) for w in range(W)] for kept in blocks]
            received = [
                [
                    [
                        sum(kept[lay.c[w]][lay.d[w] - lay.d[w] % P + q][e] for q in range(P))
                        for e in range(lay.d[w] % P * per, (lay.d[w] % P + 1) * per)
                    ]
                    for w in range(W)
                ]
                for kept in blocks
            ]
            for w in range(W):
                charge(w, units[w][0][0])
                now[w] += tp_c[w][0][0]  # the embedding's all-reduce over the vocabulary shards
                if C > 1:  # the hops' own compute, for the compute share (their time: cp_attention)
                    compute[w] += L * hops(b[w], s // C, h, a, C, bpe, rate, stream, lay.links["cp"])[2]
            for i, kept in enumerate(blocks):
                cp_attention(b, False)
                for w in range(W):
                    router = 2 * n[w] * h * E / rate
                    charge(w, attention(n[w], False) + router + PACK_ELEMS * A[i][w] * h * bpe * stream)
                    now[w] += tp_c[w][0][1] / 2  # attention's g (tp_collectives: 2 a dense block)
                all_to_all(kept, False)  # ep-dispatch
                for w in range(W):
                    charge(w, sum(expert(r, False) for r in received[i][w]))
                all_to_all(kept, True)  # ep-combine
                for w in range(W):
                    charge(w, COMBINE_ELEMS * A[i][w] * h * bpe * stream)
            for w in range(W):
                fwd, bwd, loss = units[w]
                charge(w, fwd[1] + loss + bwd[1])
                now[w] += tp_c[w][0][-1] + tp_c[w][2] + tp_c[w][1][-1]  # head, loss (vocab_parallel.py)
            for i, kept in reversed(list(enumerate(blocks))):
                for w in range(W):
                    charge(w, GATE_GRAD_ELEMS * A[i][w] * h * bpe * stream)
                all_to_all(kept, False)  # ep-combine-grad
                for w in range(W):
                    charge(w, sum(expert(r, True) for r in received[i][w]))
                all_to_all(kept, True)  # ep-dispatch-grad
                for w in range(W):
                    charge(w, SCATTER_ELEMS * A[i][w] * h * bpe * stream + 4 * n[w] * h * E / rate)
                cp_attention(b, True)
                for w in range(W):
                    charge(w, attention(n[w], True))
                    now[w] += tp_c[w][1][1] / 2  # attention's f, backward
            for w in range(W):
                charge(w, units[w][1][0])
                now[w] += tp_c[w][1][0]
        for groups, n_params in ((lay.dp, param_counts[0]), (lay.edp, param_counts[1])):
            for group in groups:  # dense shards over dp (x cp), then each expert's replicas
                link = lay.links["dp" if groups is lay.dp else "edp"]
                ends = ring_allreduce_ends(n_params, grad_bpe, [now[w] for w in group], link, gamma)
                for w, end in zip(group, ends):
                    now[w] = end
        steps.append(max(now) + optimizer_s)
        computes.append(max(compute) + optimizer_s)
    middle = int(np.argsort(steps)[len(steps) // 2]) if len(steps) % 2 else None
    step_s = float(np.median(steps))
    compute_s = computes[middle] if middle is not None else float(np.median(computes))
    return {"step_s": step_s, "compute_s": compute_s, "comm_s": step_s - compute_s, "steps_s": steps}
