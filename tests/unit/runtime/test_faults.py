"""Fault injection in-process: the flight recorder keeps the last events, --inject refuses incomplete faults.

The tests that launch real MPI jobs: tests/mpi/runtime/test_faults.py.
"""

from __future__ import annotations

import json

import pytest

from simpar.runtime import flight


def test_the_recorder_keeps_only_the_last_events(tmp_path):
    rec = flight.FlightRecorder(0, 1, str(tmp_path))
    for i in range(flight.SIZE + 10):
        rec.record("send", "op", "model", "dp", 1, 8 * i)
    assert len(rec.events) == flight.SIZE and rec.events[0]["seq"] == 11
    path = rec.dump()
    assert json.loads(open(path).read())["events"][-1]["bytes"] == 8 * (flight.SIZE + 9)


@pytest.mark.parametrize("text", ["stall@rank=1,step=3", "nan@rank=-1,step=2", "kill@step=2"])
def test_parse_inject_refuses_incomplete_faults(text):
    from simpar.config import SimparError, parse_inject

    with pytest.raises(SimparError):
        parse_inject(text)
