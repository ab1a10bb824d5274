"""The step time of --zero 1 with --tp and/or --pp on --arch gpt, in closed form, as the simulated clock
charges parallel/zero_mesh.py's step (written again; nothing imported from parallel/).

ZeRO-1 adds no traffic to the micro-steps: every rank runs its layout's step -- gpt_time.py's units and
blocking tp collectives (--tp), steptime.py's schedule recurrences (--pp, gpt_pipeline_time.py's chunk
costs) -- with no gradient bucket, and reaches the end of its last backward at `ready`. Then, on the
p ranks of its sharding group (the dp ranks with its tp index and stage), blocking rings as in
gpt_zero_time.py's stage 1 (Rajbhandari et al. 2020, sec. 7.2.1):

    for each store n (its chunks, in order)   reduce-scatter of n           (ring_time.ring_ends)
    the optimizer on chunk(n, p, g) of each store, sum over stores       (gpt_time.optimizer_seconds)
    for each store n                           all-gather of n

ring_ends follows every rank of the group through every round, so uneven chunks and ranks that arrive
at different times (a dp rank with fewer rows) are priced as the clock prices them. The step ends with
the slowest rank of the world.
"""

from __future__ import annotations

from types import SimpleNamespace

from .chunktime import collective_gamma
from .collectives import chunk
from .gpt_pipeline_time import GptChunkCosts
from .gpt_time import clock_rates, optimizer_seconds, step_seconds
from .gpt_tp import local_unit_sizes
from .order import n_chunks, stage_chunks
from .ring_time import ring_ends
from .spec import PRECISIONS, precision_of
from .stages import balanced_counts
from .steptime import step_time


class _NoBuckets(GptChunkCosts):
    """A chunk's costs with no DDP buckets and no optimizer sweep: ZeRO-1 runs both after the schedule."""

    def bucket_seconds(self, s_sizes: list, d: int) -> list:
        return []


def _sharded_tail(cfg, hw, p: int, stores: list[int], ready: list[float], link) -> list[float]:
    """Each of the group's p ranks' end: reduce-scatters, the optimizer on its chunks, all-gathers."""
    prec = PRECISIONS[precision_of(cfg)]
    _, stream, _ = clock_rates(hw, precision_of(cfg), min(_world(cfg, p), hw.devices_per_node))
    clock, free, gamma = list(ready), [0.0] * p, collective_gamma(hw)
    for n in stores:
        if p > 1:
            clock = ring_ends("reduce-scatter", n, prec.grad, clock, free, link, gamma)
    for g in range(p):
        clock[g] += optimizer_seconds(cfg, sum(chunk(n, p, g) for n in stores), prec.act, stream)
    for n in stores:
        if p > 1:
            clock = ring_ends("all-gather", n, prec.param, clock, free, link, gamma)
    return clock


def _world(cfg, p: int) -> int:
    return p * cfg.tp * cfg.pp


def zero1_tp_seconds(cfg, p: int, hw) -> dict:
    """--tp T --dp p --zero 1 (pp = 1): gpt_time.step_seconds' ranks, each reaching `ready`, then the tail."""
    from .hardware import group_link

    t, prec = cfg.tp, PRECISIONS[precision_of(cfg)]
    local = local_unit_sizes(cfg.blocks, cfg.hidden, cfg.seq_len, cfg.vocab, t)
    base = step_seconds(cfg, p, local, hw, precision_of(cfg), prec.act)
    link = group_link(hw, "dp", p, t, 1)
    ends, computes = [], []
    for j in range(t):  # the dp group of tp index j: ranks d t + j
        ready = [base["before_dp"][d * t + j] for d in range(p)]
        ends += _sharded_tail(cfg, hw, p, [sum(local)], [r[0] for r in ready], link)
        computes += [r[1] for r in ready]
    step_s = max(ends)
    return {"step_s": step_s, "compute_s": max(computes), "comm_s": step_s - max(computes)}


def zero1_pipeline_seconds(cfg, p: int, hw) -> dict:
    """--pp S [--tp T] --dp p --zero 1: gpt_pipeline_time's chains without buckets, then the tail."""
    from .hardware import group_link

    S, sched, t = cfg.pp, cfg.schedule, cfg.tp
    sizes = local_unit_sizes(cfg.blocks, cfg.hidden, cfg.seq_len, cfg.vocab, 1)
    local = local_unit_sizes(cfg.blocks, cfg.hidden, cfg.seq_len, cfg.vocab, t)
    Vs = cfg.virtual_stages if sched == "interleaved" else 1
    prec = PRECISIONS[precision_of(cfg)]
    C = n_chunks(sched, S, Vs)
    counts = cfg.stage_layers or balanced_counts(sizes, C)
    bounds = [(sum(counts[:k]), sum(counts[: k + 1])) for k in range(C)]
    spec = SimpleNamespace(
        pp=S, dp=p, tp=t, sp=cfg.sp, world=p * S * t, batch=cfg.batch, grad_accum=cfg.grad_accum,
        microbatches_used=cfg.microbatches, virtual_stages=Vs, schedule=sched, overlap=cfg.overlap,
        prec=prec, widths=[cfg.seq_len * cfg.hidden] * (len(sizes) + 1),
    )  # fmt: skip
    links = {g: group_link(hw, g, p, t, S) for g in ("dp", "pp", "tp")}
    ready, computes = [[0.0] * p for _ in range(S)], []
    for d in range(p):
        stages = {}
        for s in range(S):
            mine = stage_chunks(sched, S, Vs, s)
            costs = {c: _NoBuckets(cfg, spec, hw, links, bounds[c], local, 0.0) for c in mine}
            stages[s] = (costs, d, {c: local[slice(*bounds[c])] for c in mine})
        timed = step_time(spec, hw, links, stages, 0.0, [0.0] * S)
        for s in range(S):
            ready[s][d] = timed["ends"][s]
            computes.append(timed["stage_parts"][s]["compute"])
    ends = []
    for s in range(S):
        stores = [sum(local[slice(*bounds[c])]) for c in stage_chunks(sched, S, Vs, s)]
        ends += _sharded_tail(cfg, hw, p, stores, ready[s], links["dp"])
    step_s = max(ends)
    return {"step_s": step_s, "compute_s": max(computes), "comm_s": step_s - max(computes)}
