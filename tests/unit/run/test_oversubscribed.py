"""More ranks than cores (run/oversubscribed.py): when the tour says so, and what its line reports.

No timed assertion: the measured round is only checked to be a positive time, median <= 90th
percentile; the MPI tour test (tests/mpi/run/test_tour.py) checks the line appears on 4 ranks when
the machine has fewer cores."""

from __future__ import annotations

from mpi4py import MPI

from simpar.run.oversubscribed import message_round_s, oversubscribed, oversubscription_note, wait_yielding


def test_oversubscribed_only_when_ranks_outnumber_known_cores():
    assert oversubscribed(4, 2)
    assert not oversubscribed(2, 2)
    assert not oversubscribed(4, 0)  # a GPU profile: no core count, no claim


def test_note_reports_the_measured_round_against_alpha():
    note = oversubscription_note(4, 2, (250e-6, 1.5e-3), 12e-6)
    assert "4 ranks on 2 cores" in note
    assert "250 us (median; slowest tenth 1500 us)" in note
    assert "alpha 12 us" in note and "docs/oversubscription.md" in note


def test_round_and_yielding_wait_run_on_one_rank():
    wait_yielding(MPI.COMM_SELF, sleep_s=1e-5)  # returns: a barrier of one
    median, p90 = message_round_s(MPI.COMM_SELF, rounds=3, batches=5)
    assert 0 < median <= p90
