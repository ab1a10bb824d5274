"""Per-rank timing spans -> Chrome trace events (open the --trace file in https://ui.perfetto.dev).

    runtime.tracer = Tracer(rank, runtime.clock)   # run/setup.py does this when --trace is given
    with trace.span(comm.runtime, "F3", "forward", mb=3):
        ...                                # recorded as one complete event ("ph": "X")
    tracer.events                          # gathered to rank 0 and written as {"traceEvents": [...]}

Strategies call `span(runtime, ...)` wherever they want a bar in the timeline, with the runtime
their communicators carry (context.py). With no tracer in it (the default), `span` returns one
shared do-nothing context manager: the cost is a function call and an attribute lookup, so the
instrumentation can stay in the hot path.

Event layout (Chrome trace format, "complete" events): pid = the world rank, tid 0 = compute,
tid 1 = communication, ts/dur in microseconds. Every event carries args {"kind": ..., "step": ...}
(kind is one of KINDS; step counts `next_step()` calls) plus whatever the caller adds (e.g. mb),
so the timeline plot can colour by kind and measure one training step at a time.

Under `--clock sim` timestamps are simulated microseconds since the run began (simclock.py).
Otherwise they are wall-clock microseconds since the epoch, advanced with the high-resolution
monotonic clock: ranks on one machine share that clock, so their events line up.
"""

from __future__ import annotations

import time

KINDS = ("forward", "backward", "comm", "allreduce", "other")
COMM_KINDS = ("comm", "allreduce")  # drawn on tid 1


class Tracer:
    """Collects this rank's events: one per run, carried by its runtime (context.py). `clock`: the
    run's simulated clock, whose time the events then take, or None (wall time)."""

    def __init__(self, rank: int, clock=None):
        self.rank, self.clock = rank, clock
        self.events: list[dict] = []
        self.step = 0
        self._wall0 = time.time()
        self._perf0 = time.perf_counter()

    def now_us(self) -> float:
        clock = self.clock
        if clock is not None:  # --clock sim: the trace is in simulated microseconds from the start
            clock.sync_measured()
            return clock.now * 1e6
        return (self._wall0 + (time.perf_counter() - self._perf0)) * 1e6

    def _clock_arg(self) -> dict:
        """Events of a --clock sim run say so: their times are simulated, on this hardware profile."""
        clock = self.clock
        return {"clock": f"simulated on {clock.profile.name}"} if clock is not None else {}

    def add(self, name: str, kind: str, start_us: float, end_us: float, args: dict | None = None) -> None:
        self.events.append(
            {
                "name": name,
                "ph": "X",
                "pid": self.rank,
                "tid": 1 if kind in COMM_KINDS else 0,
                "ts": start_us,
                "dur": max(end_us - start_us, 0.0),
                "cat": kind,
                "args": {"kind": kind, "step": self.step, **self._clock_arg(), **(args or {})},
            }
        )


class _Span:
    __slots__ = ("tracer", "name", "kind", "args", "start")

    def __init__(self, tracer: Tracer, name: str, kind: str, args: dict):
        self.tracer, self.name, self.kind, self.args = tracer, name, kind, args

    def __enter__(self):
        self.start = self.tracer.now_us()
        return self

    def __exit__(self, *exc):
        self.tracer.add(self.name, self.kind, self.start, self.tracer.now_us(), self.args)
        return False


class _NoSpan:
    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NO_SPAN = _NoSpan()


def span(runtime, name: str, kind: str = "other", **args):
    """Time the `with` block as one event named `name` (e.g. "F3", "recv grad", "allreduce"), if
    `runtime` (a communicator's, context.py) has a tracer."""
    if runtime.tracer is None:
        return _NO_SPAN
    return _Span(runtime.tracer, name, kind, args)


def next_step(runtime) -> None:
    """Mark the start of a new training step (events carry the step number in args)."""
    if runtime.tracer is not None:
        runtime.tracer.step += 1
