"""--arch gpt on the simulated clock (--clock sim): predict == simulate.

gpt.py's units (and tensor_gpt.py's, vocab_parallel.py's shares of them) charge the clock for their
matmuls and memory passes; costmodel/gpt_time.py writes the same charges again, with data
parallelism's buckets overlapping the last backward and tensor parallelism's collectives blocking
inside each unit; context parallelism's ring hops overlap their blocks (costmodel/cp_time.py). Both
are deterministic, so they agree to rounding on every layout the tour runs,
on a GPU node and on nodes of two devices (the dp group then crosses nodes). ZeRO and mixed precision
are refused under --clock sim for gpt (not modelled yet).
"""

from __future__ import annotations

import json

import pytest

from simpar.run.launch import run
from tests.mpi.runtime.test_simclock import TWO_PER_NODE
from tests.mpiutil import run_mpi

SHAPE = ["--arch", "gpt", "--n-layers", "2", "--hidden", "16", "--heads", "4", "--seq-len", "8"]
SHAPE += ["--vocab", "16", "--dataset", "copy", "--samples", "64", "--batch", "8", "--steps", "2"]


@pytest.mark.parametrize("hardware", ["dgx-h100", "two-per-node"])
def test_predict_equals_simulate_on_every_gpt_tour_layout(tmp_path, hardware):
    if hardware == "two-per-node":
        (tmp_path / "hw.json").write_text(json.dumps(TWO_PER_NODE))
        hardware = str(tmp_path / "hw.json")
    out = tmp_path / "tour"
    res = run(4, ["tour", *SHAPE, "--clock", "sim", "--hardware", hardware, "--out", str(out)], timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    names = {p.stem for p in out.glob("*.json")} - {"trace"}
    assert {"serial", "dp4", "tp4", "tp4-sp", "dp2xtp2", "dp2xtp2-sp"} <= names, names
    assert {"cp2", "cp4", "dp2xcp2", "cp4-ulysses"} <= names, names  # cp_time.py: ring hops overlapped
    for name in sorted(names):
        m = json.loads((out / f"{name}.json").read_text())
        sim, pred = m["time"]["sim"]["step_s"], m["predicted"]["time"]["step_s"]
        assert abs(pred / sim - 1) <= 1e-6, (name, hardware, sim, pred)
        assert m["prediction_mismatches"] == []


def test_grad_accum_and_the_cpu_profile_agree_too(tmp_path):
    """--grad-accum 2 with dp2 x tp2 --sp on the `local` profile (host progress: the buckets wait for
    the rank), float64."""
    path = tmp_path / "m.json"
    args = ["train", *SHAPE, "--clock", "sim", "--hardware", "local", "--dp", "2", "--tp", "2", "--sp"]
    res = run(4, [*args, "--grad-accum", "2", "--dtype", "float64", "--quiet", "--metrics-out", str(path)])
    assert res.returncode == 0, res.stderr[-3000:]
    m = json.loads(path.read_text())
    assert m["predicted"]["time"]["step_s"] == pytest.approx(m["time"]["sim"]["step_s"], rel=1e-9)


def test_zero_under_the_simulated_clock_is_refused_in_one_line():
    res = run_mpi(2, ["train", *SHAPE, "--clock", "sim", "--zero", "1", "--quiet"], timeout=60)
    assert res.returncode == 2
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "--clock sim with --zero or --precision mixed-*" in lines[0], res.stderr
