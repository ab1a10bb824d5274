"""What `simpar plan` prints: the per-rank table of one layout, and the ranked `--compare` list.

The numbers all come from the cost model (simpar/costmodel/); this module only lays them out, in
decimal units as vendors quote link and memory sizes. The command line is simpar/cli/plan.py.
"""

from __future__ import annotations

import json

from .. import costmodel as cm
from ..costmodel import hardware
from ..costmodel.compare import explain, fits_in, rank_layouts
from ..units import fmt_si as fmt_bytes
from ..units import fmt_time


def hardware_note(hw) -> list[str]:
    """A line saying `local` is the uncalibrated defaults (no cache file), else nothing: times on
    defaults are rough, and the reader should know which it is without looking for a file."""
    if hw is not hardware.LOCAL_DEFAULTS:
        return []
    return [
        f"note: hardware local is the uncalibrated defaults ({hardware.cache_path()} does not exist); "
        "times are rough -- run `python -m simpar bench --calibrate` to measure this machine"
    ]


def grads_breakdown(sp: dict, widths: list, grads: float) -> str:
    """ZeRO-2/3 name what their gradient memory holds besides the 1/p shard: one whole layer's
    gradient buffer (the largest layer, filled by backward, then reduce-scattered), or with ZeRO-2
    and gradient accumulation the whole model's (accumulated over micro-steps, reduce-scattered once)."""
    if sp["zero"] < 2:
        return ""
    sizes = [a * b + b for a, b in zip(widths[:-1], widths[1:])]
    whole = sp["zero"] == 2 and sp["grad_accum"] > 1
    buffer = (sum(sizes) if whole else max(sizes)) * cm.PRECISIONS[sp["precision"]].grad
    name, why = (
        ("accumulation buffer", "ZeRO-2 with --grad-accum keeps the whole gradient until one reduce-scatter")
        if whole
        else (
            "one-layer gradient buffer",
            "the largest layer's full gradient, held while it is reduce-scattered",
        )
    )
    shard = fmt_bytes(grads - buffer)
    return (
        f"grads {fmt_bytes(grads)} = shard {shard} (1/{sp['dp']} of every layer's) "
        f"+ {name} {fmt_bytes(buffer)} ({why})"
    )


def format_plan(pred: dict, hw, limit: float | None, widths: list | None = None) -> str:
    sp = pred["spec"]
    ranks_word = "ranks" if pred["world"] > 1 else "rank"
    lines = [
        f"simpar plan: {describe_model(pred)}, global batch {sp['batch']}, {pred['layout']} on "
        f"{pred['world']} {ranks_word}, {sp['precision']} {sp['optimizer']}, hardware {hw.name}",
        *hardware_note(hw),
        "links: "
        + "; ".join(
            f"{g} group -> {link['name']} ({fmt_bytes(link['bytes_per_s'])}/s, {fmt_time(link['alpha_s'])})"
            for g, link in pred["links"].items()
            if g != "world" and sp[g] > 1
        )
        if pred["world"] > 1
        else "links: none (one rank)",
    ]
    ranks = pred["comm"]["ranks"]
    shown = (
        ranks if len(ranks) <= 16 else [r for r in ranks if r["coords"]["dp"] == 0 and r["coords"]["tp"] == 0]
    )
    lines += [
        "",
        "per rank per step"
        + ("" if shown is ranks else " (first rank of each stage; others differ by a few bytes)"),
        f"{'rank':>5} {'pp,dp,tp':>9} | {'data':>9} {'model':>9} {'activation':>10} {'msgs':>6} | "
        f"{'params':>9} {'grads':>9} {'optimizer':>9} {'activations':>11} {'total':>9}",
    ]
    if len(shown) > 12:
        shown = shown[:6] + [None] + shown[-3:]
    for r in shown:
        if r is None:
            lines.append(f"{'...':>5}")
            continue
        c, m = r["coords"], r["memory"]
        lines.append(
            f"{r['rank']:>5} {c['pp']:>5},{c['dp']},{c['tp']} | "
            + " ".join(
                f"{fmt_bytes(r['sent'][k]):>{w}}" for k, w in (("data", 9), ("model", 9), ("activation", 10))
            )
            + f" {sum(r['messages'].values()):>6} | "
            + " ".join(
                f"{fmt_bytes(m[k]):>{w}}"
                for k, w in (("params", 9), ("grads", 9), ("optimizer", 9), ("activations_peak", 11))
            )
            + f" {fmt_bytes(sum(m.values())):>9}"
        )
    if pred["comm"]["total_sent"]:
        tot = pred["comm"]["total_sent"]
        lines.append("all ranks together: " + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in tot.items()))
    lines += ["", "collectives (slowest rank): time = latency (alpha) + bandwidth (beta) + reduction (gamma)"]
    for op, v in sorted(pred["comm"]["by_op_slowest_rank"].items()):
        ts = v["time_s"]
        lines.append(
            f"  {op:<28} {v['link']:<14} {fmt_bytes(v['sent']):>9} {v['messages']:>6} msgs  "
            f"{fmt_time(ts['latency'])} + {fmt_time(ts['bandwidth'])} + {fmt_time(ts['reduction'])}"
            f" = {fmt_time(sum(ts.values()))}"
        )
    mem = pred["memory"]
    verdict = ""
    if limit:
        ratio = mem["max_total"] / limit
        fit = "fits" if ratio <= 1 else "DOES NOT FIT"
        verdict = f"  vs limit {fmt_bytes(limit)}: {fit} ({ratio:.3g}x the limit)"
    lines += [
        "",
        "memory per rank (max): "
        + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in mem["max"].items())
        + f"; total {fmt_bytes(mem['max_total'])}"
        + verdict,
    ]
    breakdown = grads_breakdown(sp, widths, mem["max"]["grads"]) if widths else ""
    if breakdown:
        lines.append("  " + breakdown)
    if sp["pp"] > 1:
        keys = ("batch", "pp", "schedule", "microbatches", "virtual_stages")
        formula = cm.bubble_formula(cm.Spec(widths=[1, 1], **{k: sp[k] for k in keys}))
        lines.append(f"pipeline bubble ({sp['schedule']}): {formula} = {pred['bubble']:.1%} of the step")
    lines += ["", *format_step_time(pred, hw)]
    return "\n".join(lines)


