"""How the bytes grow: per-rank traffic per step as the world size, the hidden width and the batch vary.

    comm_scaling(path, results)      comm_scaling.png of the tour (and `simpar plot --scaling`): one panel
                                     per axis, lines = the cost model for each layout family, dots = the
                                     runs measured

The lines are closed forms (costmodel.predict on the `local` profile), so they extend past the runs that
fit this machine; the dots sit on them because the ledger and the cost model agree exactly. A mixture
of experts' lines assume balanced routing (no run routed those sizes), so its dots, as routed, sit near
them: above where the routing was unbalanced, below where capacity dropped tokens.
"""

from __future__ import annotations

from ..config import SimparError
from .draw import CATS, _bytes_axis, _plt, _save, _traffic_label


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
    """Per-rank bytes per step vs world size, hidden width and batch: lines = cost model, dots = measured."""
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    measured = [(n, m) for n, m in results if m["world_size"] > 1]
    colours = plt.get_cmap("tab10")
    base = results[0][1]["config"]
    width0 = base["layers"][1] if len(base["layers"]) > 2 else base["layers"][0]
    panels = (
        ("world", "ranks in the layout's parallel dimension", [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]),
        (
            "width",
            "hidden width (elements)",
            sorted({width0 * f // 8 for f in (1, 2, 4, 8, 16, 32, 64)} - {0}),
        ),
        (
            "batch",
            "global batch (samples)",
            sorted({max(1, base["batch"] * f // 8) for f in (1, 2, 4, 8, 16, 32, 64)}),
        ),
    )
    # Layouts whose predicted curves coincide in all three panels (ZeRO-1/2 and plain dp; GPipe and 1F1B)
    # share one line, labelled with all their names: fewer lines, nothing hidden.
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
    groups = list(curves.items())
    for ax, (p_i, (key, label, values)) in zip(axes, enumerate(panels)):
        for i, (key_curves, members) in enumerate(groups):
            colour = colours(i % 10)
            xs, ys = key_curves[p_i]
            if xs:
                xs, ys = _family_curve(members[0][1]["config"], key, values)
                ax.plot(
                    xs,
                    ys,
                    color=colour,
                    alpha=0.8,
                    label=" = ".join(_traffic_label(n, m) for n, m in members),
                    linestyle=("-", "--", ":", "-.")[i % 4],
                )
            for name, m in members:
                cfg = m["config"]
                here = {
                    "world": m["world_size"],
                    "width": cfg["layers"][1] if len(cfg["layers"]) > 2 else None,
                    "batch": cfg["batch"],
                }[key]
                busiest = max(sum(r["sent"][c] for c in CATS) for r in m["comm"]["ranks"])
                per_rank = busiest / max(1, m["steps"])
                if here is not None and per_rank > 0:
                    ax.plot([here], [per_rank], "o", color=colour, markersize=7, markeredgecolor="black")
        ax.set_xscale("log", base=2)
        ax.set_xticks(values, [str(v) for v in values])
        ax.minorticks_off()
        ax.set_yscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("bytes sent per step by the busiest rank")
        _bytes_axis(ax)
        ax.grid(True, which="major", alpha=0.3)
    world = "dp/ZeRO: model bytes approach 2P or 3P; tp: activations"
    if base.get("experts"):  # the world panel varies dp; a layout's --ep stays (sizes it divides)
        world = "dp grows, --ep fixed: gradients up, all-to-all down"
    axes[0].set_title(f"vs world size\n({world})", fontsize=10)
    axes[1].set_title("vs hidden width\n(model bytes ~ width^2, activations ~ width)", fontsize=10)
    axes[2].set_title("vs global batch\n(activations ~ batch, model bytes flat)", fontsize=10)
    handles, labels = [], []
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    fig.legend(handles, labels, loc="lower center", ncol=min(4, max(1, len(labels))), fontsize=8)
    fig.suptitle(
        "Bytes per step of the busiest rank: lines = predicted by the cost model, "
        "dots = measured by the ledger at the size that ran (layouts with equal predictions share a line)"
        + (
            "\nmixture of experts: lines for balanced routing without drops, dots as routed"
            if base.get("experts")
            else ""
        ),
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.14, 1, 0.95))
    return _save(fig, path)
