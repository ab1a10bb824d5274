"""The schedule compiler's back end: execute a schedule symbolically, then draw it.

`check(schedule, S, M, V)` plays every rank's step list with the executor's semantics (a send never
waits, a receive waits until its send was posted, messages matched by kind, micro-batch and chunk)
and with unit costs. It raises ScheduleError, naming the ranks and steps, if

  * some rank can never proceed (a deadlock: every blocked receive waits for a send that comes
    after a receive that is itself blocked, or never comes), or
  * a send is never received (its buffer would stay pending forever), or a receive is posted on a
    rank that does not hold the chunk, or a compute step misses its input.

If `check` passes, the real run finishes: the MPI executor (pipeline.py) does exactly these steps,
with isend and blocking, tag-matched recv. config.validate runs it before any traffic, so a bad
schedule ends the job with one line (`simpar: error: ...`, exit 2) instead of a hang.

The result is the ideal timeline (messages free, forward = 1, backward = 2 time units, a split
backward B = W = 1): the grid `simpar plan --show-schedule` prints and the bubble it shows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from .schedules import (
    COMPUTE,
    LETTER,
    SCHEDULES,
    Backward,
    BackwardInput,
    BackwardWeight,
    Forward,
    RecvAct,
    RecvGrad,
    SendAct,
    SendGrad,
    build_schedule,
    in_flight_peaks,
)


class ScheduleError(ValueError):
    """The schedule can deadlock or leaves a message unmatched (see the module docstring)."""


@dataclass
class Timeline:
    """Per rank, the (start, end, kind 'F' | 'B' | 'W', micro-batch) of every compute step."""

    rows: list[list[tuple[float, float, str, int]]]
    makespan: float
    bubble: float  # 1 - busy / (ranks * makespan): the fraction of rank-time spent idle
    forward: float
    backward: float
    chunks: list[list[int]] = field(default_factory=list)  # the chunk of each row entry


def check(schedule, S: int, M: int, V: int = 1, forward: float = 1.0, backward: float = 2.0) -> Timeline:
    """Execute the schedule symbolically (see the module docstring); the ideal Timeline if it is sound."""
    stages = build_schedule(schedule, S, M, V)
    R = len(stages)
    rank_of = SCHEDULES[schedule].rank_of if isinstance(schedule, str) else (lambda c, S: c % S)
    if isinstance(schedule, list) and len(stages) != S:
        raise ScheduleError(f"the schedule lists {len(stages)} ranks, the pipeline has {S}")
    cost = {Forward: forward, Backward: backward, BackwardInput: backward / 2, BackwardWeight: backward / 2}
    clock, pos = [0.0] * R, [0] * R
    rows: list[list] = [[] for _ in range(R)]
    chunks: list[list] = [[] for _ in range(R)]
    posted: dict[tuple, float] = {}  # ("act" | "grad", mb, receiving chunk) -> time sent
    have: set = set()  # (what, mb, chunk) this rank holds: "in", "ctx", "grad", "dx", "dw"
    progress = True
    while progress:
        progress = False
        for r in range(R):
            while pos[r] < len(stages[r]):
                step = stages[r][pos[r]]
                if isinstance(step, (RecvAct, RecvGrad)):
                    what = "act" if isinstance(step, RecvAct) else "grad"
                    if rank_of(step.chunk, S) != r:
                        raise ScheduleError(
                            f"rank {r} receives for chunk {step.chunk}, which it does not hold"
                        )
                    key = (what, step.mb, step.chunk)
                    if key not in posted:
                        break  # blocked: the sender has not got there yet
                    clock[r] = max(clock[r], posted.pop(key))
                    have.add(("in" if what == "act" else "grad", step.mb, step.chunk))
                elif isinstance(step, (SendAct, SendGrad)):
                    act = isinstance(step, SendAct)
                    need = ("out" if act else "dx", step.mb, step.chunk)
                    if need not in have:
                        raise ScheduleError(f"rank {r} sends {step} before computing it")
                    have.discard(need)
                    posted[("act" if act else "grad", step.mb, step.chunk + (1 if act else -1))] = clock[r]
                elif isinstance(step, COMPUTE):
                    _compute(step, r, have, stages, lambda c: rank_of(c, S) == r)
                    rows[r].append((clock[r], clock[r] + cost[type(step)], LETTER[type(step)], step.mb))
                    chunks[r].append(step.chunk)
                    clock[r] += cost[type(step)]
                pos[r] += 1
                progress = True
    stuck = [r for r in range(R) if pos[r] < len(stages[r])]
    if stuck:
        waits = ", ".join(f"rank {r} at {stages[r][pos[r]]}" for r in stuck)
        raise ScheduleError(f"schedule deadlocks: {waits} wait for sends that never come")
    if posted:
        raise ScheduleError(f"schedule leaves sends unreceived: {sorted(posted)[:4]}")
    makespan = max(clock)
    busy = sum(end - start for row in rows for start, end, _, _ in row)
    bubble = 1 - busy / (R * makespan) if makespan else 0.0
    return Timeline(rows, makespan, bubble, forward, backward, chunks)


def _compute(step, r: int, have: set, stages, is_mine) -> None:
    """Check a compute step's inputs are there and record what it produces. A neighbouring chunk on
    the same rank (`is_mine`: zb-v's turn) gets the output, or the input gradient, without a message."""
    mb, c = step.mb, step.chunk
    C = max(st.chunk for row in stages for st in row if isinstance(st, COMPUTE)) + 1
    if isinstance(step, Forward):
        if c > 0 and ("in", mb, c) not in have:
            raise ScheduleError(f"rank {r} runs {step} before receiving its input")
        have.discard(("in", mb, c))
        have.add(("ctx", mb, c))
        if c < C - 1:
            have.add(("in", mb, c + 1) if is_mine(c + 1) else ("out", mb, c))
        else:
            have.add(("grad", mb, c))  # the loss gives the output gradient
        return
    if isinstance(step, BackwardWeight):
        if ("dw", mb, c) not in have:
            raise ScheduleError(f"rank {r} runs {step} before its B pass")
        have.discard(("dw", mb, c))
        return
    if ("ctx", mb, c) not in have or ("grad", mb, c) not in have:
        raise ScheduleError(f"rank {r} runs {step} before its forward or its output gradient")
    have.discard(("grad", mb, c))
    have.discard(("ctx", mb, c))
    if isinstance(step, BackwardInput):
        have.add(("dw", mb, c))
    if c > 0:
        have.add(("grad", mb, c - 1) if is_mine(c - 1) else ("dx", mb, c))


STEP_NAMES = {cls.__name__: cls for cls in COMPUTE + (RecvAct, RecvGrad, SendAct, SendGrad)}


def load_schedule_file(path: str) -> list[list]:
    """A hand-made schedule from JSON: one list per rank of [step, micro-batch(, chunk)], step one of
    Forward, Backward, BackwardInput, BackwardWeight, RecvAct, SendAct, RecvGrad, SendGrad; e.g.
    [[["Forward", 0], ["SendAct", 0], ["RecvGrad", 0], ["Backward", 0]], [["RecvAct", 0, 1], ...]]."""
    import json

    from ...config import SimparError

    form = (
        'expected a JSON list with one list per rank of steps ["Forward", micro-batch(, chunk)], a step one '
        f"of {', '.join(STEP_NAMES)}"
    )
    try:
        raw = json.loads(open(path).read())
    except OSError as exc:
        raise SimparError(f"cannot read schedule {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise SimparError(f"{path}: not JSON ({exc}); {form}") from None
    if not isinstance(raw, list) or not all(isinstance(rank, list) for rank in raw):
        raise SimparError(f"{path}: not a schedule: {form}")
    steps = []
    for r, rank in enumerate(raw):
        steps.append([])
        for step in rank:
            what = f"{path}: rank {r}'s step {json.dumps(step)}"
            if not (isinstance(step, list) and step and step[0] in STEP_NAMES):
                raise SimparError(f"{what} is not a step: {form}")
            if not all(isinstance(a, int) and a >= 0 for a in step[1:]):
                raise SimparError(f"{what}: micro-batch and chunk must be whole numbers >= 0")
            try:
                steps[-1].append(STEP_NAMES[step[0]](*step[1:]))
            except TypeError:
                raise SimparError(f"{what}: give a micro-batch and optionally a chunk") from None
    return steps


def refuse_unsound(schedule, S: int, M: int, V: int = 1) -> None:
    """SimparError (one line, exit 2) if the schedule can deadlock or leaves a send unmatched."""
    from ...config import SimparError

    try:
        check(schedule, S, M, V)
    except ScheduleError as exc:
        raise SimparError(f"pipeline schedule refused by the static check: {exc}") from None


def ideal_timeline(
    schedule, S: int, M: int, forward: float = 1.0, backward: float = 2.0, V: int = 1
) -> Timeline:
    """The checked schedule's ideal timeline (kept under its old name for the timeline plot)."""
    return check(schedule, S, M, V, forward, backward)


def format_grid(timeline: Timeline) -> str:
    """The rank x time grid, one column per time unit: 'F3' forward of micro-batch 3, 'B3' its
    backward (or its B pass), 'W3' its W pass; with several chunks per rank a lower-case letter marks
    the rank's second chunk (f, b, w) and so on; '.' idle. Costs must be whole time units."""
    if any(float(c) != int(c) for c in (timeline.forward, timeline.backward)):
        raise ValueError("format_grid needs whole-unit costs")
    width = max((len(f"F{mb}") for row in timeline.rows for *_, mb in row), default=2)
    lines = []
    for r, row in enumerate(timeline.rows):
        cells = ["."] * int(timeline.makespan)
        order = sorted(set(timeline.chunks[r])) if timeline.chunks else []
        for i, (start, end, kind, mb) in enumerate(row):
            nth = order.index(timeline.chunks[r][i]) if order else 0
            letter = kind if nth % 2 == 0 else kind.lower()
            for t in range(int(start), int(end)):
                cells[t] = f"{letter}{mb}"
        lines.append(f"stage {r} | " + " ".join(c.ljust(width) for c in cells).rstrip())
    return "\n".join(lines)


def show_schedule_main(schedule: str, S: int, M: int, forward: int = 1, backward: int = 2, V: int = 1) -> str:
    """What `simpar plan --pp S --microbatches M --schedule NAME --show-schedule` prints."""
    stages = build_schedule(schedule, S, M, V)
    tl = check(schedule, S, M, V, forward, backward)
    peaks = in_flight_peaks(stages)
    kind = SCHEDULES.get(schedule) if isinstance(schedule, str) else None
    name = schedule if isinstance(schedule, str) else getattr(schedule, "__name__", "custom")
    formula = kind.formula(S, M, V)[0] if kind else "(from the timeline)"
    bound = {
        "gpipe": "GPipe keeps all M alive",
        "1f1b": "1F1B: at most S - s on stage s",
        "naive": "one at a time",
        "zb-h1": "ZB-H1: at most S on every stage, as 1F1B's stage 0",
        "interleaved": "(micro-batch, chunk) pairs, each chunk 1/V of a stage",
        "zb-v": "(micro-batch, chunk) pairs, each chunk half a stage: at most 2S = 1F1B's S stages",
    }.get(name, "")
    split = kind is not None and kind.split_backward
    legend = (
        "Fk = forward of micro-batch k, Bk = its B pass (dL/dx), Wk = its W pass (dW, db), "
        if split
        else "Fk = forward of micro-batch k, Bk = its backward (one cell per time unit), "
    )
    costs = f"B = W = {backward / 2:g}" if split else f"backward = {backward}"
    chunk_note = (
        ", V = %d chunks per rank (lower case: the rank's 2nd chunk)" % V
        if V > 1 and name == "interleaved"
        else ", chunks s and 2S-1-s on rank s (lower case: the way back up)"
        if name == "zb-v"
        else ""
    )
    frac = Fraction(tl.bubble).limit_denominator(10_000)
    return "\n".join(
        [
            f"{TITLES_OF(name)}: {S} stages x {M} micro-batches{chunk_note}, "
            f"forward = {forward} time unit, {costs}",
            legend + ". = idle (the bubble)",
            "",
            format_grid(tl),
            "",
            f"ideal bubble: {tl.bubble:.1%} of the step ({frac}); formula {formula}",
            f"peak micro-batches in flight per stage: {', '.join(map(str, peaks))}"
            + (f"   ({bound})" if bound else ""),
            "static check: every receive matched by its send, no deadlock",
        ]
    )


def TITLES_OF(name: str) -> str:
    return SCHEDULES[name].title if name in SCHEDULES else name
