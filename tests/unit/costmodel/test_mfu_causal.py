"""MFU's causal FLOP count (costmodel/gpt.py: model_flops_per_step) and what each layout's attention
computes (cp.py: ring_score_flops), against closed forms written here; and MFU <= the achievable share
of the peak for every layout `plan --arch gpt --compare` ranks, long sequences, cp and not.

The numerator of MFU is one count for every layout: the scores a causal mask lets a token see, half the
square (Megatron-LM's num_floating_point_operations). simpar's attention.py computes the whole square and
masks it (the hardware's count, Narayanan et al. 2021); cp's ring computes C(2C+1) blocks of (s/2C)^2,
(2C+1)/(4C) of it. Before this count, a ring row at 131,072 tokens read 107% (dp64 x cp4 of a 32-layer
h 4096 model on 256 H100s): its time priced the blocks, its numerator the square.
"""

from __future__ import annotations

import itertools

import pytest

from simpar.config import RunConfig
from simpar.costmodel import hardware, predict_from_config
from simpar.costmodel.cp import plan_cp, ring_block_map, ring_score_flops
from simpar.costmodel.gpt import PRESETS, Shape, flops_per_step, model_flops_per_step
from simpar.costmodel.gpt_compare import rank_gpt_layouts
from simpar.costmodel.gpt_plan import plan as gpt_plan
from simpar.costmodel.hardware import LOCAL_DEFAULTS


def causal_matmul_flops(B, s, L, h, V):
    """Every useful matmul counted: per sequence and block forward q, k, v, o 4 x 2 s h h, the MLP
    2 x 2 s (4h) h, q k^T and P v over the s^2/2 entries below the diagonal 2 x 2 (s^2/2) h; the head
    2 s h V; the backward twice the forward."""
    block = 4 * 2 * s * h * h + 2 * 2 * s * 4 * h * h + 2 * 2 * (s * s / 2) * h
    return 3 * B * (L * block + 2 * s * h * V)


@pytest.mark.parametrize(
    "B,s,L,h,V", [(1536, 2048, 96, 12288, 50257), (16, 131072, 96, 12288, 50257), (3, 8, 2, 16, 11)]
)
def test_model_flops_count_the_causal_half_of_the_scores(B, s, L, h, V):
    model = model_flops_per_step(B, s, L, h, V)
    assert model == pytest.approx(causal_matmul_flops(B, s, L, h, V), rel=1e-12)
    assert model == pytest.approx(72 * B * s * L * h * h * (1 + s / (12 * h) + V / (12 * L * h)), rel=1e-12)
    # attention.py computes the other half too: q k^T and P v, forward and backward, 6 B L s^2 h more
    assert flops_per_step(B, s, L, h, V) - model == pytest.approx(6 * B * L * s * s * h, rel=1e-9)


@pytest.mark.parametrize("C", [1, 2, 3, 4, 8, 32])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_the_ring_computes_its_causal_blocks_and_no_more(C, recompute):
    B, s, L, h = 2, 64 * C, 3, 48
    m = s // (2 * C)
    blocks = sum(cell is not None for row in ring_block_map(C) for cell in row)
    assert blocks == C * (2 * C + 1)  # the triangle's blocks, the diagonal ones whole
    # forward q k^T, P v; backward P again, dV, dP, dQ, dK; full recomputation: the forward again
    products = 2 + 5 + (2 if recompute == "full" else 0)
    want = B * L * blocks * products * 2 * m * m * h
    assert ring_score_flops(B, s, L, h, C, recompute) == pytest.approx(want, rel=1e-12)
    # between the causal half model FLOPs count (6 products over s^2/2) and attention.py's whole square
    causal, square = 6 * 2 * B * L * h * s * s / 2, 12 * 2 * B * L * h * s * s
    assert causal < ring_score_flops(B, s, L, h, C, "none") < square


def test_plan_cp_hardware_flops_price_the_ring_blocks_and_ulysses_square():
    shape, hw = Shape(8, 1024, 16, 8192, 50257), hardware.load("dgx-h100")
    B, s, L, h, V = 8, shape.seq, shape.layers, shape.hidden, shape.vocab
    for mode, per_score in (("none", 12), ("selective", 14), ("full", 16)):
        kw = dict(tp=2, pp=2, microbatches=4, recompute=mode)
        ring = plan_cp(shape, B, hw, 4, "ring", dp=2, **kw)
        whole = flops_per_step(B, s, L, h, V, mode)
        assert ring["hardware_flops_per_step"] == pytest.approx(
            whole - per_score * B * s * s * L * h + ring_score_flops(B, s, L, h, 4, mode), rel=1e-12
        )
        assert plan_cp(shape, B, hw, 4, "ulysses", dp=2, **kw)["hardware_flops_per_step"] == whole
        # the same numerator as the layout without cp
        assert ring["flops_per_step"] == gpt_plan(shape, B, hw, dp=8, **kw)["flops_per_step"]
        assert ring["flops_per_step"] == pytest.approx(model_flops_per_step(B, s, L, h, V), rel=1e-12)


