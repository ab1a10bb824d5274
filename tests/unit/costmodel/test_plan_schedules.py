"""`plan --arch gpt --schedule 1f1b|gpipe|interleaved [--virtual-stages v]`: the bubble, the sends and the
activations in flight of each, written here from the papers (Huang et al. 2019, GPipe; Narayanan et al.
2021, sec. 2.2: 1F1B's bubble (p - 1)/M, the interleaved schedule's (p - 1)/(v M) and v times the
sends; Korthikanti et al. 2022, sec. 4.2.3: 1F1B's first stage keeps p micro-batches, the interleaved
schedule 1 + (p - 1)/(p v) times that), and the options a GPT's plan has no use for refused in one line.
"""

from __future__ import annotations

import math

import pytest

from simpar.costmodel import gpt as cg
from simpar.costmodel import gpt_plan as gp
from simpar.costmodel import hardware
from simpar.costmodel.gpt_compare import rank_gpt_layouts
from tests.unit.costmodel.test_gpt import plan as plan_command

SHAPE = cg.PRESETS["gpt3-175b"]
LAYOUT = dict(dp=8, tp=8, pp=16, microbatches=96, sp=True, recompute="selective", precision="mixed")


def planned(**kw):
    return gp.plan(SHAPE, 1536, hardware.load("ib-cluster"), **(LAYOUT | kw))


def test_gpipe_keeps_every_micro_batch_in_flight_at_1f1bs_time():
    one, gpipe = planned(), planned(schedule="gpipe")
    assert gpipe["time"] == one["time"]
    assert gpipe["activation_per_layer"] == one["activation_per_layer"]
    layers = math.ceil(SHAPE.layers / 16)
    assert one["memory_per_gpu"]["activations"] == layers * 16 * one["activation_per_layer"]  # min(p, M)
    assert gpipe["memory_per_gpu"]["activations"] == pytest.approx(layers * 96 * one["activation_per_layer"])


@pytest.mark.parametrize("v", [2, 3])
def test_interleaving_divides_the_bubble_by_v_and_sends_v_times(v):
    one, inter = planned(), planned(schedule="interleaved", virtual_stages=v)
    p, M = 16, 96
    fill_1f1b, fill = (M + p - 1) / M, (v * M + p - 1) / (v * M)
    assert inter["time"]["compute_s"] == pytest.approx(one["time"]["compute_s"] / fill_1f1b * fill, rel=1e-12)
    assert inter["time"]["pp_s"] == pytest.approx(v * one["time"]["pp_s"] / fill_1f1b * fill, rel=1e-12)
    assert inter["time"]["step_s"] < one["time"]["step_s"]
    extra = 1 + (p - 1) / (p * v)  # Korthikanti et al. sec. 4.2.3
    acts = one["memory_per_gpu"]["activations"]
    assert inter["memory_per_gpu"]["activations"] == pytest.approx(acts * extra, rel=1e-12)
    assert inter["layout"]["schedule"] == "interleaved" and inter["layout"]["virtual_stages"] == v


def test_the_compare_plans_a_schedule_where_it_fits_and_skips_the_rest():
    hw = hardware.load("dgx-h100")
    q = dict(sp=False, zero=0, microbatches=8, recompute="none", precision="mixed", optimizer="adam")
    q |= dict(grad_accum=1, cp_algo="ring", schedule="interleaved", virtual_stages=2)
    plans, invalid = rank_gpt_layouts(cg.PRESETS["gpt2-1.5b"], 64, hw, 64, None, q)
    for p in plans:
        lay = p["layout"]
        if lay["pp"] > 1:  # 8 micro-batches go round pp stages in groups of pp, 2 chunks a GPU
            assert 8 % lay["pp"] == 0 and lay["schedule"] == "interleaved" and lay["virtual_stages"] == 2
    assert any(p["layout"]["pp"] > 1 for p in plans) and invalid > 0


def test_unplanned_schedules_and_unused_options_are_one_line():
    common = ("--model", "gpt3-175b", "--dp", "8", "--tp", "8", "--pp", "16", "--batch", "1536")
    code, out, err = plan_command(
        *common, "--microbatches", "96", "--schedule", "interleaved", "--virtual-stages", "2"
    )
    assert code == 0 and "interleaved 1F1B (2 chunks a GPU)" in out, err
    for extra, words in (
        (("--schedule", "zb-v"), "plan --arch gpt plans --schedule 1f1b, gpipe, interleaved, not 'zb-v'"),
        (("--schedule", "interleaved"), "--schedule interleaved needs --virtual-stages V >= 2"),
        (
            ("--schedule", "interleaved", "--virtual-stages", "2", "--microbatches", "6"),
            "--schedule interleaved needs --microbatches divisible by --pp",
        ),
        (("--bucket-mb", "4", "--kernels", "numba"), "plan --arch gpt does not use --bucket-mb, --kernels"),
        (("--top-k", "1"), "plan --arch gpt does not use --top-k (they need --experts)"),
    ):
        code, _, err = plan_command(*common, *extra)
        assert code == 2 and err.strip().startswith(f"simpar: error: {words}"), err
        assert err.count("\n") == 1 and "Traceback" not in err
