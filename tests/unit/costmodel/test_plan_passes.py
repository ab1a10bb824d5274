"""`plan --arch gpt` against the simulated clock's closed form where their models meet: a layout simpar
can run without a pipeline (the plan puts its micro-batches through an average stage and 1F1B's bubble;
a run follows the schedule), --sp included (its LayerNorm-gradient all-reduces once a step: plan_comm.
sp_sync_seconds), with the collectives that keep a tp group in step (ring, auto, rabenseifner: tree
and ps leave its ranks apart, and a run's clock follows each -- tp_group_time.py -- while the plan
charges every collective on its critical path, 0.2-0.5% more on these tiny shapes).
There the plan's step -- matmuls, memory-bound work (plan_passes.py), tp's and dp's collectives -- is
the simulated step of the same model (predict_from_config: gpt_time.py, which tests/mpi/runtime/
test_gpt_simclock.py holds equal to the clock of a real run), to rounding: one set of counts."""

from __future__ import annotations

import pytest

from simpar.config import RunConfig
from simpar.costmodel import gpt as cg
from simpar.costmodel import gpt_plan as gp
from simpar.costmodel import hardware, predict_from_config

TINY = dict(blocks=2, hidden=32, heads=4, vocab=16, seq_len=16, batch=8)
LAYOUTS = [
    dict(),
    dict(dp=2),
    dict(dp=4, collectives="tree"),
    dict(tp=2),
    dict(tp=2, dp=2),
    dict(grad_accum=2),
    dict(optimizer="adam"),
    dict(tp=2, optimizer="adam", collectives="auto"),
    dict(tp=2, sp=True),
    dict(tp=2, dp=2, sp=True, grad_accum=2),
    dict(tp=4, sp=True, collectives="rabenseifner"),
    dict(tp=2, sp=True, optimizer="adam", collectives="auto"),
]


@pytest.mark.parametrize("hardware_name", ["dgx-h100", "local"])
@pytest.mark.parametrize(
    "layout", LAYOUTS, ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()) or "serial"
)
def test_the_plan_is_the_simulated_step_of_a_layout_simpar_runs(hardware_name, layout):
    hw = hardware.load(hardware_name)
    cfg = RunConfig(arch="gpt", dataset="copy", dtype="float32", **TINY, **layout)
    world = layout.get("dp", 1) * layout.get("tp", 1)
    sim = predict_from_config(cfg, world, steps=1, hw=hw)["time"]["step_s"]
    shape = cg.Shape(TINY["blocks"], TINY["hidden"], TINY["heads"], TINY["seq_len"], TINY["vocab"])
    kw = {k: v for k, v in layout.items() if k != "optimizer"}
    plan = gp.plan(shape, TINY["batch"], hw, precision="fp32", optimizer=layout.get("optimizer", "sgd"), **kw)
    assert plan["time"]["step_s"] == pytest.approx(sim, rel=1e-12)


def test_the_ring_keeps_its_scores_on_chip_and_long_sequences_pay_for_materialized_ones():
    hw = hardware.load("dgx-h100")
    long = cg.Shape(4, 1024, 16, 32768, 50257)
    on, off = (gp.plan(long, 8, hw, dp=8, materialized_scores=m)["time"]["memory_s"] for m in (True, False))
    # the softmax's 6 + 4 passes over a s^2 scores a layer, forward and backward, 2 bytes each
    scores = 4 * (6 + 4) * 1 * 32768 * 16 * 32768 * 2 * hw.gamma / 3
    assert on - off == pytest.approx(scores, rel=1e-9)
