"""The step time of `simpar train --arch gpt --cp C [--dp D] --zero 1|2|3` in closed form, as the
simulated clock charges it: gpt_zero_time.py's order of work and ZeRO's blocking rings, over the
p = D C ranks of the dpcp group (parallel/context_zero.py), with cp's units (written again here, as
in cp_time.py; nothing imported from parallel/ or the runtime):

  each rank's units compute on its R = b n rows (b its dp share of the micro-batch's sequences,
  n = s/C its tokens of each) without score work (gpt_time.unit_seconds with s = 0); every block adds
  its attention, forward and backward, on the cp group's link: each ring hop overlapping its causal
  blocks, the all-to-alls blocking (cp_time.py), every rank of the cp group followed hop by hop
  (cp_hop_time.attention_ends);
  ZeRO's reduce-scatters and all-gathers run where zero.py runs them (gpt_zero_time.py's docstring),
  blocking rings on the dpcp link, every rank followed through every round (ring_time.ring_ends).

When p divides every unit, ZeRO's rings end on all ranks at once and each block's attention is
cp_time's sum. When it does not, the first ranks' chunks are one element longer, the rings leave the
ranks' clocks apart, and a hop that waits for its left neighbour's K/V (or partial sums, or an
all-to-all's piece) waits on a late neighbour: cp_hop_time.py prices that wait. A block's attention
sits inside its unit after work that takes the same time on every rank of the cp group (the same b
rows), and every hop is a max of clocks plus constants, so the attention is applied to the clocks at
the unit's start and the unit's own work added after: the same ends.
"""

from __future__ import annotations

from types import SimpleNamespace

from .chunktime import collective_gamma
from .collectives import chunk
from .cp_hop_time import attention_ends
from .cp_time import ring_seconds, ulysses_seconds
from .gpt_time import clock_rates, optimizer_seconds, unit_seconds
from .ring_time import ring_ends
from .spec import split


def cp_zero_step_seconds(cfg, dp: int, sizes: list[int], hw, precision: str, bpe: int) -> dict:
    """{step_s, compute_s, comm_s} of one --cp --zero step on p = dp C ranks (module docstring)."""
    from .hardware import group_link

    C, L, h, a, s = cfg.cp, cfg.blocks, cfg.hidden, cfg.heads, cfg.seq_len
    stage, P, p, n = cfg.zero, sum(sizes), dp * C, s // C
    rate, stream, overhead = clock_rates(hw, precision, min(p, hw.devices_per_node))
    link, gamma = group_link(hw, "dp", p, 1, 1), collective_gamma(hw)
    cp_link = group_link(hw, "dp", C, 1, 1)
    attention = ring_seconds if cfg.cp_algo == "ring" else ulysses_seconds
    local = SimpleNamespace(hidden=h, heads=a, seq_len=0, vocab=cfg.vocab, tp=1, sp=False, blocks=L)
    clock, link_free, compute = [0.0] * p, [0.0] * p, [0.0] * p

    def work(seconds: list[float], computed: list[float]) -> None:  # each rank's own work
        for g in range(p):
            clock[g] += seconds[g]
            compute[g] += computed[g]

    def ring(kind: str, count: int) -> None:  # zero.py's collectives: always the ring, blocking
        if p > 1:
            clock[:] = ring_ends(kind, count, bpe, clock, link_free, link, gamma)

    def attend(rows: list[int], backward: bool) -> None:  # every cp group's block attention
        for d in range(dp):  # cp group d: ranks d C .. d C + C - 1 of the dpcp group
            group = slice(d * C, (d + 1) * C)
            clock[group] = attention_ends(
                cfg.cp_algo, clock[group], rows[d], n, h, a, bpe, rate, stream, cp_link, backward
            )

    micro = split(cfg.batch, cfg.grad_accum)
    for k, k_rows in enumerate(micro):
        rows = [chunk(k_rows, dp, d) for d in range(dp)]
        units = [unit_seconds(local, rows[g // C] * n, sizes, bpe, rate, stream, overhead) for g in range(p)]
        attn_compute = [attention(rows[g // C], n, h, a, C, bpe, rate, stream, cp_link)[2] for g in range(p)]
        for i, count in enumerate(sizes):  # units 1..L are the blocks: they attend
            if stage == 3:  # gathered before its forward
                ring("all-gather", count)
            if 0 < i <= L:
                attend(rows, backward=False)
            own = [units[g][0][i] for g in range(p)]
            work(own, own)
        work([u[2] for u in units], [u[2] for u in units])
        for i in reversed(range(len(sizes))):
            if stage == 3:  # gathered again for its backward
                ring("all-gather", sizes[i])
            if 0 < i <= L:
                attend(rows, backward=True)
            own = [units[g][1][i] for g in range(p)]
            work(own, own)
            if stage == 3 or (stage == 2 and k == len(micro) - 1):  # its gradient, as backward ends
                ring("reduce-scatter", sizes[i])
        for g in range(p):  # the attention's compute (the rest of its time is exposed transfer)
            compute[g] += L * attn_compute[g]
    if stage == 1:
        ring("reduce-scatter", P)
        opt = [optimizer_seconds(cfg, chunk(P, p, g), bpe, stream) for g in range(p)]
        work(opt, opt)
        ring("all-gather", P)
    else:
        opt = [optimizer_seconds(cfg, sum(chunk(c, p, g) for c in sizes), bpe, stream) for g in range(p)]
        work(opt, opt)
        for count in sizes if stage == 2 else ():
            ring("all-gather", count)
    return {
        "step_s": max(clock),
        "compute_s": max(compute),
        "comm_s": max(c - w for c, w in zip(clock, compute)),
    }
