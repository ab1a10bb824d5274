"""Pipeline schedules as plain data, and the ideal (unit-time) timeline they produce.

A pipeline cuts the model into S stages (one per group of ranks) and each rank's batch into M
micro-batches. A *schedule* says, for every stage, in which order to do its work. Here a schedule
is nothing but data: for each stage a list of small steps,

    RecvAct(mb)  Forward(mb)  SendAct(mb)      -- the forward of micro-batch mb
    RecvGrad(mb) Backward(mb) SendGrad(mb)     -- its backward
    AllReduceGrads()                           -- once per step, after the last backward

so the schedule can be printed, simulated, tested, and executed by the same small loop
(pipeline.PipelineParallel). The first stage has no RecvAct/SendGrad (its input is the data, and
nothing upstream wants a gradient); the last has no SendAct/RecvGrad (it computes the loss, whose
gradient starts the backward right there).

Three schedules:
  naive  one micro-batch at a time through all stages, forward then backward: only one stage is
         ever busy, the bubble is (S-1)/S.
  gpipe  GPipe (Huang et al. 2019): all M forwards, then all M backwards. Stages overlap on
         different micro-batches; bubble (S-1)/(M+S-1); but every stage holds the activations of
         all M micro-batches at the turn.
  1f1b   PipeDream-Flush (Narayanan et al. 2021, "Memory-efficient pipeline-parallel DNN
         training"): stage s does S-s-1 warm-up forwards, then alternates one forward and one
         backward, then cools down with the remaining backwards. Same bubble as GPipe, but a stage
         never holds more than S-s micro-batches' activations, whatever M is.

Why the executor cannot deadlock: sends are non-blocking (isend) and receives block. A blocked
receive only waits for a send that comes earlier in the sender's list, so if `ideal_timeline`
(which simulates exactly these semantics, and raises on a deadlock) finishes, so does the real run.

Stage partition (`partition_layers`): contiguous layers, balanced by parameter count (a layer's
matmul work is proportional to its weights): the split that minimises the largest stage's
parameter count; among equally good splits, later stages take as many layers as they can (so the
early stages, which hold the most activations under 1F1B, get fewer). `--stage-layers` overrides it.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Union

# -- the steps ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Forward:
    """Run this stage's layers on micro-batch `mb`; keep what backward needs. Last stage: + loss."""

    mb: int


@dataclass(frozen=True)
class Backward:
    """Differentiate this stage's layers for micro-batch `mb`; gradients add into dW, db (+=)."""

    mb: int


@dataclass(frozen=True)
class RecvAct:
    """Receive micro-batch `mb`'s activations from the previous stage (blocking)."""

    mb: int


@dataclass(frozen=True)
class SendAct:
    """Send micro-batch `mb`'s output to the next stage (non-blocking)."""

    mb: int


@dataclass(frozen=True)
class RecvGrad:
    """Receive the gradient w.r.t. this stage's output for micro-batch `mb` (blocking)."""

    mb: int


@dataclass(frozen=True)
class SendGrad:
    """Send the gradient w.r.t. this stage's input for micro-batch `mb` to the previous stage."""

    mb: int


@dataclass(frozen=True)
class AllReduceGrads:
    """Sum this stage's gradients over its data-parallel group (no-op when dp = 1)."""


Step = Union[Forward, Backward, RecvAct, SendAct, RecvGrad, SendGrad, AllReduceGrads]


def forward_steps(s: int, S: int, mb: int) -> list[Step]:
    """Receive (unless first stage), compute, send (unless last stage)."""
    return ([RecvAct(mb)] if s > 0 else []) + [Forward(mb)] + ([SendAct(mb)] if s < S - 1 else [])


def backward_steps(s: int, S: int, mb: int) -> list[Step]:
    """Receive the output gradient (unless last stage), compute, send the input gradient (unless first)."""
    return ([RecvGrad(mb)] if s < S - 1 else []) + [Backward(mb)] + ([SendGrad(mb)] if s > 0 else [])


# -- the schedules -----------------------------------------------------------------------------------


def naive(S: int, M: int) -> list[list[Step]]:
    """Micro-batch after micro-batch, each all the way forward and back before the next starts."""
    return [
        [step for mb in range(M) for step in forward_steps(s, S, mb) + backward_steps(s, S, mb)]
        + [AllReduceGrads()]
        for s in range(S)
    ]