def test_mfu_stays_below_the_achievable_share_of_the_peak_for_every_layout():
    """Every split of 256 and 2048 H100s, at 32k and 128k tokens, ring and Ulysses, selective and full
    recomputation (none prices as selective less q k^T): the hardware does at least the model's FLOPs,
    the step is long enough for the hardware's FLOPs at the achievable GEMM rate, so MFU <= rate / peak
    (80.3% on H100) < 1."""
    hw = hardware.load("dgx-h100")
    share = hw.flop_rate("mixed") / hw.peak_rate("mixed")
    shapes = {"gpt3-175b": PRESETS["gpt3-175b"], "h4096": Shape(32, 4096, 32, 2048, 50257)}
    grid = itertools.product(shapes, (32768, 131072), (256, 2048), ("selective", "full"), ("ring", "ulysses"))
    seen = set()
    for name, s, world, mode, algo in grid:
        base = shapes[name]
        shape = Shape(base.layers, base.hidden, base.heads, s, base.vocab)
        q = dict(sp=True, zero=0, microbatches=16, recompute=mode, precision="mixed", optimizer="adam")
        plans, _ = rank_gpt_layouts(shape, 64, hw, world, None, q | dict(grad_accum=1, cp_algo=algo))
        model = model_flops_per_step(64, s, base.layers, base.hidden, base.vocab)
        for p in plans:
            lay = p["layout"]
            seen.add(lay["cp"] > 1)
            assert p["flops_per_step"] == pytest.approx(model, rel=1e-12)  # one numerator for all
            assert p["hardware_flops_per_step"] >= model
            assert p["time"]["step_s"] * world * hw.flop_rate("mixed") >= p["hardware_flops_per_step"] * (
                1 - 1e-12
            )
            assert 0 < p["mfu"] <= share * (1 + 1e-12), (name, s, world, mode, algo, lay)
    assert seen == {True, False}


def test_the_long_sequence_compare_of_docs_context():
    """docs/context.md's question: GPT-3 175B at 131,072 tokens on 2048 H100s. Every row's MFU is the
    causal model FLOPs over its step (rows are ranked by step; the MFU column now ranks the same way)."""
    hw = hardware.load("dgx-h100")
    shape = Shape(96, 12288, 96, 131072, 50257)
    q = dict(sp=True, zero=0, microbatches=16, recompute="selective", precision="mixed", optimizer="adam")
    plans, _ = rank_gpt_layouts(shape, 16, hw, 2048, None, q | dict(grad_accum=1, cp_algo="ring"))
    model = model_flops_per_step(16, 131072, 96, 12288, 50257)
    for p in plans:
        assert p["mfu"] == pytest.approx(
            model / (p["time"]["step_s"] * 2048 * hw.peak_rate("mixed")), rel=1e-12
        )
    by_step = sorted(plans, key=lambda p: p["time"]["step_s"])
    assert [p["mfu"] for p in by_step] == sorted((p["mfu"] for p in plans), reverse=True)
    # the figures docs/context.md quotes: the fastest that fits, the fastest without cp (over 80 GB)
    name = {(p["layout"]["cp"], p["layout"]["tp"], p["layout"]["pp"], p["layout"]["dp"]): p for p in plans}
    assert round(name[8, 32, 8, 1]["mfu"], 3) == 0.223 and round(name[4, 32, 16, 1]["mfu"], 3) == 0.218
    assert round(name[1, 32, 64, 1]["mfu"], 3) == 0.026
    fits = [p for p in plans if p["memory_per_gpu"]["total"] <= 80e9]
    assert min(fits, key=lambda p: p["time"]["step_s"]) is name[8, 32, 8, 1]
    assert (
        min((p for p in plans if p["layout"]["cp"] == 1), key=lambda p: p["time"]["step_s"])
        is name[1, 32, 64, 1]
    )


@pytest.mark.parametrize("algo", ["ring", "ulysses"])
@pytest.mark.parametrize("mode", ["none", "selective", "full"])
@pytest.mark.parametrize("tp", [1, 2])
def test_cp_pipeline_runs_predict_the_ring_blocks_hardware_flops(algo, mode, tp):
    """simpar train --arch gpt --cp 2 --pp 2 [--tp 2]: the predicted hardware FLOPs per step, summed
    over the ranks. The matmuls outside the scores, forward F = B (24 s h^2 L + 2 s h V), run 3 times
    (4 under full recomputation: each stage's chunk again, the head's too). The scores: Ulysses runs
    attention.py on its heads, the whole square, one product 2 B L s^2 h (2 forward, 4 backward,
    selective q k^T again, full the forward again); the ring one product over its C (2C+1) causal
    blocks of m = s/2C, 2 m^2 h each (2 forward, 5 backward, selective and full the forward again:
    context_attention.rebuild_softmax re-runs the ring for its log-sum-exp)."""
    L, h, a, s, V, B, C = 2, 16, 4, 32, 18, 8, 2
    cfg = RunConfig(
        arch="gpt", dataset="copy", blocks=L, hidden=h, heads=a, seq_len=s, vocab=V, batch=B, dtype="float64",
        steps=1, cp=C, tp=tp, pp=2, dp=1, microbatches=2, cp_algo=algo, recompute=mode,
    )  # fmt: skip
    pred = predict_from_config(cfg, C * tp * 2, hw=LOCAL_DEFAULTS)
    F = B * (24 * s * h * h * L + 2 * s * h * V)
    if algo == "ring":
        m = s // (2 * C)
        one, products = B * L * C * (2 * C + 1) * 2 * m * m * h, {"none": 7, "selective": 9, "full": 9}
    else:
        one, products = B * L * 2 * s * s * h, {"none": 6, "selective": 7, "full": 8}
    want = (4 if mode == "full" else 3) * F + products[mode] * one
    assert pred["hardware_flops_per_step"] == want
    assert pred["flops_per_step"] == pytest.approx(model_flops_per_step(B, s, L, h, V), rel=1e-12)
