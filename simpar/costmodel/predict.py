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
from .chunktime import RankCosts, collective_gamma, op_time, ring_op
from .order import loss_stage, zb_v_orders
from .rank import CATS, MEMORY_KINDS, predict_rank
from .rounds_time import ddp_steps
from .spec import Shape, Spec, check, coords_of, micro_rows
from .stages import unit_sizes
from .steptime import step_time
from .zero_time import zero_steps

# -- time (alpha-beta-gamma) and the whole prediction --------------------------------------------------


def bubble_fraction(spec: Spec) -> float:
    """Idle fraction of the pipeline step (forward 1, backward 2 units; zb-h1's B = W = 1): see
    bubble_formula."""
    return _bubble(spec)[1]


def bubble_formula(spec: Spec) -> str:
    """The ideal bubble as a formula with the numbers put in, e.g. "(S-1)/(M+S-1) = 3/11"."""
    return _bubble(spec)[0]


def _bubble(spec: Spec) -> tuple[str, float]:
    """(S-1)/(M+S-1) for GPipe and 1F1B (GPipe, Huang et al. 2019, sec. 2.2; the same for 1F1B,
    Narayanan et al. 2021); (S-1)/S one micro-batch at a time; interleaved (S-1)/(VM+S-1), i.e. the
    bubble over the ideal time (S-1)/(VM) (Narayanan et al. 2021, sec. 2.2); zb-h1 (S-1)/(3M+S-1)
    when M >= S (Qi et al. 2023, sec. 3.1: (S-1)(F+B-W) idle per stage, F = B = W), else
    1 - 3M/(2(M+S)-1); zb-v 1 - 6M/T, T the span of its unit-time order (6M units of work per rank,
    T >= 6M + S - 1: the first forward's way down is idle on every stage but 0)."""
    S, M, V = spec.pp, spec.microbatches, spec.virtual_stages
    if S == 1:
        return "no pipeline", 0.0
    if spec.schedule == "naive":
        return f"(S-1)/S = {S - 1}/{S}", (S - 1) / S
    if spec.schedule == "interleaved":
        return f"(S-1)/(V*M+S-1) = {S - 1}/{V * M + S - 1}", (S - 1) / (V * M + S - 1)
    if spec.schedule == "zb-v":  # no closed form: the unit-time span of its order (order.py)
        T = zb_v_orders(S, M)[1]
        return f"1 - 6M/T, T = {T} (>= 6M+S-1 = {6 * M + S - 1}): {T - 6 * M}/{T}", (T - 6 * M) / T
    if spec.schedule == "zb-h1":
        if M >= S:
            return f"(S-1)/(3M+S-1) = {S - 1}/{3 * M + S - 1}", (S - 1) / (3 * M + S - 1)
        span = 2 * (M + S) - 1
        return f"1 - 3M/(2(M+S)-1) = {span - 3 * M}/{span}", (span - 3 * M) / span
    return f"(S-1)/(M+S-1) = {S - 1}/{M + S - 1}", (S - 1) / (M + S - 1)


def representative_ranks(spec: Spec, limit: int = 512) -> list[int]:
    """All ranks of a small world; otherwise the first and last rank of each stage (the extremes of
    the uneven chunks) -- ranks of one stage differ by a few elements at most."""
    if spec.world <= limit:
        return list(range(spec.world))
    per_stage = spec.dp * spec.tp
    return sorted({r for s in range(spec.pp) for r in (s * per_stage, (s + 1) * per_stage - 1)})


