"""How the bytes grow: per-rank traffic per step as the world size, the hidden width and the batch vary.

    comm_scaling(path, results)      comm_scaling.png of the tour (and `simpar plot --scaling`): small
                                     multiples, one column per layout family and one row per axis; lines =
                                     the cost model, dots = the runs measured

The lines are closed forms (costmodel.predict on the `local` profile), so they extend past the runs that
fit this machine; the dots sit on them because the ledger and the cost model agree exactly. A mixture
of experts' lines assume balanced routing (no run routed those sizes), so its dots, as routed, sit near
them: above where the routing was unbalanced, below where capacity dropped tokens.
"""

from __future__ import annotations

from ..config import SimparError
from .draw import CATS, _bytes_axis, _plt, _save, _traffic_label

FACTORS = (1, 2, 4, 8, 16, 32, 64)  # the width and batch panels: the run's size times f/8


def _per_rank(pred: dict) -> float:
    """Bytes the busiest rank sends per step (all three categories)."""
    return max(sum(r["sent"][c] for c in CATS) for r in pred["comm"]["ranks"])


def _family_curve(config: dict, key: str, values: list[int]):
    """Predicted per-rank bytes of one layout family as `key` (world | width | batch) varies."""
    from ..config import RunConfig
    from ..costmodel import Spec, check, predict
    from ..costmodel.hardware import LOCAL_DEFAULTS
    from ..costmodel.moe import predict_moe

    xs, ys = [], []
    for v in values:
        cfg = RunConfig(**{k: val for k, val in config.items() if k in RunConfig.__dataclass_fields__})
        spec = Spec.from_config(cfg)
        d = dict(spec.__dict__)
        if key == "world":
            axis = next(a for a in ("tp", "pp", "dp") if d[a] > 1)
            d[axis] = v
        elif key == "width":
            d["widths"] = [spec.widths[0]] + [v] * (len(spec.widths) - 2) + [spec.widths[-1]]
        else:
            d["batch"] = v
        try:
            spec = check(Spec(**d))  # a size `train` would refuse (e.g. --ep not dividing dp) is no point
            # --experts: sizes that did not run have no routing to predict from, so the line assumes
            # balanced routing without drops (moe.predict_moe); the run's own dot is as routed
            pred = predict_moe(spec, LOCAL_DEFAULTS) if spec.experts else predict(spec, LOCAL_DEFAULTS)
        except SimparError:
            continue
        if _per_rank(pred) > 0:  # one rank sends nothing: no point on a log axis
            xs.append(v)
            ys.append(_per_rank(pred))
    return xs, ys


def comm_scaling(path: str, results) -> str:
    """Per-rank bytes per step vs world size, hidden width and batch: lines = cost model, dots = measured.

    Small multiples: one column per layout family (layouts whose predictions coincide share one), one row
    per axis, the same log scale along a row, so no line hides another."""
    plt = _plt()
    measured = [(n, m) for n, m in results if m["world_size"] > 1]
    base = results[0][1]["config"]
    width0 = base["layers"][1] if len(base["layers"]) > 2 else base["layers"][0]
    panels = (
        ("world", "ranks in the layout's\nparallel dimension", [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]),
        ("width", "hidden width\n(elements)", sorted({width0 * f // 8 for f in FACTORS} - {0})),
        ("batch", "global batch\n(samples)", sorted({max(1, base["batch"] * f // 8) for f in FACTORS})),
    )
    # Layouts whose predicted curves coincide in all three rows (ZeRO-1/2 and plain dp; GPipe and 1F1B)
    # share one column, titled with all their names.
    curves = {}
    for name, m in measured:
        cfg = m["config"]
        key_curves = []
        for key, _, values in panels:
            if key == "world" and sum(cfg[a] > 1 for a in ("dp", "tp", "pp")) != 1:
                key_curves.append(((), ()))  # hybrids have no single "world" axis
            else:
                xs, ys = _family_curve(cfg, key, values)
                key_curves.append((tuple(xs), tuple(float(f"{y:.3g}") for y in ys)))  # equal to 3 digits
        curves.setdefault(tuple(key_curves), []).append((name, m))
    groups = list(curves.items()) or [(((), (), ()), [])]
    ncol = len(groups)
    fig, axes = plt.subplots(3, ncol, figsize=(2.3 * ncol + 1.2, 7.6), sharey="row", squeeze=False)
    for col, (key_curves, members) in enumerate(groups):
        colour = plt.get_cmap("tab10")(col % 10)
        for row, (key, label, values) in enumerate(panels):
            ax = axes[row][col]
            if key_curves[row][0]:
                xs, ys = _family_curve(members[0][1]["config"], key, values)
                ax.plot(xs, ys, color=colour, label="cost model")
            else:
                ax.text(0.5, 0.8, "no single\nworld axis", transform=ax.transAxes, ha="center", fontsize=8)
            for _, m in members:
                cfg = m["config"]
                here = {
                    "world": m["world_size"],
                    "width": cfg["layers"][1] if len(cfg["layers"]) > 2 else None,
                    "batch": cfg["batch"],
                }[key]
                busiest = max(sum(r["sent"][c] for c in CATS) for r in m["comm"]["ranks"])
                if here is not None and busiest > 0:
                    dot = busiest / max(1, m["steps"])
                    ax.plot([here], [dot], "o", color=colour, markeredgecolor="black")
            ax.set_xscale("log", base=2)
            shown = values[:: max(1, len(values) // 4)]
            ax.set_xticks(shown, [str(v) for v in shown], fontsize=7)
            ax.minorticks_off()
            ax.set_yscale("log")
            ax.grid(True, which="major", alpha=0.3)
            if col == 0:
                ax.set_ylabel(f"vs {label}", fontsize=8)
        names = [_traffic_label(n, m) for n, m in members]
        axes[0][col].set_title("\n".join(names), fontsize=8)
    for row in axes:  # after every column's set_yscale: a shared axis keeps the last locator set on it
        _bytes_axis(row[0])
    fig.suptitle(
        "Bytes per step of the busiest rank, one column per layout (equal predictions share one):\n"
        "lines = cost model, dots = measured by the ledger at the size that ran; rows: world, width, batch"
        + ("; experts: lines for balanced routing, dots as routed" if base.get("experts") else ""),
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return _save(fig, path)
