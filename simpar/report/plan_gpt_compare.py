"""What `simpar plan --arch gpt --compare --world N` prints: every dp x cp x tp x pp split of N GPUs,
ranked (costmodel/gpt_compare.py), as a table, and the winner in words.

    python -m simpar plan --arch gpt --model gpt3-175b --seq-len 131072 --batch 16 --microbatches 16 \
        --sp --recompute selective --precision mixed --optimizer adam --hardware dgx-h100 \
        --compare --world 2048

Long sequences are where cp shows: without it the activations of s tokens do not fit one GPU whatever
tp and pp do; with it they are divided by C (docs/context.md).
"""

from __future__ import annotations

import json

from ..costmodel.gpt_compare import rank_gpt_layouts
from ..units import fmt_si, fmt_time

SHOWN = 12  # rows of the table; --json gives them all


def layout_label(lay: dict) -> str:
    parts = [f"{k}{lay[k]}" for k in ("dp", "cp", "tp", "pp") if lay.get(k, 1) > 1]
    return "x".join(parts) or "1 GPU"


def print_gpt_compare(shape, batch: int, hw, world: int, limit: float | None, q: dict, as_json: bool) -> int:
    ranked, invalid = rank_gpt_layouts(shape, batch, hw, world, limit, q)
    if as_json:
        out = [{k: v for k, v in p.items() if k != "model"} for p in ranked]
        print(json.dumps({"world": world, "memory_limit": limit, "ranked": out}, indent=1, default=str))
        return 0
    fits = [not limit or p["memory_per_gpu"]["total"] <= limit for p in ranked]
    head = f"{len(ranked)} splits of {world} GPUs into dp x cp x tp x pp ({invalid} do not fit the shape)"
    lines = [head + (f", memory limit {fmt_si(limit)} per GPU" if limit else "") + ":"]
    lines.append(
        f"  {'layout':<20} {'memory/GPU':>11} {'activations':>12} {'cp traffic':>11} {'step':>10} {'MFU':>6}"
    )
    for p, ok in list(zip(ranked, fits))[:SHOWN]:
        mem = p["memory_per_gpu"]
        lines.append(
            f"  {layout_label(p['layout']):<20} {fmt_si(mem['total']):>11} {fmt_si(mem['activations']):>12} "
            f"{fmt_si(p['cp_bytes_per_gpu']):>11} {fmt_time(p['time']['step_s']):>10} {p['mfu']:>6.1%}"
            + ("" if ok else "  (over the limit)")
        )
    if len(ranked) > SHOWN:
        lines.append(f"  ... {len(ranked) - SHOWN} more (--json lists them all)")
    best = ranked[0]
    if not fits[0]:
        lines.append("no split fits the memory limit: more GPUs, --recompute, --sp or --zero")
    else:
        cp, acts = best["layout"]["cp"], fmt_si(best["memory_per_gpu"]["activations"])
        why = f"cp {cp} divides its activations by {cp} ({acts} per GPU)" if cp > 1 else "no cp needed"
        step = fmt_time(best["time"]["step_s"])
        lines.append(f"fastest that fits: {layout_label(best['layout'])}, {step} a step; {why}")
    print("\n".join(lines))
    return 0