# What each part of the critical rank's timeline is called when printed (costmodel.TIMELINE_PARTS)
PART_NAMES = {
    "compute": "compute",
    "tp": "tp",
    "pp": "pp sends exposed",
    "dp": "dp/zero exposed",
    "data": "data",
    "bubble": "bubble",
}


def format_step_time(pred: dict, hw) -> list[str]:
    """The step as the sum of ONE rank's timeline (the rank that finishes last: the others wait for it
    at the loss all-reduce), then each kind's largest total over all ranks, which need not add up: they
    come from different ranks and pipeline sends and DDP buckets partly hide behind compute."""
    t, crit = pred["time"], pred["time"]["critical"]
    parts = crit["parts_s"]
    shown = [k for k in PART_NAMES if k == "compute" or parts[k] > 0]
    where = f"rank {crit['rank']}" + (f", stage {crit['stage']}" if pred["spec"]["pp"] > 1 else "")
    sp = pred["spec"]
    totals = [("compute", t["compute_s"])] + [
        (g, t[f"{g}_s"]) for g in ("tp", "pp", "dp") if sp[g] > 1 or (g == "dp" and sp["zero"])
    ]
    out = [
        f"time per step on {hw.name}, on the rank that finishes last ({where}): "
        + " + ".join(f"{PART_NAMES[k]} {fmt_time(parts[k])}" for k in shown),
        f"  = {fmt_time(t['step_s'])} per step, {t['samples_per_s']:,.0f} samples/s",
    ]
    if "bubble" in shown:
        out.append("  (bubble: idle, waiting for a neighbouring stage's activations or gradients)")
    if len(totals) > 1:
        out.append(
            "  largest per rank over all ranks (not a sum: partly overlapped, from different ranks): "
            + ", ".join(f"{g} {fmt_time(v)}" for g, v in totals)
        )
    return out


def sp_saving(spec, pred: dict, other: dict) -> str:
    """resmlp under --tp: the activation memory and bytes with and without --sp, side by side (`pred`
    is the plan for `spec`, `other` the same with --sp flipped)."""
    with_sp, without = (pred, other) if spec.sp else (other, pred)
    act = [p["memory"]["max"]["activations_peak"] for p in (without, with_sp)]
    sent = [p["comm"]["per_rank_max"]["activation"] for p in (without, with_sp)]
    return (
        f"\nsequence parallelism (--sp, Korthikanti et al. 2022): activations per rank {fmt_bytes(act[0])} "
        f"without, {fmt_bytes(act[1])} with ({act[1] / act[0]:.0%}: LayerNorm, residual and projections "
        f"keep 1/{spec.tp} of the rows); activation bytes per rank {fmt_bytes(sent[0])} vs "
        f"{fmt_bytes(sent[1])} "
        "(reduce-scatter + all-gather = all-reduce"
        + (f"; a stage boundary carries 1/{spec.tp} of the rows" if spec.pp > 1 else "")
        + "), plus the sp gradient all-reduce "
        f"{fmt_bytes(with_sp['comm']['per_rank_max']['model'] - without['comm']['per_rank_max']['model'])}"
    )


