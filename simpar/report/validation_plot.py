"""The picture of `simpar validate -o`: every point published (x) against predicted (y), log-log, with
the line of agreement and the +-20% band; one colour per kind of measurement."""

from __future__ import annotations

from .draw import _plt, _save

COLOURS = {
    "time": "#4C72B0",
    "algbw": "#55A868",
    "busbw": "#8172B2",
    "tflops": "#C44E52",
    "bandwidth": "#DD8452",
    "latency": "#937860",
}


def draw(rows: list[dict], path: str) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 6.0))
    lo = min(min(r["value"], r["predicted"]) for r in rows) / 2
    hi = max(max(r["value"], r["predicted"]) for r in rows) * 2
    xs = [lo, hi]
    ax.plot(xs, xs, color="black", lw=1, label="predicted = published")
    ax.fill_between(xs, [x * 0.8 for x in xs], [x * 1.2 for x in xs], color="grey", alpha=0.2, label="+-20%")
    for q, colour in COLOURS.items():
        pts = [r for r in rows if r["quantity"] == q]
        if not pts:
            continue
        unit = pts[0]["unit"]
        ax.scatter(
            [r["value"] for r in pts],
            [r["predicted"] for r in pts],
            s=18,
            color=colour,
            label=f"{q} ({unit}), {len(pts)}",
            edgecolors=["red" if not r["ok"] else colour for r in pts],
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("published (each point in its source's unit)")
    ax.set_ylabel("predicted by simpar's cost model")
    n_bad = sum(not r["ok"] for r in rows)
    ax.set_title(f"simpar validate: {len(rows)} published points, {n_bad} outside tolerance")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)
