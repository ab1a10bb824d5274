"""Pipeline schedules as data (simpar/parallel/schedules.py), the trace recorder and the timeline plot.

No MPI here: the schedules are plain lists of steps, so they can be checked exhaustively --
every micro-batch forwarded and backwarded exactly once per stage, messages in the right places,
dependencies respected, the textbook bubble (S-1)/(M+S-1) for GPipe and 1F1B, and the memory
claim (1F1B holds at most S-s micro-batches on stage s, GPipe all M).
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from simpar import costmodel as cm
from simpar.parallel.pipeline.check import format_grid, ideal_timeline, show_schedule_main
from simpar.parallel.pipeline.schedules import (
    AllReduceGrads,
    Backward,
    Forward,
    RecvAct,
    RecvGrad,
    SendAct,
    SendGrad,
    build_schedule,
    in_flight_peaks,
    partition_layers,
)
from simpar.runtime import trace
from tests.conftest import stage_split

# one chunk per rank, fused backward (the others: test_interleaved_and_zero_bubble.py)
CLASSIC = ["naive", "gpipe", "1f1b"]

SIZES = [(S, M) for S in range(1, 6) for M in range(1, 10)]


@pytest.mark.parametrize("name", CLASSIC)
def test_every_microbatch_once_with_its_messages(name):
    for S, M in SIZES:
        for s, steps in enumerate(build_schedule(name, S, M)):
            for kind in (Forward, Backward):
                assert sorted(st.mb for st in steps if type(st) is kind) == list(range(M)), (
                    name,
                    S,
                    M,
                    s,
                    kind,
                )
            expect = {RecvAct: s > 0, SendAct: s < S - 1, RecvGrad: s < S - 1, SendGrad: s > 0}
            for kind, present in expect.items():
                assert sorted(st.mb for st in steps if type(st) is kind) == (
                    list(range(M)) if present else []
                )
            # Locally: receive -> compute -> send, and a micro-batch's forward before its backward.
            at = {(type(st), getattr(st, "mb", None)): i for i, st in enumerate(steps)}
            for mb in range(M):
                chain = [
                    k for k in (RecvAct, Forward, SendAct, RecvGrad, Backward, SendGrad) if (k, mb) in at
                ]
                assert [at[(k, mb)] for k in chain] == sorted(at[(k, mb)] for k in chain)
            assert steps[-1] == AllReduceGrads() and sum(isinstance(st, AllReduceGrads) for st in steps) == 1


@pytest.mark.parametrize("name", CLASSIC)
def test_ideal_timeline_respects_dependencies(name):
    for S, M in SIZES:
        tl = ideal_timeline(name, S, M, forward=1, backward=2)
        when = {(s, kind, mb): (start, end) for s, row in enumerate(tl.rows) for start, end, kind, mb in row}
        assert len(when) == 2 * S * M
        for s, mb in itertools.product(range(S), range(M)):
            f, b = when[(s, "F", mb)], when[(s, "B", mb)]
            assert b[0] >= f[1]  # own forward first
            if s > 0:
                assert f[0] >= when[(s - 1, "F", mb)][1]  # input from the previous stage
            if s < S - 1:
                assert b[0] >= when[(s + 1, "B", mb)][1]  # gradient from the next stage
        for row in tl.rows:  # one thing at a time per stage
            ordered = sorted(row)
            assert all(a[1] <= b[0] for a, b in zip(ordered, ordered[1:]))


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("costs", [(1, 2), (1, 1), (2, 3)])
def test_bubble_is_textbook(name, costs):
    for S, M in SIZES:
        tl = ideal_timeline(name, S, M, *costs)
        assert tl.bubble == pytest.approx((S - 1) / (M + S - 1), abs=1e-12), (S, M)
        assert tl.makespan == pytest.approx((M + S - 1) * sum(costs))


def test_naive_bubble():
    for S, M in SIZES:
        assert ideal_timeline("naive", S, M).bubble == pytest.approx((S - 1) / S, abs=1e-12)


def test_in_flight_1f1b_bounded_gpipe_all():
    for S, M in SIZES:
        assert in_flight_peaks(build_schedule("1f1b", S, M)) == [min(S - s, M) for s in range(S)]
        assert in_flight_peaks(build_schedule("gpipe", S, M)) == [M] * S
        assert in_flight_peaks(build_schedule("naive", S, M)) == [1] * S


def test_deadlocking_schedule_is_caught():
    # Stage 0 waits for a gradient before sending the activation that would produce it.
    bad = [
        [Forward(0), RecvGrad(0), SendAct(0), Backward(0)],
        [RecvAct(0), Forward(0), Backward(0), SendGrad(0)],
    ]
    with pytest.raises(ValueError, match="deadlock"):  # schedule_check.ScheduleError
        ideal_timeline(bad, 2, 1)


def test_show_schedule_output():
    text = show_schedule_main("1f1b", 4, 8)
    lines = text.splitlines()
    grid = [line for line in lines if line.startswith("stage ")]
    assert len(grid) == 4
    assert grid[0].split("|")[1].split()[:4] == ["F0", "F1", "F2", "F3"]
    assert grid[3].split("|")[1].split()[:6] == [".", ".", ".", "F0", "B0", "B0"]
    assert "27.3%" in text and "3/11" in text
    assert "4, 3, 2, 1" in text
    assert "8, 8, 8, 8" in show_schedule_main("gpipe", 4, 8)
    assert format_grid(ideal_timeline("naive", 2, 1)).splitlines() == [
        "stage 0 | F0 .  .  .  B0 B0",
        "stage 1 | .  F0 B0 B0 .  .",
    ]


def test_partition_balances_parameters():
    assert partition_layers([64, 32, 32, 32, 10], 2) == [(0, 1), (1, 4)]
    assert partition_layers([64, 128, 128, 128, 10], 2) == [(0, 2), (2, 4)]
    assert partition_layers([64, 32, 32, 32, 10], 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert partition_layers([10] * 5, 2) == [(0, 2), (2, 4)]
    assert partition_layers([64, 32, 32, 32, 10], 2, [3, 1]) == [(0, 3), (3, 4)]
    with pytest.raises(ValueError):
        partition_layers([64, 32, 10], 2, [2, 1])
    # The whole rule (smallest largest stage, then later stages as long as possible), by brute force
    # in tests/conftest.py: the executor and the cost model's own formula must both follow it.
    rng = np.random.default_rng(0)
    for _ in range(30):
        widths = [int(w) for w in rng.integers(1, 50, size=rng.integers(3, 8))]
        for S in range(1, len(widths)):
            want = stage_split(widths, S)
            assert partition_layers(widths, S) == want, (widths, S)
            assert cm.stage_bounds(cm.Spec(widths=widths, batch=8, pp=S)) == want, (widths, S)
    # A tie: three equal layers over two stages, [1, 2] and [2, 1] -- the later stage takes two.
    assert partition_layers([10] * 4, 2) == stage_split([10] * 4, 2) == [(0, 1), (1, 3)]


def test_trace_span_is_noop_without_tracer_and_records_with_one():
    from simpar.runtime.context import Runtime

    plain = Runtime()
    with trace.span(plain, "F0", "forward"):
        pass
    rt = Runtime(tracer=trace.Tracer(3))
    tracer = rt.tracer
    trace.next_step(rt)
    with trace.span(rt, "F1", "forward", mb=1):
        pass
    with trace.span(rt, "recv act", "comm"):
        pass
    assert plain.tracer is None
    f, c = tracer.events
    assert f["ph"] == "X" and f["pid"] == 3 and f["tid"] == 0 and f["name"] == "F1" and f["dur"] >= 0
    assert f["args"] == {"kind": "forward", "step": 1, "mb": 1}
    assert c["tid"] == 1 and c["ts"] >= f["ts"]
    json.dumps(tracer.events)


def _fake_trace(S=2, M=2):
    """A perfect unit-time GPipe step, as two ranks would record it (µs)."""
    events = []
    for s, row in enumerate(ideal_timeline("gpipe", S, M).rows):
        for start, end, kind, mb in row:
            args = {"kind": "forward" if kind == "F" else "backward", "step": 1, "mb": mb, "stage": s}
            if kind == "F":
                args.update(stages=S, microbatches=M, schedule="gpipe")
            events.append(
                {
                    "name": f"{kind}{mb}",
                    "ph": "X",
                    "pid": s,
                    "tid": 0,
                    "ts": 1e6 + 1000 * start,
                    "dur": 1000 * (end - start),
                    "args": args,
                }
            )
    events.append(
        {
            "name": "recv act",
            "ph": "X",
            "pid": 1,
            "tid": 1,
            "ts": 1e6,
            "dur": 1000,
            "args": {"kind": "comm", "step": 1},
        }
    )
    return events


def test_timeline_plot(tmp_path, capsys):
    from simpar.cli.plot import timeline_main
    from simpar.report.timeline import measured_bubble

    events = _fake_trace()
    assert measured_bubble(events) == pytest.approx(1 / 3)  # = ideal GPipe bubble for S=2, M=2
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert timeline_main(["--timeline", str(path), "-o", str(tmp_path / "t.png")]) == 0
    assert "measured bubble 33.3%, ideal 33.3%" in capsys.readouterr().out
    assert (tmp_path / "t.png").stat().st_size > 10_000
