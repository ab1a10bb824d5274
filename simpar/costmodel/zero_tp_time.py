"""The step time of --arch gpt --tp T --dp D --zero 2|3 [--sp] in closed form, as the simulated clock
charges parallel/zero_tp.py's step (written again; nothing imported from parallel/).

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

The D ranks of one tp index's dp group are followed together through every ring round
(ring_time.ring_ends): uneven chunks and uneven rows let their clocks drift apart as the clock's do. The
T tp ranks of a dp index hold equal shares and rows, so they reach each tp collective together and each
is priced as it alone (gpt_time.step_seconds' rule). The step ends with the slowest rank.
"""

from __future__ import annotations

from .chunktime import collective_gamma, seconds
from .collectives import ALLREDUCE, chunk, to_bytes
from .gpt_time import clock_rates, optimizer_seconds, tp_collectives, unit_seconds
from .gpt_tp import local_unit_sizes
from .ring_time import ring_ends
from .spec import PRECISIONS, precision_of, split


def zero_tp_seconds(cfg, p: int, hw) -> dict:
    """{step_s, compute_s, comm_s} of a --zero 2|3 --tp step on p dp ranks (module docstring)."""
    from .hardware import group_link

    T, stage, precision = cfg.tp, cfg.zero, precision_of(cfg)
    prec = PRECISIONS[precision]
    bpe, sizes = prec.act, local_unit_sizes(cfg.blocks, cfg.hidden, cfg.seq_len, cfg.vocab, T)
    rate, stream, overhead = clock_rates(hw, precision, min(p * T, hw.devices_per_node))
    links = {g: group_link(hw, g, p, T, 1) for g in ("dp", "tp")}
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
            for d in range(p):
                clock[d] += secs_of_rank[d]
                compute[d] += counted[d]

        def ring(kind: str, n: int) -> None:  # blocking ring over the dp group of tp index j
            if p > 1:
                bytes_ = prec.grad if kind == "reduce-scatter" else prec.param
                clock[:] = ring_ends(kind, n, bytes_, clock, link_free, links["dp"], gamma)

        for k, k_rows in enumerate(micro):
            rows = [chunk(k_rows, p, d) * cfg.seq_len for d in range(p)]
            units = [unit_seconds(cfg, R, sizes, bpe, rate, stream, overhead) for R in rows]
            tps = [tp_collectives(cfg, R, j, bpe, secs) for R in rows]
            last = k == len(micro) - 1
            for i, n in enumerate(sizes):
                if stage == 3:
                    ring("all-gather", n)
                work([u[0][i] + c[0][i] for u, c in zip(units, tps)], [u[0][i] for u in units])
            work([u[2] + c[2] for u, c in zip(units, tps)], [u[2] for u in units])
            for i in reversed(range(len(sizes))):
                if stage == 3:
                    ring("all-gather", sizes[i])
                work([u[1][i] + c[1][i] for u, c in zip(units, tps)], [u[1][i] for u in units])
                if stage == 3 or last:
                    work([sync[i]] * p, [0.0] * p)
                    ring("reduce-scatter", sizes[i])
        opt = [optimizer_seconds(cfg, sum(chunk(n, p, d) for n in sizes), bpe, stream) for d in range(p)]
        work(opt, opt)
        for n in sizes if stage == 2 else ():
            ring("all-gather", n)
        steps += clock
        computes += compute
        comms += [c - w for c, w in zip(clock, compute)]
    return {"step_s": max(steps), "compute_s": max(computes), "comm_s": max(comms)}
