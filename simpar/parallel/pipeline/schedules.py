"""Pipeline schedules as plain data: what each rank does, step by step, in which order.

A pipeline cuts the model into C *model chunks* of consecutive layers (partition.py) and each rank's
batch into M micro-batches. Usually C = S, one chunk per rank; the interleaved schedule gives each of
the S ranks V chunks (C = S*V). A schedule is, for every rank, a list of small steps, each naming a
micro-batch `mb` and the model chunk it concerns:

    RecvAct  Forward  SendAct                 -- the forward of (mb, chunk)
    RecvGrad Backward SendGrad                -- its backward (dx, dW and db at once)
    RecvGrad BackwardInput SendGrad, later BackwardWeight  -- the same backward in two halves
    AllReduceGrads()                          -- once per step, after the last backward

Chunk c sends its output to chunk c+1 and its input gradient to chunk c-1, on whichever rank holds
them (`Schedule.rank_of`); when that is the same rank (zb-v's turn at the bottom of the V) there is no
message: the executor hands the array over in memory. Chunk 0 has no RecvAct/SendGrad (its input is
the data), chunk C-1 no SendAct/RecvGrad (it computes the loss, whose gradient starts the backward
right there).

The schedules (each a small `Schedule` record in SCHEDULES; `simpar plan --show-schedule` draws them):
  naive        one micro-batch at a time through all stages: bubble (S-1)/S.
  gpipe        GPipe (Huang et al. 2019): all M forwards, then all M backwards; bubble (S-1)/(M+S-1),
               every stage holds all M micro-batches' activations at the turn.
  1f1b         PipeDream-Flush (Narayanan et al. 2021, sec. 2.1): S-s-1 warm-up forwards, then one
               forward and one backward in turn; same bubble, at most S-s micro-batches alive on stage s.
  interleaved  interleaved 1F1B (Narayanan et al. 2021, sec. 2.2, Fig. 4): rank s holds chunks
               s, s+S, ..., s+(V-1)S; the bubble shrinks V-fold: (S-1)/(V*M) of the ideal time, i.e.
               (S-1)/(V*M+S-1) of the step. Needs M divisible by S (micro-batches go round in groups of S).
  zb-h1        ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", sec. 3.1, Fig. 3): the
               backward split into B (dL/dx = dz W^T, on the critical path) and W (dW = x^T dz, db),
               and stage s holds back its W passes by s micro-batches so that they fill the drain.
               Peak memory: S micro-batches on every stage, stage 0's figure under 1F1B (the paper's
               "same peak memory as 1F1B"). With F = B = W the bubble is (S-1)/(3M+S-1): a third of 1F1B's.
  zb-v         ZB-V (Qi et al., arXiv 2401.10241 v2, sec. 6 "memory efficient zero bubble schedule" and
               its ZB-V figure): 2S chunks, rank s holds chunk s and chunk 2S-1-s, so a micro-batch goes
               down the ranks and back up (a V) and the loss is on rank 0; backward split as in zb-h1.
               Its order is compiled by `zb_v` below (a list schedule under 1F1B's memory cap).

The paper then tunes real schedules with an ILP/heuristic on measured costs and, to drop the step's
synchronisation, runs the optimizer before all-reduced norms are known and rolls back on a NaN or a
clipping event ("optimizer post-validation", sec. 4). simpar does neither: its schedules are the
fixed ones above (zb-v's compiled once from unit costs, not measured ones), and the optimizer step
waits for every backward and the gradient all-reduce as in the other schedules, so every layout
stays equal to the serial run. That synchronous step is why no schedule here reaches a zero bubble:
stage s idles s units before its first forward arrives, and nothing can fill that.

Why the executor cannot deadlock: sends are non-blocking (isend) and receives block (matched by tag).
schedule_check.check executes every schedule symbolically with exactly these semantics before a run
and refuses one that can deadlock or leaves a send unreceived (config.validate calls it).

The step types live in steps.py (re-exported here). (Over 300 lines: every schedule is a few lines of
plain data, and they read best next to each other; zb-v's order, the one that is compiled rather than
written out, takes some 80 of them.)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from .partition import partition_layers  # noqa: F401  (re-exported: where stages come from)
from .steps import (  # noqa: F401  (re-exported: the schedules' vocabulary, steps.py)
    COMPUTE,
    LETTER,
    AllReduceGrads,
    Backward,
    BackwardInput,
    BackwardWeight,
    Forward,
    RecvAct,
    RecvGrad,
    SendAct,
    SendGrad,
    Step,
    backward_steps,
    forward_steps,
)

# -- the schedules (one chunk per rank unless said otherwise) ------------------------------------------


def naive(S: int, M: int, V: int = 1) -> list[list[Step]]:
    """Micro-batch after micro-batch, each all the way forward and back before the next starts."""
    return [
        [st for mb in range(M) for st in forward_steps(s, S, mb) + backward_steps(s, S, mb)]
        + [AllReduceGrads()]
        for s in range(S)
    ]


def gpipe(S: int, M: int, V: int = 1) -> list[list[Step]]:
    """GPipe: fill the pipeline with all M forwards, then drain it with all M backwards."""
    return [
        [st for mb in range(M) for st in forward_steps(s, S, mb)]
        + [st for mb in range(M) for st in backward_steps(s, S, mb)]
        + [AllReduceGrads()]
        for s in range(S)
    ]


def one_f_one_b(S: int, M: int, V: int = 1) -> list[list[Step]]:
    """1F1B (PipeDream-Flush): warm-up forwards, steady one-forward-one-backward, cool-down backwards."""
    out = []
    for s in range(S):
        # Warm-up: stage s is S-s-1 hops from the end; that many forwards keep it busy until the
        # first gradient is back. Steady state: each new forward paired with the oldest backward.
        w = min(S - s - 1, M)
        steps = [st for mb in range(w) for st in forward_steps(s, S, mb)]
        for i in range(M - w):
            steps += forward_steps(s, S, w + i) + backward_steps(s, S, i)
        for mb in range(M - w, M):  # cool-down: the backwards still in flight
            steps += backward_steps(s, S, mb)
        out.append(steps + [AllReduceGrads()])
    return out


def interleaved(S: int, M: int, V: int = 2) -> list[list[Step]]:
    """Interleaved 1F1B (Narayanan et al. 2021, sec. 2.2; Megatron-LM's order): rank s's k-th forward
    is micro-batch (k // SV) S + k % S of its local chunk (k // S) % V, i.e. S micro-batches through
    one chunk, then the same S through the next; backwards likewise with the chunks reversed.
    Warm-up 2(S-s-1) + (V-1)S forwards, then one forward and one backward in turn."""
    C, MV = S * V, M * V
    out = []
    for s in range(S):

        def unit(k: int, backward: bool) -> tuple[int, int]:
            local = (k // S) % V
            mb = (k // (S * V)) * S + k % S
            return mb, (V - 1 - local if backward else local) * S + s

        w = min((S - s - 1) * 2 + (V - 1) * S, MV)
        fwd = lambda k: forward_steps(unit(k, False)[1], C, unit(k, False)[0])
        bwd = lambda k: backward_steps(unit(k, True)[1], C, unit(k, True)[0])
        steps = [st for k in range(w) for st in fwd(k)]
        for i in range(MV - w):
            steps += fwd(w + i) + bwd(i)
        for k in range(MV - w, MV):
            steps += bwd(k)
        out.append(steps + [AllReduceGrads()])
    return out


def zb_h1(S: int, M: int, V: int = 1) -> list[list[Step]]:
    """ZB-H1 (Qi et al. 2023, sec. 3.1, Fig. 3): 1F1B's forwards and B passes, with stage s's W pass
    of micro-batch i done s micro-batches late: after the steady-state pair (F(i+w), B(i+s)), and in
    the cool-down one W after each B; the rest at the end. At most S micro-batches alive per stage."""
    out = []
    for s in range(S):
        w = min(S - s - 1, M)
        steps = [st for mb in range(w) for st in forward_steps(s, S, mb)]
        done_w = 0
        for i in range(M - w):
            steps += forward_steps(s, S, w + i) + backward_steps(s, S, i, BackwardInput)
            if i >= s:  # hold back the W passes by s micro-batches
                steps.append(BackwardWeight(done_w, s))
                done_w += 1
        for mb in range(M - w, M):
            steps += backward_steps(s, S, mb, BackwardInput)
            steps.append(BackwardWeight(done_w, s))
            done_w += 1
        steps += [BackwardWeight(mb, s) for mb in range(done_w, M)]
        out.append(steps + [AllReduceGrads()])
    return out


def zb_v(S: int, M: int, V: int = 1) -> list[list[Step]]:
    """ZB-V's order, compiled by simpar's own rule (the V and the memory cap are the paper's; the
    priority list is ours, in the spirit of its heuristic scheduler, sec. 3): with F = B = W = 1 time
    unit and messages free, play the ranks in lock step; at each unit a free rank runs, in priority,

      1. a B pass whose output gradient is there (the up chunk 2S-1-s before the down chunk s):
         B is on the critical path, every rank below waits for it;
      2. a forward whose input is there, if fewer than 2S (micro-batch, chunk) units are alive on the
         rank (up chunk first, to finish micro-batches): 2S half-stage units = S whole micro-batches,
         1F1B's peak on stage 0 -- the paper's "same activation memory as 1F1B";
      3. else the oldest pending W pass (it frees a unit): W fills what would be bubbles.

    Each chunk takes its micro-batches in order. The result: 6M units of work per rank in a span of
    6M + S - 1 (the first forward's way down, unavoidable with a synchronous optimizer step) plus at
    most max(S - 3, 1) units when M >= S (none for S = 2 or M = S; checked for S <= 8, M <= 32);
    with M < S there is too little work to fill the V. Any M >= 1 is sound."""
    return [_with_messages(s, S, order) for s, order in enumerate(_zb_v_orders(S, M)[0])]


def v_rank_of(chunk: int, S: int) -> int:
    """The V placement: chunks 0..S-1 go down the ranks, chunks S..2S-1 come back up."""
    return chunk if chunk < S else 2 * S - 1 - chunk


def _zb_v_orders(S: int, M: int) -> tuple[list[list[tuple[str, int, int]]], int]:
    """Per rank, the (kind, mb, chunk) compute steps of ZB-V (zb_v's rule), and the unit-time span."""
    C, cap = 2 * S, 2 * S
    ready = {(0, m): 0 for m in range(M)}  # (chunk, mb) -> the unit its input is there (chunk 0: data)
    grad_ready: dict = {}  # (chunk, mb) -> the unit its output gradient is there
    next_f, next_b = [0] * C, [0] * C  # the next micro-batch of each chunk (in order)
    pending_w: list[list] = [[] for _ in range(S)]
    alive, orders = [0] * S, [[] for _ in range(S)]
    t = 0
    while any(len(o) < 6 * M for o in orders):
        for s in range(S):
            up, down = C - 1 - s, s
            b = [c for c in (up, down) if grad_ready.get((c, next_b[c]), t + 1) <= t]
            f = [c for c in (up, down) if next_f[c] < M and ready.get((c, next_f[c]), t + 1) <= t]
            if b:
                c, kind = b[0], "B"
                m = next_b[c]
                next_b[c] += 1
                pending_w[s].append((m, c))
                if c > 0:
                    grad_ready[(c - 1, m)] = t + 1
            elif f and alive[s] < cap:
                c, kind = f[0], "F"
                m = next_f[c]
                next_f[c], alive[s] = m + 1, alive[s] + 1
                if c < C - 1:
                    ready[(c + 1, m)] = t + 1
                else:
                    grad_ready[(c, m)] = t + 1  # the loss gives the output gradient at once
            elif pending_w[s]:
                (m, c), kind = pending_w[s].pop(0), "W"
                alive[s] -= 1
            else:
                continue  # idle this unit: nothing has arrived
            orders[s].append((kind, m, c))
        t += 1
        if t > 12 * M + 4 * S:
            raise AssertionError("zb-v list schedule made no progress")  # cannot happen: see tests
    return orders, t


def _with_messages(s: int, S: int, order: list[tuple[str, int, int]]) -> list[Step]:
    """A V rank's compute order with its receives and sends (none across the turn, S-1 <-> S: the
    same rank) and the gradient all-reduce at the end."""
    C, steps = 2 * S, []
    for kind, m, c in order:
        if kind == "F":
            steps += [st for st in forward_steps(c, C, m) if not _at_turn(st, S)]
        elif kind == "B":
            steps += [st for st in backward_steps(c, C, m, BackwardInput) if not _at_turn(st, S)]
        else:
            steps.append(BackwardWeight(m, c))
    return steps + [AllReduceGrads()]


def _at_turn(step: Step, S: int) -> bool:
    """A message between chunks S-1 and S, which both live on rank S-1."""
    return (isinstance(step, (SendAct, RecvGrad)) and step.chunk == S - 1) or (
        isinstance(step, (RecvAct, SendGrad)) and step.chunk == S
    )


def _zb_v_bubble(S: int, M: int) -> tuple[str, float]:
    """ZB-V's ideal bubble with F = B = W = 1 per chunk: 6M units of work per rank in a span T (the
    list schedule's); T >= 6M + S - 1, reached for many (S, M)."""
    T = _zb_v_orders(S, M)[1]
    return f"1 - 6M/T, T = {T} (>= 6M+S-1 = {6 * M + S - 1}): {T - 6 * M}/{T}", (T - 6 * M) / T


def _zb_h1_bubble(S: int, M: int) -> tuple[str, float]:
    """ZB-H1's ideal bubble with F = B = W = 1: the step takes 3M + S - 1 units when M >= S (only
    the S-1 units of the first forward's way down stay idle); with fewer micro-batches than stages
    there is not enough W work to fill the drain: 2(M + S) - 1 units."""
    if M >= S:
        return f"(S-1)/(3M+S-1) = {S - 1}/{3 * M + S - 1}", (S - 1) / (3 * M + S - 1)
    span = 2 * (M + S) - 1
    return f"1 - 3M/(2(M+S)-1) = {span - 3 * M}/{span} (M < S)", (span - 3 * M) / span


# -- the registry ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Schedule:
    """A named schedule: how to build it, how many model chunks it has, where each chunk runs, and its
    ideal bubble (F = 1, B = 2 time units; W = 1 of the 2 when the backward is split): a closed form,
    or for zb-v the span of its compiled order."""

    name: str
    title: str
    build: Callable[..., list[list[Step]]]
    chunks_per_rank: Callable[[int], int] = lambda V: 1
    formula: Callable[[int, int, int], tuple[str, float]] = lambda S, M, V: (
        f"(S-1)/(M+S-1) = {S - 1}/{M + S - 1}",
        (S - 1) / (M + S - 1),
    )
    split_backward: bool = False
    placement: Callable[[int, int], int] = lambda chunk, S: chunk % S

    def rank_of(self, chunk: int, S: int) -> int:
        """The rank that holds model chunk `chunk`: c mod S (chunk c = stage c when V = 1; rank s holds
        s, s+S, ... for the interleaved schedule); zb-v's V: chunks s and 2S-1-s (v_rank_of)."""
        return self.placement(chunk, S)

    def chunks(self, S: int, V: int = 1) -> int:
        """How many model chunks the pipeline is cut into."""
        return S * self.chunks_per_rank(V)


SCHEDULES: dict[str, Schedule] = {
    s.name: s
    for s in [
        Schedule(
            "naive",
            "naive (one micro-batch at a time)",
            naive,
            formula=lambda S, M, V: (f"(S-1)/S = {S - 1}/{S}", (S - 1) / S),
        ),
        Schedule("gpipe", "GPipe (all forwards, then all backwards)", gpipe),
        Schedule("1f1b", "1F1B (PipeDream-Flush)", one_f_one_b),
        Schedule(
            "interleaved",
            "interleaved 1F1B (V model chunks per rank)",
            interleaved,
            chunks_per_rank=lambda V: V,
            formula=lambda S, M, V: (f"(S-1)/(V*M+S-1) = {S - 1}/{V * M + S - 1}", (S - 1) / (V * M + S - 1)),
        ),
        Schedule(
            "zb-h1",
            "ZB-H1 (zero bubble, backward split into B and W)",
            zb_h1,
            formula=lambda S, M, V: _zb_h1_bubble(S, M),
            split_backward=True,
        ),
        Schedule(
            "zb-v",
            "ZB-V (zero bubble, 2 chunks per rank in a V, B and W split)",
            zb_v,
            chunks_per_rank=lambda V: 2,
            formula=lambda S, M, V: _zb_v_bubble(S, M),
            split_backward=True,
            placement=v_rank_of,
        ),
    ]
}
TITLES = {name: s.title for name, s in SCHEDULES.items()}


def build_schedule(schedule, S: int, M: int, V: int = 1) -> list[list[Step]]:
    """`schedule` may be a name from SCHEDULES, a schedule function, or already the per-rank lists."""
    if isinstance(schedule, str):
        if schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {schedule!r} (choose from {', '.join(SCHEDULES)})")
        return SCHEDULES[schedule].build(S, M, V)
    if callable(schedule):
        schedule = schedule(S, M)
    if all(getattr(st, "chunk", 0) == 0 for row in schedule for st in row):
        # Hand-made, one stage per rank, chunks not named: rank r's steps concern chunk (= stage) r.
        return [
            [replace(st, chunk=r) if hasattr(st, "chunk") else st for st in row]
            for r, row in enumerate(schedule)
        ]
    return schedule


def chunks_of(steps: list[Step]) -> list[int]:
    """The model chunks a rank's step list computes, in increasing order."""
    return sorted({st.chunk for st in steps if isinstance(st, COMPUTE)})


def in_flight_peaks(stages: list[list[Step]]) -> list[int]:
    """Per rank: the most (micro-batch, chunk) units forwarded whose activations are still held
    (freed by Backward, or by BackwardWeight when the backward is split)."""
    peaks = []
    for steps in stages:
        alive = peak = 0
        for step in steps:
            alive += isinstance(step, Forward) - isinstance(step, (Backward, BackwardWeight))
            peak = max(peak, alive)
        peaks.append(peak)
    return peaks
