"""The step time of --zero 1 with --tp and/or --pp (and --cp) on --arch gpt, in closed form, as the
simulated clock charges parallel/zero_mesh.py's step (written again; nothing imported from parallel/).

ZeRO-1 adds no traffic to the micro-steps: every rank runs its layout's step with no gradient bucket
and reaches the end of its last backward at `ready` -- gpt_time.step_seconds' ranks (--tp),
cp_time.cp_step_seconds' (--cp --tp), or steptime.step_time's stage ends over the chunk costs of
gpt_pipeline_time.py, cp_pipeline_time.py or cp_tp_pipeline_time.py with their buckets taken out and
no optimizer sweep (--pp). Then, on the p ranks of its sharding group (the dp x cp ranks with its tp
index and stage, in dpcp order g = d C + c), blocking rings as gpt_zero_time.py's stage 1
(Rajbhandari et al. 2020, sec. 7.2.1):

    for each store n (its chunks, in order)   reduce-scatter of n           (ring_time.ring_ends)
    the optimizer on chunk(n, p, g) of each store, summed                 (gpt_time.optimizer_seconds)
    for each store n                           all-gather of n

ring_ends follows every rank of the group through every round, so uneven chunks and ranks that arrive
at different times (a dp rank with fewer rows) are priced as the clock prices them. The step ends with
the slowest rank of the world.
"""

from __future__ import annotations

from types import SimpleNamespace

from .chunktime import collective_gamma
from .collectives import chunk
from .cp_pipeline_time import CpChunkCosts
from .cp_time import cp_step_seconds
from .cp_tp_pipeline_time import CpTpChunkCosts
from .gpt_pipeline_time import GptChunkCosts
from .gpt_time import clock_rates, optimizer_seconds, step_seconds
from .gpt_tp import local_unit_sizes
from .order import n_chunks, stage_chunks
from .ring_time import ring_ends
from .spec import PRECISIONS, precision_of
from .stages import balanced_counts
from .steptime import step_time


def _no_buckets(costs_class):
    """The chunk costs without DDP buckets: ZeRO-1's collectives run after the schedule."""
    return type(
        f"ZeroOne{costs_class.__name__}", (costs_class,), {"bucket_seconds": lambda self, sizes, d: []}
    )


def _tail(hw, prec, stores: list[int], ready: list[float], optimizer_s: list[float], link) -> list[float]:
    """Each of the group's p ranks' end: reduce-scatters, the optimizer on its chunks (optimizer_s[g]
    seconds), all-gathers."""
    p = len(ready)
    clock, free, gamma = list(ready), [0.0] * p, collective_gamma(hw)
    for n in stores if p > 1 else ():
        clock = ring_ends("reduce-scatter", n, prec.grad, clock, free, link, gamma)
    clock = [c + o for c, o in zip(clock, optimizer_s)]
    for n in stores if p > 1 else ():
        clock = ring_ends("all-gather", n, prec.param, clock, free, link, gamma)
    return clock


def _gpt_tail(cfg, hw, stores: list[int], ready: list[float], link) -> list[float]:
    """_tail with gpt_time's optimizer sweep over each rank's chunks."""
    p, prec = len(ready), PRECISIONS[precision_of(cfg)]
    _, stream, _ = clock_rates(hw, precision_of(cfg), min(p * cfg.tp * cfg.pp, hw.devices_per_node))
    sweep = [optimizer_seconds(cfg, sum(chunk(n, p, g) for n in stores), prec.act, stream) for g in range(p)]
    return _tail(hw, prec, stores, ready, sweep, link)


def _result(ends: list[float], computes: list[float]) -> dict:
    step_s = max(ends)
    return {"step_s": step_s, "compute_s": max(computes), "comm_s": step_s - max(computes)}


def zero1_tp_seconds(cfg, dp: int, hw) -> dict:
    """--tp T [--cp C] --dp dp --zero 1 (pp = 1): the layout's ranks, each reaching its `ready`, then
    the tail over its dp (x cp) group: world rank g T + j, g = d C + c."""
    from .hardware import group_link

    T, C, prec = cfg.tp, getattr(cfg, "cp", 1), PRECISIONS[precision_of(cfg)]
    local = local_unit_sizes(cfg.blocks, cfg.hidden, cfg.seq_len, cfg.vocab, T)
    timed = cp_step_seconds if C > 1 else step_seconds
    base = timed(cfg, dp, local, hw, precision_of(cfg), prec.act)["before_dp"]
    p = dp * C
    link = group_link(hw, "dp", p, T, 1)
    ends = []
    for j in range(T):
        ends += _gpt_tail(cfg, hw, [sum(local)], [base[g * T + j][0] for g in range(p)], link)
    return _result(ends, [b[1] for b in base])


