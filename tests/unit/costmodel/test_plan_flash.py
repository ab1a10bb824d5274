"""`plan --arch gpt --attention flash`: a FlashAttention kernel in place of simpar's attention.py.

The expected numbers are written here from the kernel's own accounting (Dao 2023, FlashAttention-2, and its
benchmark_flash_attention.py: a causal forward does 4 b s^2 h / 2 FLOPs per layer, the backward 2.5 times
that) and from Korthikanti et al. 2022, Table 2 (the selective-recomputation rows: no s^2 term), plus
the float32 log-sum-exp the kernel keeps per row and head -- not from costmodel/gpt.py.
"""

from __future__ import annotations

import pytest

from simpar.costmodel import gpt as cg
from simpar.costmodel import gpt_plan as gp
from simpar.costmodel import hardware
from simpar.costmodel.cp import plan_cp
from tests.unit.costmodel.test_gpt import plan as plan_command

SHAPE = cg.Shape(8, 1024, 16, 8192, 50257, "a long-context test shape")
B = 16


def flash_attention_flops(b: int, s: int, h: int, recompute: str) -> float:
    """FlashAttention-2's benchmark count for one layer, causal: forward 4 b s^2 h / 2, backward 2.5x;
    full recomputation runs the forward once more."""
    forward = 4 * b * s * s * h / 2
    return forward * (1 + 2.5) + (forward if recompute == "full" else 0.0)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_the_hardware_flops_hold_the_kernels_causal_half(recompute):
    L, h, s, V = SHAPE.layers, SHAPE.hidden, SHAPE.seq, SHAPE.vocab
    p = gp.plan(SHAPE, B, hardware.load("dgx-h100"), dp=8, recompute=recompute, attention="flash")
    # every matmul but the scores, as Narayanan et al. 2021's Eq. 3 counts them, the scores the kernel's
    gemms = (96 if recompute == "full" else 72) * B * s * L * h * h
    head = (96 * B * s * L * h * h * V / (16 * L * h)) if recompute == "full" else 72 * B * s * h * V / 12
    expected = gemms + head + L * flash_attention_flops(B, s, h, recompute)
    assert p["hardware_flops_per_step"] == pytest.approx(expected, rel=1e-12)
    assert p["hardware_flops_per_step"] > p["flops_per_step"]  # 7 (or 9) s^2 h against the model's 6
    assert p["layout"]["attention"] == "flash" and "FlashAttention" in p["attention_scores"]


@pytest.mark.parametrize("t,sp", [(1, False), (4, False), (4, True)])
def test_no_score_is_kept_only_each_rows_log_sum_exp(t, sp):
    s, h, a = SHAPE.seq, SHAPE.hidden, SHAPE.heads
    b = 1
    flash = gp.plan(SHAPE, B, hardware.load("dgx-h100"), dp=B, tp=t, sp=sp, attention="flash")
    rest = 34 / t if sp else 10 + 24 / t  # Korthikanti's Table 2 without its 5 a s / (h t) term
    expected = s * b * h * rest + 4 * s * b * a / t  # + float32 log-sum-exp per row and head
    assert flash["activation_per_layer"] == pytest.approx(expected, rel=1e-12)
    full = gp.plan(
        SHAPE, B, hardware.load("dgx-h100"), dp=B, tp=t, sp=sp, attention="flash", recompute="full"
    )
    assert full["activation_per_layer"] == 2 * s * b * h  # only the layer's input, as without the kernel


def test_the_scores_skip_memory_and_the_step_is_shorter():
    hw = hardware.load("dgx-h100")
    kw = dict(dp=2, tp=4, pp=2, sp=True, microbatches=8, recompute="selective", precision="mixed")
    flash = gp.plan(SHAPE, B, hw, attention="flash", **kw)
    kept_off = gp.plan(SHAPE, B, hw, materialized_scores=False, **kw)
    assert flash["time"]["memory_s"] == kept_off["time"]["memory_s"]  # no pass over the a s^2 scores
    plain = gp.plan(SHAPE, B, hw, **kw)
    assert flash["time"]["memory_s"] < plain["time"]["memory_s"]
    assert flash["time"]["compute_s"] < plain["time"]["compute_s"]  # the causal half, no q k^T again
    for k in ("tp_s", "pp_s", "dp_s"):
        assert flash["time"][k] == plain["time"][k]
    assert flash["mfu"] > plain["mfu"]


def test_cps_ring_is_blockwise_already_so_the_kernel_changes_only_what_is_kept():
    hw = hardware.load("dgx-h100")
    kw = dict(tp=2, pp=2, sp=True, microbatches=4, recompute="selective", precision="mixed")
    ring = plan_cp(SHAPE, B, hw, 4, "ring", dp=2, **kw)
    ring_flash = plan_cp(SHAPE, B, hw, 4, "ring", dp=2, attention="flash", **kw)
    assert ring_flash["time"]["step_s"] == pytest.approx(ring["time"]["step_s"], rel=1e-12)
    assert ring_flash["hardware_flops_per_step"] == pytest.approx(ring["hardware_flops_per_step"], rel=1e-12)
    with pytest.raises(ValueError, match="ulysses"):
        plan_cp(SHAPE, B, hw, 4, "ulysses", dp=2, attention="flash", **kw)


def test_the_command_line_names_the_kernel_and_refuses_what_it_does_not_plan():
    common = ("--model", "gpt2-1.5b", "--dp", "8", "--batch", "64", "--hardware", "dgx-h100")
    code, out, err = plan_command(*common, "--attention", "flash")
    assert code == 0, err
    assert "FlashAttention" in out and "the causal half, on chip" in out
    for extra, words in (
        (("--attention", "fast"), "unknown --attention 'fast'"),
        (
            ("--attention", "flash", "--cp", "2", "--cp-algo", "ulysses"),
            "--attention flash with --cp-algo ulysses",
        ),
        (("--attention", "flash", "--experts", "8"), "plan --attention picks a dense GPT's"),
    ):
        code, out, err = plan_command(*common, *extra)
        assert code == 2 and err.strip().startswith(f"simpar: error: {words}"), err
        assert "Traceback" not in err