# -- --sweep ---------------------------------------------------------------------------------------------


def describe_model(pred: dict) -> str:
    """One line naming the planned model: its widths (or the stand-in's shape) and parameter count."""
    w, P = pred["widths"], pred["params"]
    shape = (
        "-".join(map(str, w)) if "..." not in w else f"stand-in, {pred['n_layers']} layers of width {w[1]}"
    )
    kind = "residual MLP" if pred["spec"].get("arch") == "resmlp" else "MLP"
    size = f"{P / 1e9:,.2f} B params" if P >= 1e9 else f"{P / 1e6:,.3g} M params"
    return f"{kind} {shape} ({size})"


def print_compare(spec, hw, world: int | None, limit: float | None, as_json: bool) -> int:
    """`plan --compare`: the ranked table and the explanation."""
    ranked, invalid = rank_layouts(spec, hw, world, limit)
    fits = fits_in(limit)
    if as_json:
        print(json.dumps({"world": world, "memory_limit": limit, "ranked": ranked}, indent=1, default=str))
        return 0
    print(
        f"simpar plan --compare: {describe_model(ranked[0])}, batch {spec.batch}, "
        f"{world} rank{'s' if world > 1 else ''} on {hw.name}, {spec.precision} {spec.optimizer}"
        + (f", memory limit {fmt_bytes(limit)} per rank" if limit else "")
    )
    for line in hardware_note(hw):
        print(line)
    with_data = any(p["time"]["critical"]["parts_s"]["data"] > 0 for p in ranked[:15])
    print(
        "columns after mem/rank: the step of the rank that finishes last, in parts that add up to it "
        "(compute + tp + pp+bubble + dp/zero exposed" + (" + data)" if with_data else ")")
    )
    print(
        f"{'#':>3} {'layout':<24} {'step':>9} {'samples/s':>11} {'mem/rank':>9} {'compute':>9} {'tp':>9} "
        f"{'pp+bubble':>9} {'dp/zero':>9}" + (f" {'data':>9}" if with_data else "")
    )
    for i, p in enumerate(ranked[:15], 1):
        t, parts = p["time"], p["time"]["critical"]["parts_s"]
        print(
            f"{i:>3} {p['layout']:<24} {fmt_time(t['step_s']):>9} {t['samples_per_s']:>11,.0f} "
            f"{fmt_bytes(p['memory']['max_total']):>9}{' ' if fits(p) else '!'}"
            f"{fmt_time(parts['compute']):>9} {fmt_time(parts['tp']):>9} "
            f"{fmt_time(parts['pp'] + parts['bubble']):>9} {fmt_time(parts['dp']):>9}"
            + (f" {fmt_time(parts['data']):>9}" if with_data else "")
        )
    if len(ranked) > 15:
        print(f"    ... {len(ranked) - 15} more")
    notes = [f"{invalid} factorizations skipped as invalid for this model"] if invalid else []
    if limit:
        over = sum(not fits(p) for p in ranked)
        notes.append(
            f"{over} of {len(ranked)} layouts exceed the memory limit (marked !)"
            if over
            else "every layout fits in memory"
        )
    print("(" + "; ".join(notes) + ")" if notes else "")
    print("\n" + "\n".join(explain(ranked, limit, fits)))
    return 0


def params_in_words(n: int) -> str:
    return f"{n / 1e9:,.2f} B" if n >= 1e9 else f"{n / 1e6:,.3g} M" if n >= 1e6 else f"{n:,}"


def moe_params_line(spec, par: dict, from_params: bool = False) -> str:
    """How many parameters the MoE model has in all and on one rank. With --experts every hidden layer
    is E experts (Shazeer et al. 2017), so the model is about E times the dense model --params sized
    (`from_params`: say so, with that dense model's size)."""
    dense = sum(a * b + b for a, b in zip(spec.widths[:-1], spec.widths[1:]))
    total = par["non_expert"] + par["experts_total"]
    per_rank = par["non_expert"] + par["experts_per_rank"]
    return (
        f"parameters: {params_in_words(total)} in all = {params_in_words(par['non_expert'])} non-expert "
        f"(first and last layer, routers) + {spec.experts} experts x "
        f"{params_in_words(par['experts_total'] // spec.experts)} (one Linear in each of the "
        f"{spec.n_layers - 2} MoE layers); per rank "
        f"{params_in_words(per_rank)} (non-expert + {spec.experts // spec.ep} experts)"
        + (
            f"; --params sized the dense MLP ({params_in_words(dense)}) before its hidden layers "
            f"became {spec.experts} experts each"
            if from_params
            else ""
        )
    )