def gpipe(S: int, M: int) -> list[list[Step]]:
    """GPipe: fill the pipeline with all M forwards, then drain it with all M backwards."""
    out = []
    for s in range(S):
        steps = [step for mb in range(M) for step in forward_steps(s, S, mb)]  # all forwards
        steps += [step for mb in range(M) for step in backward_steps(s, S, mb)]  # all backwards
        out.append(steps + [AllReduceGrads()])
    return out


def one_f_one_b(S: int, M: int) -> list[list[Step]]:
    """1F1B (PipeDream-Flush): warm-up forwards, steady one-forward-one-backward, cool-down backwards."""
    out = []
    for s in range(S):
        # Warm-up: enough forwards that, by the time the first gradient comes back from the last
        # stage, this stage has had work all along. Stage s is S-s-1 hops from the end.
        warmup = min(S - s - 1, M)
        steps = [step for mb in range(warmup) for step in forward_steps(s, S, mb)]
        # Steady state: each new forward is paired with the backward of the oldest micro-batch,
        # so at most warmup + 1 = S - s micro-batches are alive on this stage at any time.
        for i in range(M - warmup):
            steps += forward_steps(s, S, warmup + i) + backward_steps(s, S, i)
        # Cool-down: the backwards of the micro-batches still in flight.
        for mb in range(M - warmup, M):
            steps += backward_steps(s, S, mb)
        out.append(steps + [AllReduceGrads()])
    return out


SCHEDULES: dict[str, Callable[[int, int], list[list[Step]]]] = {
    "naive": naive,
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
}

TITLES = {
    "naive": "naive (one micro-batch at a time)",
    "gpipe": "GPipe (all forwards, then all backwards)",
    "1f1b": "1F1B (PipeDream-Flush)",
}


def build_schedule(schedule, S: int, M: int) -> list[list[Step]]:
    """`schedule` may be a name from SCHEDULES, a schedule function, or already the per-stage lists."""
    if isinstance(schedule, str):
        if schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {schedule!r} (choose from {', '.join(SCHEDULES)})")
        return SCHEDULES[schedule](S, M)
    if callable(schedule):
        return schedule(S, M)
    return schedule


def in_flight_peaks(stages: list[list[Step]]) -> list[int]:
    """Per stage: the most micro-batches forwarded but not yet backwarded (activations held)."""
    peaks = []
    for steps in stages:
        alive = peak = 0
        for step in steps:
            alive += isinstance(step, Forward) - isinstance(step, Backward)
            peak = max(peak, alive)
        peaks.append(peak)
    return peaks


# -- the ideal timeline --------------------------------------------------------------------------------


@dataclass
class Timeline:
    """Per stage, the (start, end, kind 'F' | 'B', micro-batch) of every compute step."""

    rows: list[list[tuple[float, float, str, int]]]
    makespan: float
    bubble: float  # 1 - busy / (S * makespan): the fraction of stage-time spent idle
    forward: float
    backward: float


def ideal_timeline(schedule, S: int, M: int, forward: float = 1.0, backward: float = 2.0) -> Timeline:
    """Play the schedule with forward = `forward` and backward = `backward` time units, messages free.

    Semantics are the executor's: a send never waits, a receive waits for its send. Each stage
    walks its list in order; a stage stuck at a receive resumes once the sender got there.
    Raises ValueError if the schedule deadlocks (some stage can never proceed).
    """
    stages = build_schedule(schedule, S, M)
    clock, pos = [0.0] * S, [0] * S
    rows: list[list] = [[] for _ in range(S)]
    posted: dict[tuple, float] = {}  # ("act"|"grad", mb, receiving stage) -> time sent
    progress = True
    while progress:
        progress = False
        for s in range(S):
            while pos[s] < len(stages[s]):
                step = stages[s][pos[s]]
                if isinstance(step, (RecvAct, RecvGrad)):
                    key = ("act" if isinstance(step, RecvAct) else "grad", step.mb, s)
                    if key not in posted:
                        break  # blocked: the sender has not got there yet
                    clock[s] = max(clock[s], posted.pop(key))
                elif isinstance(step, SendAct):
                    posted[("act", step.mb, s + 1)] = clock[s]
                elif isinstance(step, SendGrad):
                    posted[("grad", step.mb, s - 1)] = clock[s]
                elif isinstance(step, (Forward, Backward)):
                    cost, kind = (forward, "F") if isinstance(step, Forward) else (backward, "B")
                    rows[s].append((clock[s], clock[s] + cost, kind, step.mb))
                    clock[s] += cost
                pos[s] += 1
                progress = True
    stuck = [s for s in range(S) if pos[s] < len(stages[s])]
    if stuck:
        raise ValueError(f"schedule deadlocks: stages {stuck} wait at {[stages[s][pos[s]] for s in stuck]}")
    makespan = max(clock)
    busy = sum(end - start for row in rows for start, end, _, _ in row)
    bubble = 1 - busy / (S * makespan) if makespan else 0.0
    return Timeline(rows, makespan, bubble, forward, backward)


