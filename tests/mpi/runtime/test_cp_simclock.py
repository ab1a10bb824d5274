"""Context parallelism (--cp) on the simulated clock: predict == simulate, and the ring's overlap is real.

context_attention.py charges each ring hop's causal blocks between posting the hop's K/V transfers
and waiting for them, so the clock runs the two at once; Ulysses' all-to-alls block. costmodel/
cp_time.py writes the same step in closed form, never calling that code. The gpt tour test
(test_gpt_simclock.py) checks cp2, cp4, dp2xcp2, cp2xtp2 and cp4-ulysses on a GPU node and on nodes of two
devices (cp4's ring then leaves the node), where the tiny model's hops wait for their transfers; here a
longer sequence on the `local` CPU profile, where the blocks take longer than the transfers, and
--grad-accum on nodes of two.
"""

from __future__ import annotations

import json

import pytest

from simpar.costmodel import gpt as cg
from simpar.costmodel.cp import plan_cp
from simpar.run.launch import run
from tests.mpi.runtime.test_simclock import TWO_PER_NODE
from tests.unit.costmodel.test_cp_plan_time import MATMULS_ONLY, TINY

# s = 64, h = 32 on `local`: a ring block computes longer than its K/V take to arrive (cp_time.py)
LONG = ["--arch", "gpt", "--n-layers", "2", "--hidden", "32", "--heads", "4", "--seq-len", "64"]
LONG += ["--vocab", "16", "--dataset", "copy", "--samples", "32", "--batch", "8", "--steps", "2"]
CP_LAYOUTS = {"cp2", "cp4", "dp2xcp2", "cp2xtp2", "cp4-ulysses"}


def test_predict_equals_simulate_when_the_ring_hides_its_transfers(tmp_path):
    out = tmp_path / "tour"
    res = run(
        4,
        ["tour", *LONG, "--clock", "sim", "--hardware", "local", "--out", str(out), "--no-plots"],
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert CP_LAYOUTS <= {p.stem for p in out.glob("*.json")}
    for name in sorted(CP_LAYOUTS):
        m = json.loads((out / f"{name}.json").read_text())
        sim, pred = m["time"]["sim"], m["predicted"]["time"]["step_s"]
        assert abs(pred / sim["step_s"] - 1) <= 1e-6, (name, sim["step_s"], pred)
        assert m["prediction_mismatches"] == []
        overlapped = [r["comm_overlapped_s"] for r in sim["per_rank"]]
        if "ulysses" in name:  # its all-to-alls block: nothing to hide behind
            assert overlapped == [0.0] * len(overlapped), name
        else:  # the K/V transfers ran while the blocks were computed
            assert min(overlapped) > 0, (name, overlapped)


@pytest.mark.parametrize("layout", [["--dp", "2", "--cp", "2"], ["--cp", "4", "--cp-algo", "ulysses"]])
def test_grad_accum_across_nodes_of_two(tmp_path, layout):
    hw, path = tmp_path / "hw.json", tmp_path / "m.json"
    hw.write_text(json.dumps(TWO_PER_NODE))
    args = ["train", *LONG, *layout, "--grad-accum", "2", "--dtype", "float64", "--quiet"]
    res = run(4, [*args, "--clock", "sim", "--hardware", str(hw), "--metrics-out", str(path)])
    assert res.returncode == 0, res.stderr[-3000:]
    m = json.loads(path.read_text())
    assert m["predicted"]["time"]["step_s"] == pytest.approx(m["time"]["sim"]["step_s"], rel=1e-6)


def test_plan_equals_a_simulated_run_where_their_models_meet(tmp_path):
    """`plan --cp` (costmodel/cp.py) prices the ring hop by hop as the clock runs it: on a profile that
    charges matmuls only (the plan's model), cp4's simulated step is the plan's step. Its hop 0 hides
    the K/V transfer behind three blocks, the later hops' two blocks do not."""
    hw, path = tmp_path / "hw.json", tmp_path / "m.json"
    hw.write_text(json.dumps(MATMULS_ONLY.to_dict()))
    tiny = ["--n-layers", str(TINY["blocks"]), "--hidden", str(TINY["hidden"]), "--heads", str(TINY["heads"])]
    tiny += ["--vocab", str(TINY["vocab"]), "--batch", str(TINY["batch"]), "--seq-len", "64"]
    args = ["train", "--arch", "gpt", *tiny, "--dataset", "copy", "--samples", "32", "--steps", "2"]
    args += ["--cp", "4", "--dtype", "float64", "--clock", "sim", "--hardware", str(hw), "--quiet"]
    res = run(4, [*args, "--metrics-out", str(path)])
    assert res.returncode == 0, res.stderr[-3000:]
    shape = cg.Shape(TINY["blocks"], TINY["hidden"], TINY["heads"], 64, TINY["vocab"])
    plan = plan_cp(shape, TINY["batch"], MATMULS_ONLY, 4, "ring", precision="fp64", optimizer="sgd")
    sim = json.loads(path.read_text())["time"]["sim"]
    assert plan["time"]["step_s"] == pytest.approx(sim["step_s"], rel=1e-9)
    assert 0 < plan["time"]["cp_s"] < plan["time"]["cp_wire_s"]  # part of the traffic hidden, part not
