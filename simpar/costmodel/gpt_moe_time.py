"""The step time of the MoE transformer (--arch gpt --experts E --ep P --dp D, with --cp C or --tp T) in
closed form, as the simulated clock (--clock sim) charges it: model/moe_charges.py's charges and
gpt_time.py's embedding, head, loss, tp collectives and optimizer, written again (nothing here imports
the model or the runtime), with every rank followed through every all-to-all round, cp hop and
all-reduce round (moe_rounds.py, cp_hop_time.py, allreduce_ends.py).

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
gpt_time.tp_collectives' seconds (where an all-reduce other than the ring leaves them apart, each tp
group is followed instead: moe_tp_rounds.py). After backward the dense gradients (a tp rank's shards) are
all-reduced over dp (x cp), then each rank's experts over their replicas (edp, x cp), both followed
rank by rank from when each rank reaches them, by --collectives' algorithm (allreduce_ends.py: the
ring's rounds, the tree's, Rabenseifner's, the server's queue; MPI's own closed form); then the
optimizer. Each step starts together and ends with its slowest rank; the metrics report the median
step, and so does this.
"""

from __future__ import annotations

import numpy as np

from .allreduce_ends import allreduce_ends
from .chunktime import collective_gamma
from .collectives import chunk
from .gpt_time import clock_rates, optimizer_seconds, unit_seconds
from .moe_rounds import ALLTOALL_ENDS, members_link
from .moe_tp_rounds import sp_sums, tp_sync
from .spec import precision_of, split

# model/moe_charges.py's memory-bound elements, written again (the cost model never imports the model)
ATTN_FWD_WHOLE, ATTN_FWD_SHARD, ATTN_FWD_SCORES = 24, 8, 6
ATTN_BWD_WHOLE, ATTN_BWD_BIAS, ATTN_BWD_SHARD, ATTN_BWD_SCORES = 24, 1, 9, 4
EXPERT_FWD_ELEMS, EXPERT_BWD_ELEMS, ACCUMULATE = 18, 17, 3
PACK_ELEMS, COMBINE_ELEMS, GATE_GRAD_ELEMS, SCATTER_ELEMS = 2, 3, 4, 3


