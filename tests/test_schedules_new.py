"""Interleaved 1F1B and ZB-H1 as data, the static checker, and the cost model's own orders (no MPI).

* Every (micro-batch, chunk) is forwarded, backwarded (B and W for zb-h1) exactly once, on the rank
  that holds the chunk (c mod S), with its messages.
* The ideal bubble: interleaved (S-1)/(V*M+S-1) of the step (= (S-1)/(V*M) of the ideal time,
  Narayanan et al. 2021, sec. 2.2); zb-h1 with F = B = W: (S-1)/(3M+S-1), a third of 1F1B's.
* Memory: zb-h1 keeps min(S, M) micro-batches alive on every stage: 1F1B's peak (stage 0's).
* The static checker refuses a hand-made deadlock and an unreceived send: as a ScheduleError, and
  from the CLI as one line `simpar: error: ...` with exit status 2.
* The cost model's orders and alive activations (costmodel/order.py, written independently) equal the
  executor's schedules.
"""

from __future__ import annotations

import json

import pytest

from simpar.config import RunConfig, SimparError, validate
from simpar.costmodel.order import peak_alive, stage_order
from simpar.parallel.schedule_check import ScheduleError, check, refuse_unsound, show_schedule_main
from simpar.parallel.schedules import (
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

from .mpiutil import run_mpi


def sizes(name):
    for S in range(2, 6):
        for M in range(1, 13):
            for V in (2, 3) if name == "interleaved" else (1,):
                if name != "interleaved" or M % S == 0:
                    yield S, M, V


@pytest.mark.parametrize("name", ["interleaved", "zb-h1"])
def test_every_unit_once_on_its_rank_with_its_messages(name):
    kinds = (Forward, BackwardInput, BackwardWeight) if name == "zb-h1" else (Forward, Backward)
    for S, M, V in sizes(name):
        C = S * V
        for s, steps in enumerate(build_schedule(name, S, M, V)):
            mine = list(range(s, C, S))
            for kind in kinds:
                got = sorted((st.mb, st.chunk) for st in steps if type(st) is kind)
                assert got == [(m, c) for m in range(M) for c in mine], (name, S, M, V, s, kind)
            for kind, present in ((RecvAct, lambda c: c > 0), (SendAct, lambda c: c < C - 1)):
                got = sorted((st.mb, st.chunk) for st in steps if type(st) is kind)
                assert got == [(m, c) for m in range(M) for c in mine if present(c)]
            for kind, present in ((RecvGrad, lambda c: c < C - 1), (SendGrad, lambda c: c > 0)):
                got = sorted((st.mb, st.chunk) for st in steps if type(st) is kind)
                assert got == [(m, c) for m in range(M) for c in mine if present(c)]


@pytest.mark.parametrize("name", ["interleaved", "zb-h1"])
def test_ideal_bubble_is_the_formula(name):
    for S, M, V in sizes(name):
        tl = check(name, S, M, V)
        assert tl.bubble == pytest.approx(SCHEDULES[name].formula(S, M, V)[1], abs=1e-12), (S, M, V)
        if name == "zb-h1":  # a third of 1F1B's idle time per stage: (S-1) units instead of 3(S-1)
            assert tl.makespan == (3 * M + S - 1 if M >= S else 2 * (M + S) - 1)
            assert in_flight_peaks(build_schedule(name, S, M)) == [min(S, M)] * S


def test_interleaved_needs_m_divisible_by_s_and_two_chunks():
    with pytest.raises(SimparError, match="divisible by --pp"):
        validate(RunConfig(pp=2, schedule="interleaved", virtual_stages=2, microbatches=3), 2)
    with pytest.raises(SimparError, match="virtual-stages V >= 2"):
        validate(RunConfig(pp=2, schedule="interleaved", microbatches=4), 2)
    with pytest.raises(SimparError, match="model chunks, but the model has 4 layers"):
        validate(RunConfig(pp=4, schedule="interleaved", virtual_stages=2, microbatches=4), 4)
    with pytest.raises(SimparError, match="needs --schedule interleaved"):
        validate(RunConfig(pp=2, schedule="1f1b", virtual_stages=2), 2)


DEADLOCK = [  # stage 0 waits for a gradient before sending the activation that would produce it
    [Forward(0), RecvGrad(0), SendAct(0), Backward(0)],
    [RecvAct(0), Forward(0), Backward(0), SendGrad(0)],
]
UNRECEIVED = [  # stage 1 never takes micro-batch 1's activations
    [Forward(0), SendAct(0), Forward(1), SendAct(1), RecvGrad(0), Backward(0)],
    [RecvAct(0), Forward(0), Backward(0), SendGrad(0)],
]


def test_checker_refuses_deadlock_and_unreceived_send():
    with pytest.raises(ScheduleError, match="deadlocks: rank 0 at RecvGrad"):
        check(DEADLOCK, 2, 1)
    with pytest.raises(ScheduleError, match="unreceived"):
        check(UNRECEIVED, 2, 2)
    with pytest.raises(SimparError, match="refused by the static check"):
        refuse_unsound(DEADLOCK, 2, 1)
    for name in SCHEDULES:  # the built-in ones all pass
        for S, M, V in sizes(name):
            refuse_unsound(name, S, M, V)


def test_cli_refuses_a_hand_made_deadlock_in_one_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([[[type(st).__name__, st.mb] for st in row] for row in DEADLOCK]))
    res = run_mpi(0, ["plan", "--pp", "2", "--microbatches", "1", "--schedule", str(path), "--show-schedule"])
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("simpar: error: ") and "deadlocks" in lines[0], res.stderr
    res = run_mpi(
        0, ["plan", "--pp", "4", "--microbatches", "6", "--schedule", "interleaved", "--show-schedule"]
    )
    assert res.returncode == 2 and "simpar: error:" in res.stderr