def predict(spec: Spec, hw=None, ranks: list[int] | None = None) -> dict:
    """The whole prediction for one step: per-rank bytes/messages/memory, and the step time on `hw`.

    Step time = data scatter (rank 0 feeds everyone first) + the step of steptime.step_time: each
    pipeline chain of stages run through its schedule (fill, steady state, drain, with every hop's
    latency on the critical path), DDP buckets overlapping the last backward, blocking ZeRO
    collectives, the optimizer. `bubble` is the schedule's ideal idle fraction, (S-1)/(M+S-1) for
    GPipe and 1F1B. `time.compute_s`, `tp_s`, `pp_s`, `dp_s` are each the largest over the ranks (of
    different ranks, partly overlapped: they do not add up to the step); `time.critical` is the rank
    that finishes last, its step cut into parts that do add up to `step_s` (steptime.TIMELINE_PARTS),
    and `time.bubble_s` is that rank's bubble part (waiting for a neighbouring stage).
    """
    check(spec)
    hw = hw or hardware.load("local")
    shape = Shape.of(spec)
    chosen = ranks if ranks is not None else representative_ranks(spec)
    links = {g: hardware.group_link(hw, g, spec.dp, spec.tp, spec.pp) for g in ("tp", "dp", "pp", "world")}
    # Ranks that outnumber the cores share them (the local profile): each computes proportionally slower.
    rate = hw.flop_rate(spec.precision) * hw.compute_share(min(spec.world, hw.devices_per_node))
    K, M = spec.grad_accum, spec.microbatches_used
    out, data_s, worst = [], 0.0, {}
    for r in chosen:
        rp = predict_rank(spec, r, shape)
        by_op, group_s = {}, {g: 0.0 for g in links}
        for (cat, op, group), c in sorted(rp["ops"].items()):
            nvls = spec.collectives == "auto"
            terms = op_time(c, links[group], collective_gamma(hw), ring_op(spec, op), nvls)
            key, seconds = f"{cat}/{op}", sum(terms.values())
            by_op[key] = {"sent": c.sent, "messages": c.messages, "link": links[group].name, "time_s": terms}
            group_s[group] += seconds
            if key not in worst or seconds >= worst[key][0]:
                worst[key] = (seconds, by_op[key])  # the slowest rank's view of each op
        # matmuls at the FLOP rate, + the memory-bound rest at the reduction's speed (gamma is per byte
        # REDUCED, i.e. 3 bytes moved: read two, write one), both slowed if ranks share cores
        calls = rp["layer_count"] * K * M  # layer forward+backward calls per step
        if spec.recompute == "full":  # the forward's layer calls once more
            calls += rp["layer_count"] * K * M
        on_node = min(spec.world, hw.devices_per_node)
        compute = (
            (rp["flops"]["forward"] + rp["flops"]["backward"] + rp["flops"]["recompute"]) / rate
            + rp["elementwise_bytes"] * hw.gamma / 3 / hw.stream_share(on_node)
            + calls * hw.layer_overhead / hw.compute_share(on_node)
        )
        rp["by_op"] = by_op
        del rp["ops"]
        rp["time_s"] = {
            "compute": compute,
            "tp": group_s["tp"],
            "pp": group_s["pp"],
            "dp": group_s["dp"],
            "data": group_s["world"],
        }
        out.append(rp)
    starts = data_ready(spec, links["world"]) if spec.data_source == "root" else [0.0] * spec.pp
    data_s = max(starts)
    # The step: one pipeline chain per data-parallel index (its stages' slowest tensor-parallel rank).
    timed, chain_ranks, chunk_costs, stages_of = {}, {}, {}, {}
    for d in sorted({r["coords"]["dp"] for r in out}):
        stages = {}
        for s in range(spec.pp):
            rp = next((r for r in out if r["coords"]["pp"] == s and r["coords"]["dp"] == d), None)
            if rp is None:
                rp = predict_rank(spec, s * spec.dp * spec.tp + d * spec.tp, shape)
            chain_ranks[d, s] = rp["rank"]
            stages[s] = (
                {
                    c: RankCosts(spec, hw, links, rp, shape.kinds[c], shape.sizes[c], shape.bounds[c])
                    for c in shape.chunks[s]
                },
                d,
                {c: shape.sizes[c] for c in shape.chunks[s]},
            )
        zero_s = max(r["time_s"]["dp"] for r in out) if spec.zero else 0.0
        timed[d] = step_time(spec, hw, links, stages, zero_s, starts)
        chunk_costs[d], stages_of[d] = stages[0][0][0], stages
    # ZeRO: every dp rank through every ring round (zero_time.py); past `representative_ranks`' limit
    # (plan on thousands of ranks) one rank's blocking collectives summed (step_time) stand in for it
    if spec.zero == 1 and (spec.tp > 1 or spec.pp > 1) and len(timed) == spec.dp:  # zero_mesh_time.py
        from .zero_mesh_time import zero1_mesh_steps

        timed = zero1_mesh_steps(spec, hw, links["dp"], stages_of, timed, zero_s)
    elif spec.zero and len(chunk_costs) == spec.dp:
        timed = zero_steps(spec, hw, links, chunk_costs, shape.sizes[0], starts)
    elif spec.dp > 1 and spec.collectives != "mpi" and len(timed) == spec.dp:
        # DDP: every dp rank through every bucket's rounds (rounds_time.py): uneven chunks and rows,
        # the tree's and the parameter server's ranks that end apart
        timed = ddp_steps(spec, hw, links, stages_of, timed, starts)
    worst_d = max(timed, key=lambda d: timed[d]["makespan"])
    makespan = timed[worst_d]["makespan"]
    dp_exposed = timed[worst_d]["dp_exposed"]
    critical_stage, parts = timed[worst_d]["critical_stage"], timed[worst_d]["parts"]
    step = makespan
    compute = max(r["time_s"]["compute"] for r in out)
    mem_max = {k: max(r["memory"][k] for r in out) for k in MEMORY_KINDS}
    exact = len(out) == spec.world
    return {
        "layout": layout_name(spec),
        "world": spec.world,
        "params": sum(unit_sizes(spec)),  # an MLP's layers, or resmlp's projections and blocks
        "spec": {k: v for k, v in spec.__dict__.items() if k != "widths"},
        "widths": _short(spec.widths),
        "n_layers": spec.n_layers,
        "hardware": hw.name,
        "links": {g: {"name": k.name, "alpha_s": k.alpha, "bytes_per_s": k.bw} for g, k in links.items()},
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
            "bubble_s": parts["bubble"],
            "dp_s": max(r["time_s"]["dp"] for r in out),
            "dp_exposed_s": dp_exposed,
            "data_s": data_s,
            "samples_per_s": spec.batch / step if step > 0 else float("inf"),
            # the rank that finishes last, its step cut into parts that add up to step_s
            "critical": {
                "rank": chain_ranks[worst_d, critical_stage],
                "stage": critical_stage,
                "parts_s": parts,
            },
        },
    }


