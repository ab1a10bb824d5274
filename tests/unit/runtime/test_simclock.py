"""The simulated clock in-process: waits split into idle and exposed time, links shared, the README's command.

The tests that launch real MPI jobs: tests/mpi/runtime/test_simclock.py.
"""

from __future__ import annotations

import pytest

from simpar.runtime import simclock
from tests.paths import ROOT


def test_wait_splits_into_idle_and_exposed_communication():
    profile = simclock.Profile("p", 1e9, 1e-9, 0.0, 1.0, {"pp": simclock.Link(1e-6, 1e9)})
    clock = simclock.SimClock(profile)
    clock.begin_step(0.0)
    clock.compute(2e-6)
    clock.wait_until(10e-6, busy_from=6e-6)  # waited 8 us: 4 idle (peer not sending), 4 transferring
    step = clock.end_step(10e-6)
    assert step.idle_s == pytest.approx(4e-6) and step.comm_exposed_s == pytest.approx(4e-6)
    assert step.compute_s == pytest.approx(2e-6) and step.step_s == pytest.approx(10e-6)


def test_a_ranks_messages_share_its_links():
    profile = simclock.Profile("p", 1e9, 1e-9, 0.0, 1.0, {"dp": simclock.Link(1e-6, 1e9)})
    clock = simclock.SimClock(profile)
    first = clock.send("dp", 1, 1000)  # 1 us on the wire
    second = clock.send("dp", 2, 1000)  # waits for the first to leave
    assert first == pytest.approx((1e-6, 2e-6)) and second == pytest.approx((2e-6, 3e-6))

    class Received:  # two messages arriving together share the incoming link
        def __init__(self, start, arrival):
            self.start, self.arrival = start, arrival

        def transfer_start(self):
            return self.start

        def completion(self):
            return self.arrival

    done = clock.receive_round("dp", [Received(0.0, 2e-6), Received(0.0, 2e-6)])
    assert done == pytest.approx(3e-6)


def test_readme_quotes_the_sim_command():
    readme = (ROOT / "README.md").read_text()
    assert "--clock sim --hardware dgx-h100" in readme