def zero1_pipeline_seconds(cfg, dp: int, hw) -> dict:
    """--pp S [--tp T] [--cp C] --dp dp --zero 1: the layout's pipeline chain of every (dp, cp) place
    without buckets (steptime.step_time, as gpt_pipeline_time / cp_pipeline_time / cp_tp_pipeline_time
    build it), then the tail over each stage's dp x cp ranks."""
    from .hardware import group_link

    S, T, C, sched = cfg.pp, cfg.tp, getattr(cfg, "cp", 1), cfg.schedule
    sizes = local_unit_sizes(cfg.blocks, cfg.hidden, cfg.seq_len, cfg.vocab, 1)
    local = local_unit_sizes(cfg.blocks, cfg.hidden, cfg.seq_len, cfg.vocab, T)
    Vs = cfg.virtual_stages if sched == "interleaved" else 1
    K = n_chunks(sched, S, Vs)
    counts = cfg.stage_layers or balanced_counts(sizes, K)
    bounds = [(sum(counts[:k]), sum(counts[: k + 1])) for k in range(K)]
    spec = SimpleNamespace(
        pp=S, dp=dp, tp=T, sp=cfg.sp, world=dp * C * T * S, batch=cfg.batch, grad_accum=cfg.grad_accum,
        microbatches_used=cfg.microbatches, virtual_stages=Vs, schedule=sched, overlap=cfg.overlap,
        prec=PRECISIONS[precision_of(cfg)], widths=[cfg.seq_len // C * cfg.hidden] * (len(sizes) + 1),
    )  # fmt: skip
    if C > 1:  # cp_pipeline_time's and cp_tp_pipeline_time's links
        links = {g: group_link(hw, g, dp * C, T, S) for g in ("dp", "pp", "tp")}
        links["cp"] = group_link(hw, "dp", C, T, S) if T > 1 else group_link(hw, "dp", C, 1, 1)
        costs_class = _no_buckets(CpTpChunkCosts if T > 1 else CpChunkCosts)
    else:
        links = {g: group_link(hw, g, dp, T, S) for g in ("dp", "pp", "tp")}
        costs_class = _no_buckets(GptChunkCosts)
    ready = [[0.0] * (dp * C) for _ in range(S)]
    computes = []
    for d in range(dp):
        for c in range(C):
            stages = {}
            for s in range(S):
                extra = (c,) if C > 1 else ()
                costs = {
                    k: costs_class(cfg, spec, hw, links, bounds[k], local, 0.0, *extra)
                    for k in stage_chunks(sched, S, Vs, s)
                }
                stages[s] = (costs, d, {k: local[slice(*bounds[k])] for k in costs})
            timed = step_time(spec, hw, links, stages, 0.0, [0.0] * S)
            for s in range(S):
                ready[s][d * C + c] = timed["ends"][s]
                computes.append(timed["stage_parts"][s]["compute"])
    ends = []
    for s in range(S):
        stores = [sum(local[slice(*bounds[k])]) for k in stage_chunks(sched, S, Vs, s)]
        ends += _gpt_tail(cfg, hw, stores, ready[s], links["dp"])
    return _result(ends, computes)


def zero1_mesh_steps(spec, hw, link, stages_of: dict, timed: dict, zero_s: float) -> dict:
    """--arch mlp --zero 1 with --tp/--pp: predict.py's chains (steptime.step_time per dp index d, whose
    `ends` hold ZeRO's blocking seconds `zero_s` and the optimizer sweep), re-ended: each stage's dp
    ranks reach `ready` (the end less both), then _tail over the dp group. Returns {d: step_time's
    shape} with the ring time and the waiting in `dp`, so a stage's parts still add up to its end."""
    S, p, out = spec.pp, spec.dp, {}
    ends = {}
    for s in range(S):
        costs = [next(iter(stages_of[d][s][0].values())) for d in range(p)]
        sizes = stages_of[0][s][2]
        stores = [sum(sizes[c]) for c in stages_of[0][s][0]]  # the stage's chunks, in order
        ready = [timed[d]["ends"][s] - zero_s - costs[d].optimizer_s for d in range(p)]
        for d, end in enumerate(_tail(hw, spec.prec, stores, ready, [c.optimizer_s for c in costs], link)):
            ends[s, d] = end
    for d in range(p):
        last = max(range(S), key=lambda s: ends[s, d])
        waited = [ends[s, d] - (timed[d]["ends"][s] - zero_s) for s in range(S)]
        parts = dict(timed[d]["stage_parts"][last])
        parts["dp"] += waited[last] - zero_s
        out[d] = {
            "makespan": ends[last, d],
            "dp_exposed": timed[d]["dp_exposed"] - zero_s + max(waited),
            "critical_stage": last,
            "parts": parts,
        }
    return out
