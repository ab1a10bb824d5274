"""Two runs in one process do not see each other's clock, recorder, tracer or kernels.

A run's runtime (runtime/context.py) travels with its world communicator and every group split from
it. Here one process (2 ranks) trains a simulated-clock run with a tracer, then a wall-clock run with
other kernels, then the first configuration again, and checks that

  * the wall run charges nothing to the first run's clock, adds no trace events to its tracer, and
    reports no simulated time; the first run's runtime is left exactly as it ended;
  * each run's runtime holds its own clock/recorder/kernels, and its groups carry that same runtime;
  * the third run (the first configuration again) repeats the first's losses, bytes and simulated
    times exactly: nothing left over from the runs before it changes it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from simpar.runtime.context import PLAIN, Runtime
from tests.mpiutil import run_script

SCRIPT = r"""
import json, os, sys
from mpi4py import MPI
from simpar.config import RunConfig
from simpar.run.loop import run_training
from simpar.runtime.comm import Communicator, Ledger

common = dict(dp=2, steps=3, batch=32, dtype="float64", quiet=True, watchdog=0)
trace = os.path.join(sys.argv[1], "trace.json")
sim_cfg = RunConfig(clock="sim", hardware="dgx-h100", trace=trace, kernels="numpy", **common)
wall_cfg = RunConfig(clock="wall", kernels="numba", **common)

def train(cfg):
    world = Communicator(MPI.COMM_WORLD, Ledger(), "world")
    return world, run_training(cfg, world)

first_world, first = train(sim_cfg)
rt = first_world.runtime
clock, tracer = rt.clock, rt.tracer
assert clock is not None and tracer is not None and rt.recorder is not None
assert rt.kernels.name == "numpy"
seen = (clock.now, len(clock.steps), clock.headers_sent, len(tracer.events), tracer.step)

second_world, second = train(wall_cfg)
rt2 = second_world.runtime
assert rt2.clock is None and rt2.tracer is None and rt2.recorder is not rt.recorder
assert rt2.kernels.name == "numba" and rt.kernels.name == "numpy"
assert (clock.now, len(clock.steps), clock.headers_sent, len(tracer.events), tracer.step) == seen, (
    "the wall-clock run charged the simulated run's clock or tracer")

third_world, third = train(sim_cfg)
assert third_world.runtime.clock is not clock
if MPI.COMM_WORLD.rank == 0:
    assert "sim" not in second.metrics["time"], second.metrics["time"].keys()
    assert first.metrics["losses"] == third.metrics["losses"]
    assert first.metrics["comm"] == third.metrics["comm"]
    assert first.metrics["time"]["sim"] == third.metrics["time"]["sim"]
    print("ISOLATED", json.dumps(first.metrics["time"]["sim"]["step_s"]))
"""


def test_two_runs_in_one_process_do_not_share_state(tmp_path: Path):
    script = tmp_path / "two_runs.py"
    script.write_text(SCRIPT)
    res = run_script(2, script, [str(tmp_path)], timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "ISOLATED" in res.stdout


def test_the_shared_plain_runtime_cannot_become_a_global_clock_or_kernel_choice():
    """Layers built outside a run share runtime.PLAIN; assigning to it would make it a process global
    by the back door (every such layer would see it), so it refuses. A Runtime of one's own is free."""
    with pytest.raises(AttributeError):
        PLAIN.clock = object()
    with pytest.raises(AttributeError):
        PLAIN.kernels = object()
    assert PLAIN.clock is None and PLAIN.kernels.name == "numpy"
    mine = Runtime()
    mine.clock = clock = object()
    assert mine.clock is clock and PLAIN.clock is None
