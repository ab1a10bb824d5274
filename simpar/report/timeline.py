"""The timeline plot: what every rank did during a pipeline step, above what the schedule promised.

    python -m simpar train --pp 4 --microbatches 8 --schedule 1f1b --trace trace.json   (under mpiexec -n 4)
    python -m simpar plot --timeline trace.json -o timeline.png

Top: one row per rank from the --trace file (simpar.runtime.trace events): forward, backward and
communication in different colours, communication in a thinner lane under the compute lane.
Bottom: the same schedule played with unit costs (forward = 1, backward = 2, messages free) by
parallel.schedules.ideal_timeline: the bubble there is the textbook (S-1)/(M+S-1).

Measured bubble = 1 - busy compute time / (ranks x makespan), per step: makespan runs from the
first event of the step on any rank to the last one; compute = forward + backward spans. Over
several steps the busy times and the rank x makespan areas are summed; the first step is left
out when there are more (it pays for first-touch allocations and warm-up). With tp > 1 the tensor-
parallel all-reduces inside a stage's forward/backward count as compute (they are part of the F/B bar).
On an oversubscribed machine (more ranks than cores) a rank waiting in a receive still spins on a
core, so the measured bubble is inflated there: compare runs with one core per rank.
"""

from __future__ import annotations

from pathlib import Path

from ..config import SimparError
from ..files import atomic_write, read_json

COLOURS = {
    "forward": "#4C72B0",
    "backward": "#DD8452",
    "comm": "#8C8C8C",
    "allreduce": "#8172B2",
    "other": "#CCCCCC",
}
COMPUTE = ("forward", "backward")


def load_events(source) -> list[dict]:
    """Complete ("X") events from a trace file path, a {"traceEvents": [...]} dict, or a list."""
    if isinstance(source, (str, Path)):
        source = read_json(source, "trace")
    if isinstance(source, dict):
        source = source.get("traceEvents", [])
    return [e for e in source if e.get("ph") == "X"]


def _kind(e: dict) -> str:
    return e.get("args", {}).get("kind") or e.get("cat") or "other"


def _step(e: dict) -> int:
    return int(e.get("args", {}).get("step", 0))


def pipeline_info(events: list[dict]) -> dict:
    """schedule, stages, microbatches and each rank's stage, as recorded on the forward events."""
    info = {"schedule": None, "stages": None, "microbatches": None, "virtual_stages": 1, "stage_of": {}}
    for e in events:
        a = e.get("args", {})
        if _kind(e) == "forward" and "stage" in a:
            info["stage_of"][e["pid"]] = a["stage"]
            for key in ("schedule", "stages", "microbatches", "virtual_stages"):
                info[key] = a.get(key, info[key])
    return info


def step_window(events: list[dict], step: int) -> tuple[float, float]:
    mine = [e for e in events if _step(e) == step]
    return min(e["ts"] for e in mine), max(e["ts"] + e["dur"] for e in mine)


def measured_bubble(events: list[dict], steps: list[int] | None = None) -> float:
    """1 - busy compute / (ranks x makespan), summed over `steps` (default: see module docstring)."""
    ranks = {e["pid"] for e in events if _kind(e) in COMPUTE}
    all_steps = sorted({_step(e) for e in events if _kind(e) in COMPUTE})
    if not ranks:
        raise ValueError("the trace has no forward/backward events")
    if steps is None:
        steps = all_steps[1:] if len(all_steps) > 1 else all_steps
    busy = area = 0.0
    for k in steps:
        t0, t1 = step_window(events, k)
        busy += sum(e["dur"] for e in events if _step(e) == k and _kind(e) in COMPUTE)
        area += len(ranks) * (t1 - t0)
    return 1 - busy / area if area else 0.0


def _bar_label(ax, x, width, y, text, min_width):
    if width >= min_width:
        ax.text(x + width / 2, y, text, ha="center", va="center", fontsize=7, color="white")