def data_ready(spec: Spec, link) -> list[float]:
    """--data-source root: when each pipeline stage can start, per stage. Rank 0 sends every other
    rank its rows with blocking sends, in rank order, one grad-accum micro-step after another (x to
    first-stage ranks, int64 labels to the loss stage's: the last, zb-v's first): each send returns
    once its bytes are on the wire, so rank 0 starts after all of them, and rank r has its rows one
    latency after its last message left. Ranks of a stage start together (their collectives wait for
    the latest)."""
    S, per_stage, labels = spec.pp, spec.dp * spec.tp, loss_stage(spec.schedule, spec.pp)
    rows = {d: micro_rows(spec, d) for d in range(spec.dp)}
    wire, start = 0.0, [0.0] * S
    for dest in range(1, spec.world):
        s, d, _ = coords_of(dest, spec)
        for step in rows[d]:
            r = sum(step)
            wire += (
                (r * spec.widths[0] * spec.prec.act if s == 0 else 0) + (r * 8 if s == labels else 0)
            ) * link.beta
        if (s == 0 or s == labels) and dest // per_stage == s:
            start[s] = max(start[s], wire + link.alpha)
    start[0] = max(start[0], wire)
    return start


def _short(widths: list) -> list:
    return widths if len(widths) <= 12 else widths[:3] + ["..."] + widths[-2:]


