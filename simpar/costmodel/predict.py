"""The prediction: per-rank bytes, messages and memory, and the step time on a hardware profile.

Nothing here runs MPI or calls the code that moves bytes or schedules work. Given a model (its
widths), a global batch and a layout, `predict` says what every rank will send per step, by category
and by collective, how much memory it will hold, and how long a step should take on some hardware
(hardware.py). `predict_from_config` keys the same numbers like a run's metrics, and `mismatches`
lists where a run and its prediction differ (empty: bytes and shard memory agree exactly).

Time: the alpha-beta-gamma model (Thakur, Rabenseifner & Gropp 2005): a collective costs
messages*alpha + bytes*beta + reduced bytes*gamma on the link its group uses (hardware.group_link),
plus compute = exact matmul FLOPs / FLOP rate (forward 2*rows*in*out per layer, backward twice that,
except layer 0 which needs no input gradient). The pipeline bubble is (S-1)/(M+S-1) for GPipe and
1F1B (Huang et al. 2019, GPipe sec. 2.2), (S-1)/S for the naive schedule.
"""

from __future__ import annotations

from ..config import layout_name
from . import hardware
from .collectives import ALLREDUCE, Cost, to_bytes
from .rank import CATS, MEMORY_KINDS, predict_rank
from .spec import Shape, Spec, check

# -- time (alpha-beta-gamma) and the whole prediction --------------------------------------------------


def op_time(cost: Cost, link, gamma: float) -> dict:
    """Latency + bandwidth + reduction terms of one op on the critical path (Thakur et al. 2005)."""
    return {
        "latency": cost.rounds * link.alpha,
        "bandwidth": cost.round_elems * link.beta,
        "reduction": cost.reduced * gamma,
    }


def bubble_fraction(spec: Spec) -> float:
    """Idle fraction of the pipeline: (S-1)/(M+S-1) for GPipe and 1F1B (GPipe, Huang et al. 2019,
    sec. 2.2; the same for 1F1B, Narayanan et al. 2021), (S-1)/S when one micro-batch runs at a time."""
    S, M = spec.pp, spec.microbatches
    if S == 1:
        return 0.0
    return (S - 1) / S if spec.schedule == "naive" else (S - 1) / (M + S - 1)


def representative_ranks(spec: Spec, limit: int = 512) -> list[int]:
    """All ranks of a small world; otherwise the first and last rank of each stage (the extremes of
    the uneven chunks) -- ranks of one stage differ by a few elements at most."""
    if spec.world <= limit:
        return list(range(spec.world))
    per_stage = spec.dp * spec.tp
    return sorted({r for s in range(spec.pp) for r in (s * per_stage, (s + 1) * per_stage - 1)})


