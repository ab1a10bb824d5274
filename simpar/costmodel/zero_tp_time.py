"""The step time of --arch gpt --tp T --dp D [--cp C] --zero 2|3 [--sp] in closed form, as the simulated
clock charges parallel/zero_tp.py's step (written again; nothing imported from parallel/).

gpt_zero_time.py's stages 2 and 3 (ZeRO's blocking rings on the dp group where the algorithm runs them:
Rajbhandari et al. 2020, sec. 7) on each tp rank's shares n_u of the units, with what tensor parallelism
adds to every unit (gpt_time.py: its matmuls' sharded dimension / T, and tp_collectives' blocking f, g
and vocabulary collectives, the loss's two):

  per micro-step   for each unit: (stage 3) all-gather n_u, then its forward and tp collectives;
                   the loss and its tp collectives; for each unit backwards: (stage 3) all-gather n_u,
                   its backward and tp collectives, then -- on the last micro-step (stage 2) or on
                   every one (stage 3) -- under --sp its LayerNorms' sum over tp, and the
                   reduce-scatter of n_u
  after them       the optimizer on this rank's chunks (sum_u chunk(n_u, D, d)); stage 2 all-gathers
                   every unit's n_u

The p ranks of one tp index's sharding group (dp, or dp x cp: p = D C, g = d C + c) are followed
together through every ring round (ring_time.ring_ends): uneven chunks and uneven rows let their clocks
drift apart as the clock's do. The T tp ranks of a group place hold equal shares and rows, so they reach
each tp collective together and each is priced as it alone (gpt_time.step_seconds' rule). The step ends
with the slowest rank.

--cp C (cp_zero_time.py's rule, with a rank's a/T heads and h/T of the width): the units run on the
rank's R = b n rows (n = s/C) without score work, and each block's attention, forward and backward, is
cp_hop_time.attention_ends over its cp group's clocks at the block's start (the work before it inside
the block is the same on every rank of the cp group: the same rows and tp index).
"""

from __future__ import annotations

from types import SimpleNamespace

from .chunktime import collective_gamma, seconds
from .collectives import ALLREDUCE, chunk, to_bytes
from .cp_hop_time import attention_ends
from .cp_time import ring_seconds, ulysses_seconds
from .gpt_time import clock_rates, optimizer_seconds, tp_collectives, unit_seconds
from .gpt_tp import local_unit_sizes
from .ring_time import ring_ends
from .spec import PRECISIONS, precision_of, split


def zero_tp_seconds(cfg, dp: int, hw) -> dict:
    """{step_s, compute_s, comm_s} of a --zero 2|3 --tp step on dp ranks (x cp; module docstring)."""
    from .hardware import group_link

    T, C, stage, precision = cfg.tp, getattr(cfg, "cp", 1), cfg.zero, precision_of(cfg)
    p, n, L = dp * C, cfg.seq_len // C, cfg.blocks
    prec = PRECISIONS[precision]
    bpe, sizes = prec.act, local_unit_sizes(cfg.blocks, cfg.hidden, cfg.seq_len, cfg.vocab, T)
    rate, stream, overhead = clock_rates(hw, precision, min(p * T, hw.devices_per_node))
    links = {g: group_link(hw, g, p, T, 1) for g in ("dp", "tp")}
    cp_link = group_link(hw, "dp", C, T, 1)
    shape = cfg  # --cp: the units without their score work (s = 0), as cp_time.py
    if C > 1:
        keys = ("hidden", "heads", "vocab", "tp", "sp", "blocks", "collectives")
        shape = SimpleNamespace(seq_len=0, **{k: getattr(cfg, k) for k in keys})
    attention = ring_seconds if getattr(cfg, "cp_algo", "ring") == "ring" else ulysses_seconds
    h, a = cfg.hidden // T, cfg.heads // T  # this rank's width and heads in the attention
    ring_tp, nvls = cfg.collectives in ("ring", "auto"), cfg.collectives == "auto"
    gamma = collective_gamma(hw)

    def secs(cost, elem_bytes, as_ring, group="tp"):
        if not cost.messages:
            return 0.0
        return seconds(to_bytes(cost, elem_bytes), links[group], gamma, as_ring, nvls)

    micro = split(cfg.batch, cfg.grad_accum)
    steps, computes, comms = [], [], []
    for j in range(T):
        clock, link_free, compute = [0.0] * p, [0.0] * p, [0.0] * p
        sync = [0.0] * len(sizes)  # --sp: the LayerNorms' gradients summed over tp (gpt_time.py)
        if cfg.sp:
            block = secs(ALLREDUCE[cfg.collectives](4 * cfg.hidden, T, j), bpe, ring_tp)
            head = secs(ALLREDUCE[cfg.collectives](2 * cfg.hidden, T, j), bpe, ring_tp)
            sync = [0.0] + [block] * cfg.blocks + [head]

        def work(secs_of_rank: list[float], counted: list[float]) -> None:
            for g in range(p):
                clock[g] += secs_of_rank[g]
                compute[g] += counted[g]

        def ring(kind: str, count: int) -> None:  # blocking, over the sharding group of tp index j
            if p > 1:
                bytes_ = prec.grad if kind == "reduce-scatter" else prec.param
                clock[:] = ring_ends(kind, count, bytes_, clock, link_free, links["dp"], gamma)

        def attend(seqs: list[int], backward: bool) -> None:  # every cp group's block attention
            for d in range(dp if C > 1 else 0):  # cp group d: group places d C .. d C + C - 1
                group = slice(d * C, (d + 1) * C)
                clock[group] = attention_ends(
                    cfg.cp_algo, clock[group], seqs[d], n, h, a, bpe, rate, stream, cp_link, backward
                )

        for k, k_rows in enumerate(micro):
            seqs = [chunk(k_rows, dp, d) for d in range(dp)]  # a dp rank's sequences, on each cp rank
            rows = [seqs[g // C] * n for g in range(p)]
            units = [unit_seconds(shape, R, sizes, bpe, rate, stream, overhead) for R in rows]
            tps = [tp_collectives(shape, R, j, bpe, secs) for R in rows]
            last = k == len(micro) - 1
            for i, count in enumerate(sizes):
                if stage == 3:
                    ring("all-gather", count)
                if 0 < i <= L:
                    attend(seqs, backward=False)
                work([u[0][i] + c[0][i] for u, c in zip(units, tps)], [u[0][i] for u in units])
            work([u[2] + c[2] for u, c in zip(units, tps)], [u[2] for u in units])
            for i in reversed(range(len(sizes))):
                if stage == 3:
                    ring("all-gather", sizes[i])
                if 0 < i <= L:
                    attend(seqs, backward=True)
                work([u[1][i] + c[1][i] for u, c in zip(units, tps)], [u[1][i] for u in units])
                if stage == 3 or last:
                    work([sync[i]] * p, [0.0] * p)
                    ring("reduce-scatter", sizes[i])
            if C > 1:  # the attention's compute (the rest of its time is exposed transfer)
                spent = [
                    L * attention(seqs[g // C], n, h, a, C, bpe, rate, stream, cp_link)[2] for g in range(p)
                ]
                work([0.0] * p, spent)
        opt = [optimizer_seconds(cfg, sum(chunk(m, p, g) for m in sizes), bpe, stream) for g in range(p)]
        work(opt, opt)
        for count in sizes if stage == 2 else ():
            ring("all-gather", count)
        steps += clock
        computes += compute
        comms += [c - w for c, w in zip(clock, compute)]
    return {"step_s": max(steps), "compute_s": max(computes), "comm_s": max(comms)}
