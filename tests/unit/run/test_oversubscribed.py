"""More ranks than cores (run/oversubscribed.py): when the tour says so, and what its line reports.

No timed assertion; no MPI here (tests/mpi/run/test_oversubscribed_round.py runs the measured round
on real ranks); the MPI tour test (tests/mpi/run/test_tour.py) checks the line appears on 4 ranks when
the machine has fewer cores."""

from __future__ import annotations

from simpar.run.oversubscribed import (
    gap_per_round_s,
    oversubscribed,
    oversubscription_note,
    rounds_per_step,
)


def test_oversubscribed_only_when_ranks_outnumber_known_cores():
    assert oversubscribed(4, 2)
    assert not oversubscribed(2, 2)
    assert not oversubscribed(4, 0)  # a GPU profile: no core count, no claim


def test_note_reports_the_measured_round_and_gap_against_alpha():
    note = oversubscription_note(4, 2, (7e-6, 9e-6), 150e-6, 12e-6)
    assert "4 ranks on 2 cores" in note
    assert "a median 150 us per message round" in note
    assert "measured 7 us (slowest tenth 9 us; the profile's alpha 12 us)" in note
    assert "docs/oversubscription.md" in note
    assert "per message round" not in oversubscription_note(4, 2, (7e-6, 9e-6), None, 12e-6)


def layout(world: int, steps: int, messages: list, scalar_calls: int, measured: float, predicted: float):
    """A layout's metrics as the tour holds them: per rank, p2p messages sent and the loss all-reduce
    booked as 2 control messages per call (runtime/comm.py)."""
    ranks = [
        {
            "messages": {"data": 0, "model": n, "activation": 0},
            "by_op": {"control/allreduce-scalar": {"messages": 2 * scalar_calls}},
        }
        for n in messages
    ]
    return {
        "world_size": world,
        "steps": steps,
        "comm": {"ranks": ranks},
        "time": {"step_s_median": measured},
        "predicted": {"time": {"step_s": predicted}},
    }


def test_rounds_and_gap_per_round_follow_their_closed_forms():
    # dp4's ring: 6 messages a step on every rank, one loss all-reduce a step, over 150 steps
    dp4 = layout(4, 150, [900, 900, 900, 900], 150, measured=1.8e-3, predicted=0.6e-3)
    assert rounds_per_step(dp4) == 6 + 1
    # the busiest rank counts: a pipeline's middle stage sends more than its ends
    pp = layout(4, 10, [20, 40, 40, 20], 10, measured=2.0e-3, predicted=1.0e-3)
    assert rounds_per_step(pp) == 4 + 1
    serial = layout(1, 150, [0], 0, measured=0.5e-3, predicted=0.4e-3)
    gaps = [(1.8e-3 - 0.6e-3) / 7, (2.0e-3 - 1.0e-3) / 5]
    assert abs(gap_per_round_s([("serial", serial), ("dp4", dp4), ("pp", pp)]) - sum(gaps) / 2) < 1e-15
    assert gap_per_round_s([("serial", serial)]) is None