def predict(spec: Spec, hw=None, ranks: list[int] | None = None) -> dict:
    """The whole prediction for one step: per-rank bytes/messages/memory, and the step time on `hw`.

    Step time = data scatter (rank 0 feeds everyone first) + pipeline makespan + exposed gradient
    traffic. The makespan, with c_s = one micro-batch's compute + tp + pp time on stage s, is
    K * (sum_s c_s + (M-1) * max_s c_s) for GPipe/1F1B (fill, steady state, drain) and K*M*sum_s c_s
    for the naive schedule; with equal stages the first is K*(M+S-1)*c: the bubble formula.
    Gradient all-reduces of DDP overlap with the backward that produces them (all buckets but the
    last, which holds the first layers); ZeRO's collectives are blocking in simpar: fully exposed.
    The optimizer update (memory-bound, elementwise) is not modelled.
    """
    check(spec)
    hw = hw or hardware.load("local")
    shape = Shape.of(spec)
    chosen = ranks if ranks is not None else representative_ranks(spec)
    links = {g: hardware.group_link(hw, g, spec.dp, spec.tp, spec.pp) for g in ("tp", "dp", "pp", "world")}
    # Ranks that outnumber the cores share them (the local profile): each computes proportionally slower.
    rate = hw.flop_rate(spec.precision) * hw.compute_share(min(spec.world, hw.devices_per_node))
    K, M = spec.grad_accum, spec.microbatches_used
    out, stage_busy, dp_exposed, data_s, worst = [], {}, 0.0, 0.0, {}
    for r in chosen:
        rp = predict_rank(spec, r, shape)
        by_op, group_s = {}, {g: 0.0 for g in links}
        for (cat, op, group), c in sorted(rp.pop("ops").items()):
            terms = op_time(c, links[group], hw.gamma)
            key, seconds = f"{cat}/{op}", sum(terms.values())
            by_op[key] = {"sent": c.sent, "messages": c.messages, "link": links[group].name, "time_s": terms}
            group_s[group] += seconds
            if key not in worst or seconds >= worst[key][0]:
                worst[key] = (seconds, by_op[key])  # the slowest rank's view of each op
        # matmuls at the FLOP rate, + the memory-bound rest at the reduction's speed (gamma is per byte
        # REDUCED, i.e. 3 bytes moved: read two, write one), both slowed if ranks share cores
        lo, hi = rp["layers"]
        calls = (hi - lo) * K * M  # layer forward+backward calls per step
        compute = (rp["flops"]["forward"] + rp["flops"]["backward"]) / rate + (
            rp["elementwise_bytes"] * hw.gamma / 3 + calls * hw.layer_overhead
        ) / hw.compute_share(min(spec.world, hw.devices_per_node))
        s, d = rp["coords"]["pp"], rp["coords"]["dp"]
        stage_busy[s] = max(stage_busy.get(s, 0.0), compute + group_s["tp"] + group_s["pp"])
        exposed, buckets = group_s["dp"], shape.buckets[s]
        if spec.zero == 0 and spec.overlap and spec.dp > 1 and len(buckets) > 1:
            # DDP overlap (Li et al. 2020, sec. 3.2): every bucket but the last can travel while the
            # last micro-batch's backward is still computing earlier layers.
            last = sum(
                op_time(
                    to_bytes(ALLREDUCE[spec.collectives](buckets[-1], spec.dp, d), spec.prec.grad),
                    links["dp"],
                    hw.gamma,
                ).values()
            )
            hidden_by = rp["flops"]["backward"] / rate / (K * M)
            exposed = max(exposed - hidden_by, last)
        dp_exposed = max(dp_exposed, exposed)
        if r == 0:
            data_s = group_s["world"]
        rp["by_op"] = by_op
        rp["time_s"] = {
            "compute": compute,
            "tp": group_s["tp"],
            "pp": group_s["pp"],
            "dp": group_s["dp"],
            "dp_exposed": exposed,
            "data": group_s["world"],
        }
        out.append(rp)
    per_mb = [stage_busy[s] / (K * M) for s in sorted(stage_busy)]
    if spec.pp > 1 and spec.schedule == "naive":
        makespan = K * M * sum(per_mb)
    else:
        makespan = K * (sum(per_mb) + (M - 1) * max(per_mb))
    busiest = max(stage_busy.values())
    step = data_s + makespan + dp_exposed
    compute = max(r["time_s"]["compute"] for r in out)
    mem_max = {k: max(r["memory"][k] for r in out) for k in MEMORY_KINDS}
    exact = len(out) == spec.world
    return {
        "layout": layout_name(spec),
        "world": spec.world,
        "params": sum(a * b + b for a, b in zip(spec.widths[:-1], spec.widths[1:])),
        "spec": {k: v for k, v in spec.__dict__.items() if k != "widths"},
        "widths": _short(spec.widths),
        "n_layers": spec.n_layers,
        "hardware": hw.name,
        "links": {
            g: {"name": link.name, "alpha_s": link.alpha, "bytes_per_s": link.bw} for g, link in links.items()
        },
        "comm": {
            "ranks": out,
            "all_ranks": exact,
            "per_rank_max": {c: max(r["sent"][c] for r in out) for c in CATS},
            "total_sent": {c: sum(r["sent"][c] for r in out) for c in CATS} if exact else None,
            "by_op_slowest_rank": {k: entry for k, (_, entry) in worst.items()},
        },
        "memory": {"max": mem_max, "max_total": max(sum(r["memory"][k] for k in MEMORY_KINDS) for r in out)},
        "bubble": bubble_fraction(spec),
        "flops_per_step": sum(r["flops"]["forward"] + r["flops"]["backward"] for r in out) if exact else None,
        "time": {
            "step_s": step,
            "compute_s": compute,
            "tp_s": max(r["time_s"]["tp"] for r in out),
            "pp_s": max(r["time_s"]["pp"] for r in out),
            "bubble_s": max(0.0, makespan - busiest),
            "dp_s": max(r["time_s"]["dp"] for r in out),
            "dp_exposed_s": dp_exposed,
            "data_s": data_s,
            "samples_per_s": spec.batch / step if step > 0 else float("inf"),
        },
    }


