"""The comparison plots: what each layout sent and held, measured, next to what the cost model predicts.

    tour_plots(results, out_dir)     after the tour: comm_by_layout.png, comm_scaling.png (scaling.py),
                                     memory_by_layout.png (+ timeline.png if a trace JSON is there)
    python -m simpar plot A.json B.json ... -o compare.png        compare_figure: the same, from metrics files
    python -m simpar plot --timeline trace.json -o timeline.png   (simpar.timeline)
    plot_sweep(...)                  the figure of `simpar plan --sweep`

Matplotlib with the Agg backend (no display needed); every file is written to a temporary name and
renamed into place (report.atomic_write), so a half-written PNG never appears.
"""

from __future__ import annotations

import glob
import os

from ..config import SimparError
from ..files import read_json
from .draw import CAT_COLOURS, CATS, KIND_COLOURS, KINDS, _bytes_axis, _plt, _save, _traffic_label
from .metrics import alltoall_per_step, modeled_ops
from .scaling import comm_scaling


def _prediction(metrics: dict) -> dict | None:
    """The cost model's prediction for the run a metrics file describes (None if it cannot say)."""
    from ..config import RunConfig
    from ..costmodel import predict_from_config

    try:
        config, world = metrics["config"], metrics["world_size"]
        cfg = RunConfig(**{k: v for k, v in config.items() if k in RunConfig.__dataclass_fields__})
    except (KeyError, TypeError, AttributeError):  # a metrics file from another version: no config to
        return None  # predict from, so plot the measurement alone
    try:
        return predict_from_config(cfg, world, steps=1, routing=metrics.get("moe"))  # MoE: as routed
    except SimparError:  # a layout the cost model declines; any other error is a bug in it and shows
        return None


# -- (a) traffic per layout, (c) memory per layout ----------------------------------------------------


def comm_by_layout(ax, results) -> None:
    """Stacked bars: bytes per step by category (all ranks together); a black tick = the prediction."""
    names = [_traffic_label(n, m) for n, m in results]
    bottom = [0.0] * len(results)
    a2a = [alltoall_per_step(m) for _, m in results]
    for cat in CATS:
        vals = [m["comm"]["per_step"][cat] for _, m in results]
        if cat == "activation":  # expert parallelism's all-to-all gets a segment of its own
            vals = [v - a for v, a in zip(vals, a2a)]
        if any(vals):  # no layout moves this category: no bars, so no legend entry either
            ax.bar(names, vals, bottom=bottom, color=CAT_COLOURS[cat], label=cat)
            bottom = [b + v for b, v in zip(bottom, vals)]
        if cat == "activation" and any(a2a):
            ax.bar(
                names, a2a, bottom=bottom, color=CAT_COLOURS[cat], hatch="//", label="activation: all-to-all"
            )
            bottom = [b + v for b, v in zip(bottom, a2a)]
    predicted = [(i, _prediction(m)) for i, (_, m) in enumerate(results)]
    xs = [i for i, p in predicted if p and p["comm"]["per_step"]]
    ys = [sum(p["comm"]["per_step"].values()) for _, p in predicted if p and p["comm"]["per_step"]]
    if xs:
        ax.scatter(xs, ys, marker="_", s=500, color="black", linewidths=2, zorder=3, label="cost model")
    ax.margins(y=0.08)
    ax.set_ylabel("bytes sent per training step (all ranks)")
    _fitted_title(
        ax, [["Traffic per step by category:", "measured by the ledger (bars),", "cost model (ticks)"]], 12
    )
    _bytes_axis(ax)
    top = max(bottom + ys, default=0)
    if top > 0:  # headroom above the tallest bar and its tick (the binary ticks would end at it)
        ax.set_ylim(0, 1.12 * top)
    ax.tick_params(axis="x", rotation=35)
    ax.legend()


def memory_by_layout(ax, results) -> None:
    """Stacked bars: memory of the fullest rank of each layout, by kind."""
    names = [n for n, _ in results]
    fullest = [max(m["memory"]["ranks"], key=lambda r: sum(r[k] for k in KINDS)) for _, m in results]
    bottom = [0.0] * len(results)
    for kind in KINDS:
        vals = [r[kind] for r in fullest]
        ax.bar(names, vals, bottom=bottom, color=KIND_COLOURS[kind], label=kind.replace("_peak", " (peak)"))
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.margins(y=0.08)
    ax.set_ylabel("bytes held by the fullest rank")
    title = ["Memory of the fullest rank by kind,", "measured from its arrays (no prediction drawn)"]
    _fitted_title(ax, [title, activations_note(results)], 9)
    _bytes_axis(ax)
    ax.tick_params(axis="x", rotation=35)
    ax.legend()


# What a rank of each kind of layout keeps for backward, said only for the kinds in the figure (an --sp
# line in a plot without --sp runs would explain bars that are not there).
KEPT_ACTIVATIONS = {
    "dp": "dp: 1/p of the rows",
    "tp": "tp: every row (its column slice, plus each layer's full-width input)",
    "sp": "tp with --sp: LayerNorm's and the residual's for 1/t of the rows, the matmuls' for every row",
    "pp": "pp: its stage's layers only, for each micro-batch in flight",
    "ep": "ep: also, for its experts, the rows its ep group sent them (inputs and pre-activations)",
}