def format_moe_plan(spec, pred: dict, hw, from_params: bool = False) -> str:
    """What `plan --experts` prints: the parameters in all and per rank, capacity, the all-to-all per
    rank (formula and numbers), the gradient all-reduces, memory and the step time of the busiest rank."""
    D, P, E, K, B = spec.dp, spec.ep, spec.experts, spec.top_k, spec.batch
    N = B // spec.grad_accum + (1 if B % spec.grad_accum else 0)  # the first (largest) micro-step
    busiest = max(pred["comm"]["ranks"], key=lambda r: r["sent"]["activation"])
    par, link = pred["params"], pred["link"]
    shown = spec.widths if len(spec.widths) <= 8 else spec.widths[:3] + ["..."] + spec.widths[-2:]
    lines = [
        f"simpar plan (mixture of experts): MLP {'-'.join(map(str, shown))}, {spec.n_layers - 2} MoE "
        f"layer(s) of {E} experts, top-{K}, global batch {B}, dp {D} x ep {P}, {spec.precision} "
        f"{spec.optimizer}, hardware {hw.name}",
        *hardware_note(hw),
        moe_params_line(spec, par, from_params),
        f"capacity per expert: ceil(C*K*B/E) = ceil({spec.capacity_factor:g}*{K}*{B}/{E}) = "
        f"{pred['capacity']} tokens"
        if spec.grad_accum == 1
        else f"capacity per expert and micro-step (--grad-accum {spec.grad_accum}: N = {N} of the {B} rows "
        f"routed together): ceil(C*K*N/E) = ceil({spec.capacity_factor:g}*{K}*{N}/{E}) = "
        f"{pred['capacity']} tokens",
        f"routing: {pred['routing']} (an imbalance u above C is capped at C: the expert drops the rest)",
        "all-to-all per MoE layer per rank, balanced: 4 x (P-1)/P x (B/D) x K x width x bytes "
        f"(dispatch, combine and their gradients); the busiest rank (rank {busiest['rank']}) per step:"
        if spec.alltoall == "pairwise"
        else f"all-to-all by Bruck's algorithm: ceil(log2 P) = {(P - 1).bit_length()} messages each, a "
        "piece forwarded once per set bit of its relative destination (balanced, P a power of two: "
        "(P/2) log2 P pieces of (B/D) x K/P rows, against P-1 pairwise); the busiest rank "
        f"(rank {busiest['rank']}) per step:",
    ]
    for op in ("ep-dispatch", "ep-combine", "ep-combine-grad", "ep-dispatch-grad"):
        entry = busiest["by_op"].get(f"activation/{op}")
        if entry:
            lines.append(f"  {op:<22} {fmt_bytes(entry['sent']):>10} in {entry['messages']} messages")
    for op, what in (
        ("grad-allreduce", f"{par['non_expert']:,} non-expert parameters over {D} ranks"),
        ("expert-grad-allreduce", f"{par['experts_per_rank']:,} expert parameters over {D // P} ranks"),
    ):
        entry = busiest["by_op"].get(f"model/{op}")
        if entry:
            lines.append(f"  {op:<22} {fmt_bytes(entry['sent']):>10} ({what})")
    mem = pred["memory"]["ranks"][0]
    lines.append(
        f"memory per rank: params {fmt_bytes(mem['params'])}, grads {fmt_bytes(mem['grads'])}, optimizer "
        f"{fmt_bytes(mem['optimizer'])}; its experts {fmt_bytes(par['experts_per_rank'] * spec.prec.param)}"
        f" = 1/{P} of {fmt_bytes(par['experts_total'] * spec.prec.param)}; activations kept for "
        f"backward {fmt_bytes(mem['activations_peak'])}"
    )
    t = pred["time"]
    where = f" on {link['name']}" if link else ""
    lines.append(
        f"step time: {fmt_time(t['step_s'])} = compute {fmt_time(t['compute_s'])} + communication "
        f"{fmt_time(t['comm_s'])}{where} (blocking, nothing overlapped)"
    )
    return "\n".join(lines)