def _short(widths: list) -> list:
    return widths if len(widths) <= 12 else widths[:3] + ["..."] + widths[-2:]


def predict_from_config(cfg, world_size: int, steps: int | None = None, hw=None) -> dict:
    """The prediction for a RunConfig, keyed like train.py's metrics so a comparison is one lookup:

        pred["comm"]["ranks"][r]["sent"][cat]   == metrics["comm"]["ranks"][r]["sent"][cat]
        pred["memory"]["ranks"][r][kind]        == metrics["memory"]["ranks"][r][kind]
        (params, grads, optimizer exactly; activations_peak for the numpy kernels' Context sizes)

    Bytes and messages are totals over `steps` steps (every step moves the same bytes), like the
    ledger's; `per_step` holds one step's. Time is on the `local` hardware profile unless `hw` is given.
    """
    spec = Spec.from_config(cfg, world_size)
    steps = steps if steps is not None else (cfg.steps or 1)
    pred = predict(spec, hw, ranks=list(range(spec.world)))
    ranks = []
    for r in pred["comm"]["ranks"]:
        ranks.append(
            {
                "rank": r["rank"],
                "coords": r["coords"],
                "sent": {c: r["sent"][c] * steps for c in CATS},
                "messages": {c: r["messages"][c] * steps for c in CATS},
                "by_op": {
                    k: {"sent": v["sent"] * steps, "messages": v["messages"] * steps}
                    for k, v in r["by_op"].items()
                },
            }
        )
    return {
        "steps": steps,
        "layout": pred["layout"],
        "hardware": pred["hardware"],
        "comm": {
            "ranks": ranks,
            "per_step": pred["comm"]["total_sent"],
            "per_rank_per_step_max": pred["comm"]["per_rank_max"],
        },
        "memory": {"ranks": [r["memory"] for r in pred["comm"]["ranks"]], "max": pred["memory"]["max"]},
        "bubble": pred["bubble"],
        "time": pred["time"],
    }


def mismatches(metrics: dict, predicted: dict) -> list[str]:
    """Where a run's ledger and memory differ from predict_from_config (empty list: exact).

    Compares, per rank, bytes sent per category and params/grads/optimizer memory -- the numbers
    the cost model must get exactly right (activation peaks too, but only for the numpy kernels'
    Context sizes, so they are reported separately by the caller if it wants them)."""
    out = []
    for m, p in zip(metrics["comm"]["ranks"], predicted["comm"]["ranks"]):
        for c in CATS:
            if m["sent"][c] != p["sent"][c]:
                out.append(f"rank {m['rank']} {c}: measured {m['sent'][c]} B, predicted {p['sent'][c]} B")
    for r, (m, p) in enumerate(zip(metrics["memory"]["ranks"], predicted["memory"]["ranks"])):
        for kind in ("params", "grads", "optimizer"):
            if m[kind] != p[kind]:
                out.append(f"rank {r} {kind}: measured {m[kind]} B, predicted {p[kind]} B")
    return out