def format_grid(timeline: Timeline) -> str:
    """The stage x time grid, one column per time unit: 'F3' forward of micro-batch 3, 'B3' its
    backward (one cell per unit it takes), '.' idle. Costs must be whole time units."""
    if any(float(c) != int(c) for c in (timeline.forward, timeline.backward)):
        raise ValueError("format_grid needs whole-unit costs")
    width = max((len(f"F{mb}") for row in timeline.rows for *_, mb in row), default=2)
    lines = []
    for s, row in enumerate(timeline.rows):
        cells = ["."] * int(timeline.makespan)
        for start, end, kind, mb in row:
            for t in range(int(start), int(end)):
                cells[t] = f"{kind}{mb}"
        lines.append(f"stage {s} | " + " ".join(c.ljust(width) for c in cells).rstrip())
    return "\n".join(lines)


def show_schedule_main(schedule: str, S: int, M: int, forward: int = 1, backward: int = 2) -> str:
    """What `simpar plan --pp S --microbatches M --schedule NAME --show-schedule` prints."""
    stages = build_schedule(schedule, S, M)
    tl = ideal_timeline(stages, S, M, forward, backward)
    peaks = in_flight_peaks(stages)
    name = schedule if isinstance(schedule, str) else getattr(schedule, "__name__", "custom")
    if name == "naive":
        formula = f"(S-1)/S = {S - 1}/{S}"
    else:
        formula = f"(S-1)/(M+S-1) = {S - 1}/{M + S - 1}"
    bound = {
        "gpipe": "GPipe keeps all M alive",
        "1f1b": "1F1B: at most S - s on stage s",
        "naive": "one at a time",
    }.get(name, "")
    frac = Fraction(tl.bubble).limit_denominator(10_000)
    return "\n".join(
        [
            f"{TITLES.get(name, name)}: {S} stages x {M} micro-batches, "
            f"forward = {forward} time unit, backward = {backward}",
            "Fk = forward of micro-batch k, Bk = its backward (one cell per time unit), "
            ". = idle (the bubble)",
            "",
            format_grid(tl),
            "",
            f"ideal bubble: {tl.bubble:.1%} of the step ({frac}); formula {formula}",
            f"peak micro-batches in flight per stage: {', '.join(map(str, peaks))}"
            + (f"   ({bound})" if bound else ""),
        ]
    )


# -- which layers go on which stage -----------------------------------------------------------------


def partition_layers(
    widths: list[int], S: int, stage_layers: list[int] | None = None
) -> list[tuple[int, int]]:
    """[(first layer, one past the last layer)] for each of the S stages (see the module docstring)."""
    n = len(widths) - 1
    if not 1 <= S <= n:
        raise ValueError(f"cannot cut {n} layers into {S} stages")
    if stage_layers is None:
        stage_layers = _balanced_counts([widths[i] * widths[i + 1] + widths[i + 1] for i in range(n)], S)
    if len(stage_layers) != S or sum(stage_layers) != n or min(stage_layers) < 1:
        raise ValueError(f"stage layer counts {stage_layers} must be {S} positive numbers summing to {n}")
    bounds, lo = [], 0
    for count in stage_layers:
        bounds.append((lo, lo + count))
        lo += count
    return bounds


def _balanced_counts(costs: list[int], S: int) -> list[int]:
    """Contiguous split of `costs` into S non-empty parts minimising the largest part's sum."""
    n = len(costs)
    prefix = [0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    part = lambda j, i: prefix[i] - prefix[j]  # sum of costs[j:i]
    INF = float("inf")
    # best[k][i]: the smallest possible largest part when the first i layers form k stages.
    best = [[INF] * (n + 1) for _ in range(S + 1)]
    best[0][0] = 0
    for k in range(1, S + 1):
        for i in range(k, n + 1):
            best[k][i] = min(max(best[k - 1][j], part(j, i)) for j in range(k - 1, i))
    target, counts, i = best[S][n], [], n
    for k in range(S, 0, -1):
        # The last remaining stage starts as early as the target allows (takes the most layers).
        j = min(j for j in range(k - 1, i) if best[k - 1][j] <= target and part(j, i) <= target)
        counts.append(i - j)
        i = j
    return counts[::-1]