def activations_note(results) -> list[str]:
    """The memory panel's note, in pieces: what a rank keeps for backward, for the layouts plotted."""
    kinds = set()
    for _, m in results:
        cfg, mesh = m.get("config", {}), m.get("mesh", {})
        dp, tp, pp = (mesh.get(a, cfg.get(a) or 1) for a in ("dp", "tp", "pp"))
        kinds |= {k for k, on in (("dp", dp > 1), ("pp", pp > 1), ("ep", (cfg.get("ep") or 1) > 1)) if on}
        if tp > 1:
            kinds.add("sp" if cfg.get("sp") else "tp")
    said = [text for kind, text in KEPT_ACTIVATIONS.items() if kind in kinds]
    if not said:
        return []
    return ["activations kept per rank --", *[f"{text};" for text in said[:-1]], said[-1]]


def _fitted_title(ax, lines: list[list[str]], fontsize: float) -> None:
    """An axes title of these lines, each no wider than the axes: a line's pieces are joined while
    they fit and broken between pieces where they do not (a piece wider than the axes is wrapped
    at spaces). A title wider than its panel runs into the next one: two panels side by side in
    `simpar plot` leave each about 4 inches."""
    import textwrap

    inches = ax.get_position().width * ax.figure.get_figwidth()
    # DejaVu Sans averages about half an em per character of such text; 72 points per inch
    chars = max(20, int(inches * 72 / (0.5 * fontsize)))
    out = []
    for pieces in lines:
        current = ""
        for piece in pieces:
            if current and len(current) + 1 + len(piece) <= chars:
                current += " " + piece
                continue
            if current:
                out.append(current)
            *full, current = textwrap.wrap(piece, chars, break_on_hyphens=False) or [""]
            out += full
        if current:
            out.append(current)
    ax.set_title("\n".join(out), fontsize=fontsize)


def _bar_figure(results, draw, path: str, title: str) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6.5, 0.75 * len(results) + 3), 4.8))
    draw(ax, results)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


# -- (b) scaling, from the cost model, with the measured points -----------------------------------------


# -- the tour and `simpar plot` ------------------------------------------------------------------------


def tour_plots(results, out_dir: str) -> list[str]:
    """The tour's figures in out_dir; returns the paths written."""
    if not results:
        return []
    modeled = any(modeled_ops(m) for _, m in results)
    written = [
        _bar_figure(
            results,
            comm_by_layout,
            os.path.join(out_dir, "comm_by_layout.png"),
            "the same model and data on every layout"
            + ("; (modeled): MPI's own collectives, bytes booked from the formula" if modeled else ""),
        ),
        _bar_figure(
            results,
            memory_by_layout,
            os.path.join(out_dir, "memory_by_layout.png"),
            "activations: peak kept for backward; "
            + ("ep shards the experts" if any(m.get("moe") for _, m in results) else "ZeRO shards")
            + " params/grads/optimizer",
        ),
    ]
    if results[0][1]["config"]["arch"] != "gpt":  # the scaling curves vary an MLP's widths (scaling.py)
        written.insert(1, comm_scaling(os.path.join(out_dir, "comm_scaling.png"), results))
    written += _timelines(out_dir)
    return written


def _timelines(out_dir: str) -> list[str]:
    """timeline.png for each pipeline trace JSON found in out_dir (simpar.timeline.plot_timeline)."""
    traces = sorted(set(glob.glob(os.path.join(out_dir, "*trace*.json"))))
    if not traces:
        return []
    from .timeline import plot_timeline

    out = []
    for path in traces:
        stem = os.path.splitext(os.path.basename(path))[0]
        png = os.path.join(out_dir, "timeline.png" if stem == "trace" else f"timeline-{stem}.png")
        try:
            plot_timeline(path, png)
            out.append(png)
        except (SimparError, ValueError, KeyError):
            continue  # not a pipeline trace: nothing to draw
    return out


def compare_figure(results):
    """`simpar plot`'s figure: traffic and memory of each layout, side by side. Constrained layout
    leaves room for the suptitle and each panel's title, which _fitted_title wraps to its panel."""
    plt = _plt()
    width = max(10, 1.3 * len(results) + 6)
    fig, (traffic, memory) = plt.subplots(1, 2, figsize=(width, 5.4), layout="constrained")
    comm_by_layout(traffic, results)
    memory_by_layout(memory, results)
    fig.suptitle("simpar: " + ", ".join(n for n, _ in results), fontsize=10)
    return fig


def load_metrics(path: str) -> dict:
    m = read_json(path, "metrics file")
    if not isinstance(m, dict) or not all(k in m for k in ("comm", "memory", "config", "world_size")):
        raise SimparError(f"{path} is not a simpar metrics file (written by `simpar train --metrics-out`)")
    return m