def predict_from_config(cfg, world_size: int, steps: int | None = None, hw=None, routing=None) -> dict:
    """The prediction for a RunConfig, keyed like train.py's metrics so a comparison is one lookup:

        pred["comm"]["ranks"][r]["sent"][cat]   == metrics["comm"]["ranks"][r]["sent"][cat]
        pred["memory"]["ranks"][r][kind]        == metrics["memory"]["ranks"][r][kind]
        (params, grads, optimizer exactly; activations_peak for the numpy kernels' Context sizes)

    Bytes and messages are totals over `steps` steps (every step moves the same bytes), like the
    ledger's; `per_step` holds one step's. Time is on the `local` hardware profile unless `hw` is given.
    --experts: moe.predict_moe, exact from `routing` (the run's metrics["moe"]) or balanced without.
    """
    steps = steps if steps is not None else (cfg.steps or 1)
    if cfg.zero > 1 and cfg.tp > 1 and cfg.arch == "gpt" and not getattr(cfg, "experts", 0):  # zero_tp.py
        from .zero_mesh import without_zero
        from .zero_tp import predict_zero_tp_run

        plain = predict_from_config(without_zero(cfg), world_size, steps, hw)
        return predict_zero_tp_run(cfg, world_size, steps, hw, plain)
    dense_gpt = cfg.arch == "gpt" and not getattr(cfg, "experts", 0)
    if cfg.zero and (cfg.tp > 1 or cfg.pp > 1) and dense_gpt:  # ZeRO-1 in tp/pp shards (zero_mesh.py)
        from .zero_mesh import predict_zero_mesh_run, without_zero

        plain = predict_from_config(without_zero(cfg), world_size, steps, hw)
        return predict_zero_mesh_run(cfg, world_size, steps, hw, plain)
    if getattr(cfg, "cp", 1) > 1 and cfg.pp > 1 and cfg.experts:  # MoE stages, cp [x tp]: cp_moe_pipeline
        from .cp_moe_pipeline import predict_cp_moe_pipeline_run

        return predict_cp_moe_pipeline_run(cfg, world_size, steps, hw or hardware.load("local"), routing)
    if getattr(cfg, "cp", 1) > 1 and cfg.tp > 1 and cfg.pp > 1:  # pp x dp x cp x tp (cp_tp_pipeline.py)
        from .cp_tp_pipeline import predict_cp_tp_pipeline_run

        return predict_cp_tp_pipeline_run(cfg, world_size, steps, hw or hardware.load("local"))
    if cfg.experts and cfg.zero and cfg.tp > 1 and cfg.arch == "gpt":  # ZeRO of tp shares (gpt_moe_zero.py)
        from .gpt_moe_zero import predict_gpt_moe_zero_run

        return predict_gpt_moe_zero_run(cfg, world_size, steps, hw or hardware.load("local"), routing)
    if getattr(cfg, "cp", 1) > 1 and cfg.tp > 1 and cfg.experts:  # MoE blocks, cp x tp (cp_moe_tp.py)
        from .cp_moe_tp import predict_cp_moe_tp_run

        return predict_cp_moe_tp_run(cfg, world_size, steps, hw or hardware.load("local"), routing)
    if getattr(cfg, "cp", 1) > 1 and cfg.tp > 1:  # cp x tp (costmodel/cp_tp.py)
        from .cp_tp import predict_cp_tp_run

        return predict_cp_tp_run(cfg, world_size, steps, hw or hardware.load("local"))
    if getattr(cfg, "cp", 1) > 1 and cfg.pp > 1:  # cp inside pipeline stages (costmodel/cp_pipeline.py)
        from .cp_pipeline import predict_cp_pipeline_run

        return predict_cp_pipeline_run(cfg, world_size, steps, hw or hardware.load("local"))
    if getattr(cfg, "arch", "mlp") == "gpt" and cfg.experts and cfg.zero:  # ZeRO, experts, cp (gpt_moe_zero)
        from .gpt_moe_zero import predict_gpt_moe_zero_run

        return predict_gpt_moe_zero_run(cfg, world_size, steps, hw or hardware.load("local"), routing)
    if getattr(cfg, "cp", 1) > 1 and cfg.experts:  # MoE blocks with cp, experts over ep (cp_moe.py)
        from .cp_moe import predict_cp_moe_run

        return predict_cp_moe_run(cfg, world_size, steps, hw or hardware.load("local"), routing)
    if getattr(cfg, "cp", 1) > 1 and cfg.zero:  # ZeRO over dp x cp (costmodel/cp_zero.py)
        from .cp_zero import predict_cp_zero_run

        return predict_cp_zero_run(cfg, world_size, steps, hw or hardware.load("local"))
    if getattr(cfg, "cp", 1) > 1:  # context parallelism's bytes and activations (costmodel/cp.py)
        from .cp import predict_cp_run

        return predict_cp_run(cfg, world_size, steps, hw or hardware.load("local"))
    if getattr(cfg, "arch", "mlp") == "gpt" and cfg.experts and cfg.tp > 1 and cfg.pp == 1:  # gpt_moe_tp.py
        from .gpt_moe_tp import predict_gpt_moe_tp_run

        return predict_gpt_moe_tp_run(cfg, world_size, steps, hw or hardware.load("local"), routing)
    if getattr(cfg, "arch", "mlp") == "gpt" and cfg.experts and cfg.pp > 1:  # gpt_moe_pipeline.py (+ tp)
        from .gpt_moe_pipeline import predict_gpt_moe_pipeline_run

        return predict_gpt_moe_pipeline_run(cfg, world_size, steps, hw or hardware.load("local"), routing)
    if getattr(cfg, "arch", "mlp") == "gpt" and cfg.experts:  # MoE blocks, ep inside dp (gpt_moe.py)
        from .gpt_moe import predict_gpt_moe_run

        return predict_gpt_moe_run(cfg, world_size, steps, hw or hardware.load("local"), routing)
    if getattr(cfg, "arch", "mlp") == "gpt":  # a transformer's units and activations (costmodel/gpt.py)
        from .gpt import predict_run
        from .gpt_pipeline import predict_pipeline_run  # --pp
        from .gpt_tp import predict_tp_run  # --tp (and --sp)
        from .gpt_tp_pipeline import predict_tp_pipeline_run  # --tp with --pp

        run = predict_tp_run if cfg.tp > 1 else predict_pipeline_run if cfg.pp > 1 else predict_run
        run = predict_tp_pipeline_run if cfg.tp > 1 and cfg.pp > 1 else run
        return run(cfg, world_size, steps, hw or hardware.load("local"))
    spec = Spec.from_config(cfg, world_size)
    if spec.experts:
        from .moe import predict_moe

        return predict_moe(spec, hw or hardware.load("local"), routing, steps)
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