class Layout:
    """World rank w = offset + (d C + c) T + k (--cp and --tp not together; offset: a pipeline stage's
    first rank): its coordinates, its ep, cp, tp and gradient groups (dense: dp x cp at one tp index;
    experts: edp x cp), as local indices, and their links (from the members' world ranks)."""

    def __init__(self, cfg, D: int, hw, offset: int = 0):
        C, T, P = getattr(cfg, "cp", 1), cfg.tp, cfg.ep
        self.D, self.C, self.T, self.P, self.W = D, C, T, P, D * C * T
        ranks = range(self.W)
        self.d, self.c, self.k = (
            [w // (C * T) for w in ranks],
            [w // T % C for w in ranks],
            [w % T for w in ranks],
        )
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
        self.links = {name: members_link(hw, [offset + w for w in g[0]]) for name, g in groups.items()}


class MoEWork:
    """What the ranks of one Layout charge for a micro-step's units lo..hi-1, forward or backward, each
    rank on its own clock (`now`, `compute`: lists over the Layout's ranks; the module docstring)."""

    def __init__(self, cfg, D: int, hw, bpe: int, world: int, offset: int = 0):
        from .chunktime import seconds
        from .collectives import to_bytes

        self.cfg, self.hw, self.bpe, self.lay = cfg, hw, bpe, Layout(cfg, D, hw, offset)
        C, T = self.lay.C, self.lay.T
        h, s, E, V = cfg.hidden, cfg.seq_len, cfg.experts, cfg.vocab
        self.keys = s if C == 1 else 0  # under --cp the scores are charged hop by hop (cp_hop_time)
        self.rate, self.stream, self.overhead = clock_rates(
            hw, precision_of(cfg), min(world, hw.devices_per_node)
        )
        self.exchange, self.gamma = ALLTOALL_ENDS[cfg.alltoall], collective_gamma(hw)
        # (kept's matrices' ids, group, transpose) -> (kept, rows): all_to_all; ("routed", ids): routed
        self.group_rows: dict = {}
        self.dense_block = (
            4 * h * h // T + 3 * h // T + 5 * h + h * E
        )  # its tp shard (gpt_moe_tp.dense_shard)
        self.edge = [V * h // T + s * h, 2 * h + h * V // T]  # the embedding's and head's (vocabulary) shards
        link, nvls = self.lay.links["tp"], cfg.collectives == "auto"
        self.tp_secs = lambda cost, eb, ring: (  # noqa: E731  gpt_time.tp_collectives' pricing, tp link
            seconds(to_bytes(cost, eb), link, self.gamma, ring, nvls) if cost.messages else 0.0
        )

    def tp_allreduce(self, n: int, k: int) -> float:
        """tp rank k's blocking all-reduce of n elements over tp, by --collectives' algorithm (NCCL's
        protocols for the ring and auto, alpha-beta for the rest: collective_timing's rule)."""
        from .collectives import ALLREDUCE

        cost = ALLREDUCE[self.cfg.collectives](n, self.lay.T, k)
        return self.tp_secs(cost, self.bpe, self.cfg.collectives in ("ring", "auto"))

    def micro_step(self, seqs: int, blocks: list) -> dict:
        """A micro-step of `seqs` global sequences and its kept[c][d][e] per block: what each rank does."""
        from .gpt_time import tp_collectives

        cfg, lay, W = self.cfg, self.lay, self.lay.W
        b = [chunk(seqs, lay.D, lay.d[w]) for w in range(W)]  # the rank's sequences, s / C tokens each
        n = [b[w] * cfg.seq_len // lay.C for w in range(W)]
        return {
            "b": b,
            "n": n,
            "units": [
                unit_seconds(cfg, n[w], self.edge, self.bpe, self.rate, self.stream, self.overhead)
                for w in range(W)
            ],
            "tp": [tp_collectives(cfg, n[w], lay.k[w], self.bpe, self.tp_secs) for w in range(W)],
            "tp_block": [self.tp_block(n[w], lay.k[w]) for w in range(W)],
            "kept": blocks,
            "routed": {},  # block index -> (A, received), filled as the blocks run (routed())
        }

    def routed(self, ms: dict, i: int) -> tuple[list, list]:
        """Block i's (kept assignments of each rank, rows each of its experts received from its group),
        once per kept matrices (self.group_rows' rule: a balanced router gives every block the same)."""
        key = ("routed", tuple(map(id, ms["kept"][i])))
        if i not in ms["routed"] and key in self.group_rows:
            ms["routed"][i] = self.group_rows[key][1]
        if i not in ms["routed"]:
            lay, kept, P = self.lay, ms["kept"][i], self.lay.P
            per = self.cfg.experts // P

            def received(w):
                d, j = lay.d[w], lay.d[w] % P
                rows = kept[lay.c[w]]
                return [sum(rows[d - j + q][e] for q in range(P)) for e in range(j * per, (j + 1) * per)]

            A = [sum(kept[lay.c[w]][lay.d[w]]) for w in range(lay.W)]
            ms["routed"][i] = (A, [received(w) for w in range(lay.W)])
            self.group_rows[key] = (kept, ms["routed"][i])
        return ms["routed"][i]

    def tp_block(self, R: int, k: int) -> float:
        """A MoE block's blocking tp collectives, each way, on tp rank k: attention's all-reduce (its g
        forward, its f backward); under --sp its f and g as all-gather and reduce-scatter plus the MoE
        part's all-gather of every row (LN2's output forward, dL/dm backward: expert_tensor_gpt.py)."""
        from .collectives import ring_allgather, ring_reduce_scatter

        T, N = self.lay.T, R * self.cfg.hidden
        if T == 1:
            return 0.0
        if not self.cfg.sp:
            return self.tp_allreduce(N, k)
        ag, rs = ring_allgather(N, T, k), ring_reduce_scatter(N, T, k)
        return 2 * self.tp_secs(ag, self.bpe, True) + self.tp_secs(rs, self.bpe, True)

    def sp_sync(self, now) -> None:
        """--sp, once a step after backward: each block's LayerNorm gradients (4h) and the head's (2h)
        summed over tp, one blocking all-reduce each (moe_tp_rounds.sp_sums)."""
        sp_sums(self, now, 0, self.cfg.blocks + 2)

    def attention(self, n, backward):  # the attention half (model/moe_charges.charge_attention)
        h, a, T, keys, r, bpe = self.cfg.hidden, self.cfg.heads, self.lay.T, self.keys, self.rate, self.bpe
        hl, al = h // T, a // T
        whole = n // T if self.cfg.sp else n  # --sp: LayerNorms and residuals on the rank's row shard
        flops = 2 * n * (3 * h * hl + hl * h + 2 * hl * keys) / r
        if backward:
            elems = (
                ATTN_BWD_WHOLE * h * whole
                + (ATTN_BWD_BIAS * h + ATTN_BWD_SHARD * hl + ATTN_BWD_SCORES * al * keys) * n
            )
            return 2 * flops + (elems + ACCUMULATE * self.dense_block) * bpe * self.stream
        elems = ATTN_FWD_WHOLE * h * whole + (ATTN_FWD_SHARD * hl + ATTN_FWD_SCORES * al * keys) * n
        return flops + elems * bpe * self.stream + self.overhead

    def expert(self, rows, backward):  # one expert on the rows it received (none: skipped)
        h, r, m = self.cfg.hidden, self.rate, self.bpe * self.stream
        if rows == 0:
            return 0.0
        if backward:
            return (
                32 * rows * h * h / r + (EXPERT_BWD_ELEMS * rows * h + ACCUMULATE * (8 * h * h + 5 * h)) * m
            )
        return 16 * rows * h * h / r + EXPERT_FWD_ELEMS * rows * h * m

    def all_to_all(self, now, kept, transpose: bool):  # every ep group, each rank from its own clock
        lay, per, h = self.lay, self.cfg.experts // self.lay.P, self.cfg.hidden
        for g, group in enumerate(lay.ep):
            # a group's rows once per kept matrices (a balanced router gives every block the same); the
            # memo holds them, so their ids name no others while it lives
            key = (tuple(map(id, kept)), g, transpose)
            if key not in self.group_rows:
                rows = [
                    [sum(kept[lay.c[w]][lay.d[w]][t * per : (t + 1) * per]) for t in range(lay.P)]
                    for w in group
                ]
                rows = [list(col) for col in zip(*rows)] if transpose else rows
                self.group_rows[key] = (kept, rows)
            rows = self.group_rows[key][1]
            for w, end in zip(
                group, self.exchange([now[w] for w in group], rows, h * self.bpe, lay.links["ep"])
            ):
                now[w] = end

    def cp_attention(self, now, b, backward):  # the hops of every cp group, each rank from its own clock
        from .cp_hop_time import attention_ends

        cfg, C = self.cfg, self.lay.C
        for group in self.lay.cp if C > 1 else []:
            T = self.lay.T  # --tp: the ring carries the rank's a/T heads, h/T of the width (cp_time.py)
            args = (
                b[group[0]],
                cfg.seq_len // C,
                cfg.hidden // T,
                cfg.heads // T,
                self.bpe,
                self.rate,
                self.stream,
            )
            ends = attention_ends(cfg.cp_algo, [now[w] for w in group], *args, self.lay.links["cp"], backward)
            for w, end in zip(group, ends):
                now[w] = end

    def forward(self, now, compute, ms, lo: int, hi: int, loss: bool = True) -> None:
        """Units lo..hi-1 forward (the head's chunk: the loss too, unless `loss` is False: --recompute
        full's second forward), every rank of the Layout."""
        from .cp_time import ring_seconds, ulysses_seconds

        cfg, W, L, C = self.cfg, self.lay.W, self.cfg.blocks, self.lay.C
        h, E, m = cfg.hidden, cfg.experts, self.bpe * self.stream
        hops = ring_seconds if getattr(cfg, "cp_algo", "ring") == "ring" else ulysses_seconds

        def charge(w, seconds):
            now[w] += seconds
            compute[w] += seconds

        for u in range(lo, hi):
            if u == 0:
                for w in range(W):
                    charge(w, ms["units"][w][0][0])
                tp_sync(self, now, ms, "embed-forward")  # the all-reduce over the vocabulary shards
                continue
            if u == L + 1:
                for w in range(W):
                    fwd, _, loss_s = ms["units"][w]
                    charge(w, fwd[1] + (loss_s if loss else 0.0))
                # the head's all-reduce and the loss's (vocab_parallel.py)
                tp_sync(self, now, ms, "head-forward-loss" if loss else "head-forward")
                continue
            i, kept = u - 1, ms["kept"][u - 1]
            A, received = self.routed(ms, i)
            self.cp_attention(now, ms["b"], False)
            for w in range(W):
                n = ms["n"][w]
                if C > 1:  # the hops' own compute, for the compute share (their time: cp_attention)
                    compute[w] += hops(
                        ms["b"][w],
                        cfg.seq_len // C,
                        h // self.lay.T,
                        cfg.heads // self.lay.T,
                        C,
                        self.bpe,
                        self.rate,
                        self.stream,
                        self.lay.links["cp"],
                    )[2]
                charge(
                    w,
                    self.attention(n, False) + 2 * n * h * E / self.rate + PACK_ELEMS * A[w] * h * m,
                )
            tp_sync(self, now, ms, "block")  # attention's g (--sp: f, g and the MoE part's gather)
            self.all_to_all(now, kept, False)  # ep-dispatch
            for w in range(W):
                charge(w, sum(self.expert(r, False) for r in received[w]))
            self.all_to_all(now, kept, True)  # ep-combine
            for w in range(W):
                charge(w, COMBINE_ELEMS * A[w] * h * m)

    def backward(self, now, compute, ms, lo: int, hi: int) -> None:
        """Units hi-1..lo backward, every rank of the Layout."""
        cfg, W, L = self.cfg, self.lay.W, self.cfg.blocks
        h, E, m = cfg.hidden, cfg.experts, self.bpe * self.stream

        def charge(w, seconds):
            now[w] += seconds
            compute[w] += seconds

        for u in reversed(range(lo, hi)):
            if u in (0, L + 1):  # the embedding's backward (no collective), the head's (its f)
                for w in range(W):
                    charge(w, ms["units"][w][1][0 if u == 0 else 1])
                tp_sync(self, now, ms, "embed-backward" if u == 0 else "head-backward")
                continue
            i, kept = u - 1, ms["kept"][u - 1]
            A, received = self.routed(ms, i)
            for w in range(W):
                charge(w, GATE_GRAD_ELEMS * A[w] * h * m)
            self.all_to_all(now, kept, False)  # ep-combine-grad
            for w in range(W):
                charge(w, sum(self.expert(r, True) for r in received[w]))
            self.all_to_all(now, kept, True)  # ep-dispatch-grad
            for w in range(W):
                charge(w, SCATTER_ELEMS * A[w] * h * m + 4 * ms["n"][w] * h * E / self.rate)
            self.cp_attention(now, ms["b"], True)
            for w in range(W):
                charge(w, self.attention(ms["n"][w], True))
            tp_sync(self, now, ms, "block")  # attention's f, backward (--sp: and dL/dm's gather)

    def allreduce(self, now, n_params: int, grad_bpe: int, experts: bool) -> None:
        """One blocking all-reduce (--collectives' algorithm, allreduce_ends.py) on every dense (dp x cp)
        or expert (edp x cp) group."""
        lay = self.lay
        groups, link = (lay.edp, lay.links["edp"]) if experts else (lay.dp, lay.links["dp"])
        for group in groups:
            starts = [now[w] for w in group]
            ends = allreduce_ends(self.cfg.collectives, n_params, grad_bpe, starts, link, self.gamma)
            for w, end in zip(group, ends):
                now[w] = end


def median_step(steps: list, computes: list) -> dict:
    """The metrics' figure: the median step over steps (and the compute of that step)."""
    middle = int(np.argsort(steps)[len(steps) // 2]) if len(steps) % 2 else None
    step_s = float(np.median(steps))
    compute_s = computes[middle] if middle is not None else float(np.median(computes))
    return {"step_s": step_s, "compute_s": compute_s, "comm_s": step_s - compute_s, "steps_s": steps}


def moe_step_seconds(cfg, D: int, hw, micro: list, param_counts: tuple, bpe: int, grad_bpe: int) -> dict:
    """{step_s, compute_s, comm_s, steps_s}: the median step (module docstring) and its compute and the
    rest (all-to-all, all-reduce and waiting) of the slowest rank; `micro`: [(k, [kept per block])],
    step-major, kept[d][e] (gpt_moe.kept_per_micro_step) or with --cp C kept[c][d][e]
    (cp_moe.micro_kept); param_counts: (non-expert parameters of one rank -- its tp shards --, its
    experts)."""
    C = getattr(cfg, "cp", 1)
    if C == 1:
        micro = [(k, [[kept] for kept in blocks]) for k, blocks in micro]
    work = MoEWork(cfg, D, hw, bpe, D * C * cfg.tp)
    G, W, seqs = cfg.grad_accum, work.lay.W, split(cfg.batch, cfg.grad_accum)
    steps, computes = [], []
    optimizer_s = optimizer_seconds(cfg, sum(param_counts), bpe, work.stream)
    for first in range(0, len(micro), G):
        now, compute = [0.0] * W, [0.0] * W
        for k, blocks in micro[first : first + G]:
            ms = work.micro_step(seqs[k], blocks)
            work.forward(now, compute, ms, 0, cfg.blocks + 2)
            work.backward(now, compute, ms, 0, cfg.blocks + 2)
        work.sp_sync(now)  # --sp: the LayerNorms' row-shard gradients over tp
        work.allreduce(now, param_counts[0], grad_bpe, False)  # dense shards over dp (x cp)
        work.allreduce(now, param_counts[1], grad_bpe, True)  # then each expert's replicas
        steps.append(max(now) + optimizer_s)
        computes.append(max(compute) + optimizer_s)
    return median_step(steps, computes)