def plot_timeline(trace_json_path_or_events, out_png, schedule=None, S=None, M=None, step=None) -> dict:
    """Draw the measured timeline of one step (default: the last) above the ideal one; write out_png.

    schedule/S/M default to what the trace recorded. Returns {"measured_bubble", "step_bubble",
    "ideal_bubble", "step"}.
    """
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    from ..parallel.pipeline.check import ideal_timeline
    from ..parallel.pipeline.schedules import TITLES

    events = load_events(trace_json_path_or_events)
    info = pipeline_info(events)
    schedule = schedule or info["schedule"]
    S = S or info["stages"]
    M = M or info["microbatches"]
    compute_steps = sorted({_step(e) for e in events if _kind(e) in COMPUTE})
    if not compute_steps:
        raise SimparError(
            "the trace has no forward/backward events to draw (was it a --pp run with --trace?)"
        )
    step = compute_steps[-1] if step is None else step
    overall = measured_bubble(events)
    this_step = measured_bubble(events, [step])
    t0, t1 = step_window(events, step)
    ranks = sorted({e["pid"] for e in events})
    shown = [e for e in events if _step(e) == step]

    has_ideal = bool(schedule and S and M)
    fig = Figure(figsize=(12, 1.0 + 0.55 * len(ranks) + (0.5 + 0.5 * S if has_ideal else 0)))
    if has_ideal:
        top, bottom = fig.subplots(2, 1, gridspec_kw={"height_ratios": [len(ranks) + 1, S + 1]})
    else:
        top, bottom = fig.subplots(1, 1), None

    unit = 1e3  # µs -> ms
    span_ms = (t1 - t0) / unit
    for e in shown:
        row = ranks.index(e["pid"])
        x, w = (e["ts"] - t0) / unit, e["dur"] / unit
        kind = _kind(e)
        if kind in COMPUTE:
            top.broken_barh([(x, w)], (row - 0.4, 0.55), facecolors=COLOURS[kind], edgecolor="white", lw=0.3)
            _bar_label(top, x, w, row - 0.125, e["name"], span_ms / 60)
        else:
            top.broken_barh([(x, w)], (row + 0.2, 0.2), facecolors=COLOURS.get(kind, COLOURS["other"]))
    top.set_yticks(range(len(ranks)))
    top.set_yticklabels(
        [f"rank {r}" + (f" (stage {info['stage_of'][r]})" if r in info["stage_of"] else "") for r in ranks]
    )
    top.invert_yaxis()
    top.set_xlim(0, span_ms)
    clock = next((e["args"]["clock"] for e in events if "clock" in e.get("args", {})), "measured")
    top.set_xlabel("ms since the step began" + (" (simulated)" if clock != "measured" else ""))
    top.set_title(
        f"{clock}, step {step}: bubble {this_step:.1%} "
        f"(all steps{' but the first' if len(compute_steps) > 1 else ''}: {overall:.1%}), "
        f"{len(ranks)} ranks"
        + (
            "\nmeasured idle also holds message time, Python and MPI overheads and ranks waiting for a "
            "core; the ideal below has free messages"
            if clock == "measured" and has_ideal
            else ""
        ),
        fontsize=9,
    )
    top.legend(
        handles=[Patch(color=COLOURS[k], label=k) for k in ("forward", "backward", "comm", "allreduce")],
        loc="upper left",
        bbox_to_anchor=(1.005, 1.0),
        fontsize=8,
        frameon=False,
    )

    ideal = None
    if has_ideal:
        tl = ideal_timeline(schedule, S, M, V=info["virtual_stages"])
        ideal = tl.bubble
        for s, row in enumerate(tl.rows):
            order = sorted(set(tl.chunks[s]))
            for (start, end, kind, mb), chunk in zip(row, tl.chunks[s]):
                k = "forward" if kind == "F" else "backward"  # W passes (zb-h1, zb-v) drawn as backward
                bottom.broken_barh(
                    [(start, end - start)], (s - 0.4, 0.8), facecolors=COLOURS[k], edgecolor="white", lw=0.5
                )
                # as the --show-schedule grid: lower case for the rank's 2nd (4th, ...) chunk
                letter = kind if order.index(chunk) % 2 == 0 else kind.lower()
                _bar_label(bottom, start, end - start, s, f"{letter}{mb}", 0.9)
        bottom.set_yticks(range(S))
        bottom.set_yticklabels([f"stage {s}" for s in range(S)])
        bottom.invert_yaxis()
        bottom.set_xlim(0, tl.makespan)
        bottom.set_xlabel("time units (forward = 1, backward = 2)")
        bottom.set_title(
            f"ideal {TITLES.get(schedule, schedule)}, S={S}, M={M}: bubble {tl.bubble:.1%}"
            + {
                "naive": " = (S-1)/S",
                "interleaved": " = (S-1)/(VM+S-1)",
                "zb-h1": " (B = W = 1)",
                "zb-v": " (B = W = 1, per chunk)",
            }.get(schedule, " = (S-1)/(M+S-1)")
        )
    fig.tight_layout()
    # Atomic, like every other output: a full disk leaves one error line and no half a PNG.
    atomic_write(out_png, lambda f: fig.savefig(f, format="png", dpi=120), binary=True)
    return {"measured_bubble": overall, "step_bubble": this_step, "ideal_bubble": ideal, "step": step}
