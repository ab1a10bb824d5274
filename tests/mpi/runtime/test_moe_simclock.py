"""The MoE transformer (--arch gpt --experts E, ep inside dp) on the simulated clock: predict == simulate.

model/moe_charges.py charges each block's attention half, router, experts (on the rows they received)
and routing passes; the all-to-alls block on the ep group's stream, the gradient all-reduces on dp's
and edp's. costmodel/gpt_moe_time.py writes the same step from the run's routing histograms, every
rank followed through every all-to-all round, so the two agree to rounding (measured ~1e-15). One
tour launch runs every MoE layout 4 ranks offer under sim (serial, dp4, dp4 x ep2, dp4 x ep4) with
pairwise all-to-alls on nodes of two devices (dp and edp groups cross nodes) in bfloat16; one train
runs Bruck's all-to-all with --grad-accum 2 and top-1 routing that drops tokens, on the CPU profile.
"""

from __future__ import annotations

import json

from simpar.run.launch import run
from tests.mpi.runtime.test_gpt_simclock import SHAPE, assert_agrees, hardware_option

MOE_LAYOUTS = {"serial", "dp4", "dp4xep2", "dp4xep4"}


def test_every_moe_tour_layout_agrees(tmp_path):
    out = tmp_path / "tour"
    args = ["tour", *SHAPE, "--experts", "4", "--clock", "sim", "--precision", "mixed-bf16"]
    args += ["--out", str(out)]
    res = run(4, [*args, "--hardware", hardware_option(tmp_path, "two-per-node")], timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    names = {p.stem for p in out.glob("*.json")} - {"trace"}
    assert MOE_LAYOUTS <= names, names
    for name in sorted(names):
        assert_agrees(json.loads((out / f"{name}.json").read_text()), name)


def test_bruck_with_accumulation_and_drops_agrees(tmp_path):
    """The ranks' experts receive different rows (top-1, capacity 1: tokens dropped), so their clocks
    drift apart and each all-to-all round waits on the slower peer: the closed form follows that."""
    path = tmp_path / "m.json"
    args = ["train", *SHAPE, "--experts", "4", "--dp", "4", "--ep", "4", "--alltoall", "bruck"]
    args += ["--grad-accum", "2", "--top-k", "1", "--capacity-factor", "1.0", "--clock", "sim"]
    res = run(4, [*args, "--hardware", "local", "--quiet", "--metrics-out", str(path)])
    assert res.returncode == 0, res.stderr[-3000:]
    m = json.loads(path.read_text())
    assert sum(sum(step) for step in m["moe"]["dropped"]) > 0
    computes = [r["compute_s"] for r in m["time"]["sim"]["per_rank"]]
    assert max(computes) > min(computes), computes  # imbalanced experts: the waits matter
    assert_agrees(m, "bruck")