def test_show_schedule_zb_h1_and_interleaved():
    text = show_schedule_main("zb-h1", 4, 8)
    grid = [line.split("|")[1].split() for line in text.splitlines() if line.startswith("stage ")]
    assert grid[3][:8] == [".", ".", ".", "F0", "B0", "F1", "B1", "F2"]
    assert grid[0][-2:] == ["B7", "W7"] and grid[3][-4:] == ["W4", "W5", "W6", "W7"]
    assert "11.1%" in text and "(S-1)/(3M+S-1) = 3/27" in text and "4, 4, 4, 4" in text
    text = show_schedule_main("interleaved", 4, 8, V=2)
    assert "(S-1)/(V*M+S-1) = 3/19" in text and "15.8%" in text
    row0 = [line for line in text.splitlines() if line.startswith("stage 0")][0].split("|")[1].split()
    assert row0[:8] == ["F0", "F1", "F2", "F3", "f0", "f1", "f2", "f3"]  # f: the rank's 2nd chunk


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_cost_model_order_and_memory_equal_the_executor(name):
    for S, M, V in sizes(name):
        stages = build_schedule(name, S, M, V)
        peaks = in_flight_peaks(stages)
        for s, steps in enumerate(stages):
            ran = [(LETTER[type(st)], st.mb, st.chunk) for st in steps if isinstance(st, COMPUTE)]
            assert stage_order(name, S, M, s, V) == ran, (name, S, M, V, s)
            assert peak_alive(name, S, M, s, V, lambda m, c: 1) == peaks[s]
            # uneven sizes too: (m + 1) * (c + 1) per unit, replayed from the executor's list
            alive = peak = 0
            for st in steps:
                if isinstance(st, (Forward, Backward, BackwardWeight)):
                    alive += (1 if isinstance(st, Forward) else -1) * (st.mb + 1) * (st.chunk + 1)
                    peak = max(peak, alive)
            assert peak_alive(name, S, M, s, V, lambda m, c: (m + 1) * (c + 1)) == peak, (name, S, M, V, s)
