"""The picture of `simpar plan --sweep`: bytes, memory and step time of one layout as one knob varies
(predicted by the cost model: nothing here is measured). The tour's and `simpar plot`'s pictures are in
plots.py; this file reuses its axis and colour helpers.
"""

from __future__ import annotations

from .draw import CAT_COLOURS, CATS, KIND_COLOURS, KINDS, _bytes_axis, _plt, _save


def plot_sweep(key: str, points, out: str, hardware_name: str, memory_limit: float | None = None) -> str:
    """Three panels vs the swept knob: bytes per rank by category, memory per rank by kind, step time."""
    plt = _plt()
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4.6))
    points = sorted(points, key=lambda vp: vp[0])
    xs = [v for v, _ in points]
    for cat in CATS:
        a.plot(
            xs, [p["comm"]["per_rank_max"][cat] for _, p in points], "o-", color=CAT_COLOURS[cat], label=cat
        )
    a.set_title("bytes sent per rank per step (busiest rank)")
    a.set_ylabel("bytes")
    _bytes_axis(a)
    bottom = [0.0] * len(points)
    for kind in KINDS:
        vals = [p["memory"]["max"][kind] for _, p in points]
        b.bar(
            range(len(xs)),
            vals,
            bottom=bottom,
            color=KIND_COLOURS[kind],
            label=kind.replace("_peak", " (peak)"),
        )
        bottom = [s + v for s, v in zip(bottom, vals)]
    if memory_limit:
        b.axhline(memory_limit, color="black", linestyle="--", linewidth=1, label="memory limit")
    b.set_xticks(range(len(xs)), [str(x) for x in xs])
    b.set_title("memory per rank (largest of each kind)")
    b.set_ylabel("bytes")
    _bytes_axis(b)
    parts = (  # the critical rank's timeline: the stacked bars add up to the step
        ("compute", "compute"),
        ("tp", "tp comm"),
        ("pp", "pp sends (exposed)"),
        ("bubble", "bubble"),
        ("dp", "dp/zero comm (exposed)"),
        ("data", "data"),
    )
    bottom = [0.0] * len(points)
    for key_t, label in parts:
        vals = [p["time"]["critical"]["parts_s"][key_t] * 1e3 for _, p in points]
        if any(vals):
            c.bar(range(len(xs)), vals, bottom=bottom, label=label)
            bottom = [s + v for s, v in zip(bottom, vals)]
    c.set_xticks(range(len(xs)), [str(x) for x in xs])
    c.set_title(f"predicted step time on {hardware_name} (rank that finishes last)")
    c.set_ylabel("milliseconds per step")
    for ax in (a, b, c):
        ax.set_xlabel(key)
        ax.legend(fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    if len(xs) > 1 and xs[0] > 0 and xs[-1] / xs[0] >= 8:
        a.set_xscale("log", base=2)
    a.set_xticks(xs, [str(x) for x in xs])
    a.minorticks_off()
    fig.suptitle(
        f"simpar plan --sweep {key}={','.join(map(str, xs))}  ({points[0][1]['layout']} ... "
        f"{points[-1][1]['layout']})",
        fontsize=11,
    )
    fig.tight_layout()
    return _save(fig, out)
