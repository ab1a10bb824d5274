"""Interleaved 1F1B, ZB-H1 and ZB-V as data, the static checker, and the cost model's own orders (no MPI).

* Every (micro-batch, chunk) is forwarded, backwarded (B and W for zb-h1, zb-v) exactly once, on the
  rank that holds the chunk (c mod S; zb-v: s and 2S-1-s), with its messages (none across zb-v's turn).
* The ideal bubble: interleaved (S-1)/(V*M+S-1) of the step (= (S-1)/(V*M) of the ideal time,
  Narayanan et al. 2021, sec. 2.2); zb-h1 with F = B = W: (S-1)/(3M+S-1), a third of 1F1B's; zb-v
  1 - 6M/T with T >= 6M + S - 1, met for S = 2 and M >= 2.
* Memory: zb-h1 keeps min(S, M) micro-batches alive on every stage: 1F1B's peak (stage 0's); zb-v
  min(2S, 2M) half-stage chunks: the same S micro-batches' worth.
* The static checker refuses a hand-made deadlock and an unreceived send: as a ScheduleError, and
  from the CLI as one line `simpar: error: ...` with exit status 2.
* The cost model's orders and alive activations (costmodel/order.py, written independently) equal the
  executor's schedules.
"""

from __future__ import annotations

import pytest

from simpar.config import RunConfig, SimparError, validate
from simpar.costmodel.order import peak_alive, stage_order
from simpar.parallel.pipeline.check import ScheduleError, check, refuse_unsound, show_schedule_main
from simpar.parallel.pipeline.schedules import (
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


def sizes(name):
    for S in range(2, 6):
        for M in range(1, 13):
            for V in (2, 3) if name == "interleaved" else (1,):
                if name != "interleaved" or M % S == 0:
                    yield S, M, V


@pytest.mark.parametrize("name", ["interleaved", "zb-h1", "zb-v"])
def test_every_unit_once_on_its_rank_with_its_messages(name):
    split = name in ("zb-h1", "zb-v")
    kinds = (Forward, BackwardInput, BackwardWeight) if split else (Forward, Backward)
    for S, M, V in sizes(name):
        C = 2 * S if name == "zb-v" else S * V
        # The V: chunk c on rank c going down, on rank 2S-1-c coming back up; else c mod S.
        holder = (lambda c: min(c, C - 1 - c)) if name == "zb-v" else (lambda c: c % S)
        for s, steps in enumerate(build_schedule(name, S, M, V)):
            mine = [c for c in range(C) if holder(c) == s]
            for kind in kinds:
                got = sorted((st.mb, st.chunk) for st in steps if type(st) is kind)
                assert got == [(m, c) for m in range(M) for c in mine], (name, S, M, V, s, kind)
            # A message only where the neighbouring chunk is on another rank.
            for kind, nb in ((RecvAct, -1), (SendAct, 1), (RecvGrad, 1), (SendGrad, -1)):
                got = sorted((st.mb, st.chunk) for st in steps if type(st) is kind)
                crosses = lambda c: 0 <= c + nb < C and holder(c + nb) != s  # noqa: E731
                assert got == [(m, c) for m in range(M) for c in mine if crosses(c)], (name, S, M, s, kind)


@pytest.mark.parametrize("name", ["interleaved", "zb-h1", "zb-v"])
def test_ideal_bubble_is_the_formula(name):
    for S, M, V in sizes(name):
        tl = check(name, S, M, V)
        assert tl.bubble == pytest.approx(SCHEDULES[name].formula(S, M, V)[1], abs=1e-12), (S, M, V)
        if name == "zb-h1":  # a third of 1F1B's idle time per stage: (S-1) units instead of 3(S-1)
            assert tl.makespan == (3 * M + S - 1 if M >= S else 2 * (M + S) - 1)
            assert in_flight_peaks(build_schedule(name, S, M)) == [min(S, M)] * S
        if name == "zb-v":  # 6M units of work per rank; rank s cannot start before unit s
            assert tl.makespan >= 6 * M + S - 1
            assert tl.bubble == pytest.approx((tl.makespan - 6 * M) / tl.makespan, abs=1e-12)
            if S == 2 and M >= 2 or M == S:
                assert tl.makespan == 6 * M + S - 1, (S, M)
            if M >= S:  # a few units over the bound at most (the zb_v docstring)
                assert tl.makespan <= 6 * M + S - 1 + max(S - 3, 1), (S, M)
            # 2S half-stage units alive at most: S whole micro-batches, 1F1B's stage-0 peak
            assert in_flight_peaks(build_schedule(name, S, M)) == [min(2 * S, 2 * M)] * S


def test_zb_v_needs_two_layers_per_rank_and_one_chunk_count():
    with pytest.raises(SimparError, match="zb-v cuts the model into 2 x --pp 4 = 8 chunks.*has 4 layers"):
        validate(RunConfig(pp=4, schedule="zb-v", microbatches=8), 4)
    with pytest.raises(SimparError, match="needs --schedule interleaved"):
        validate(RunConfig(pp=2, schedule="zb-v", virtual_stages=2), 2)
    with pytest.raises(SimparError, match="must give 4 positive counts"):
        validate(RunConfig(pp=2, schedule="zb-v", microbatches=2, stage_layers=[3, 1]), 2)
    validate(RunConfig(pp=2, schedule="zb-v", microbatches=1, stage_layers=[1, 1, 1, 1]), 2)  # any M


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


def test_a_malformed_schedule_file_says_what_is_wrong(tmp_path):
    """In-process (no MPI): each kind of mistake in a hand-made schedule names the step and the form."""
    from simpar.parallel.pipeline.check import load_schedule_file

    cases = [
        ('{"bad": 1}', "not a schedule: expected a JSON list with one list per rank"),
        ("[[", "not JSON"),
        ('[[["Fwd", 0]]]', 'rank 0\'s step ["Fwd", 0] is not a step'),
        ('[[["Forward"]]]', "give a micro-batch"),
        ('[[["Forward", -1]]]', "whole numbers >= 0"),
    ]
    for text, fragment in cases:
        path = tmp_path / "s.json"
        path.write_text(text)
        with pytest.raises(SimparError) as err:
            load_schedule_file(str(path))
        assert fragment in str(err.value) and "\n" not in str(err.value), (text, str(err.value))


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
