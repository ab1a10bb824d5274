"""The transformer cost model (costmodel/gpt.py) against the papers' formulas, written out here again,
and `simpar plan --arch gpt` (no MPI, fast).

  Narayanan et al. 2021, sec. 5.1: parameters 12 L h^2 (1 + 13/(12h) + (V + s)/(12 L h)) and FLOPs
  per step 72 B s L h^2 (1 + s/(6h) + V/(12 L h)), 96 B s L h^2 (1 + s/(6h) + V/(16 L h)) with full
  recomputation -- checked against the matmuls counted one by one (the hardware's: attention.py
  computes every score; model FLOPs count the causal half, tests/unit/costmodel/test_mfu_causal.py).
  Korthikanti et al. 2022, Table 2: activation bytes per layer under each kind of parallelism.
"""

from __future__ import annotations

import contextlib
import io

import pytest

from simpar.cli import main
from simpar.costmodel import gpt as cg
from simpar.costmodel import gpt_plan as gp
from simpar.costmodel import hardware

GPT3 = dict(L=96, h=12288, a=96, s=2048, V=50257)  # Brown et al. 2020, Table 2.1


def dims(name):
    m = cg.PRESETS[name]
    return (m.layers, m.hidden, m.heads, m.seq, m.vocab)


def test_presets_are_the_published_shapes():
    assert dims("gpt3-175b") == (96, 12288, 96, 2048, 50257)  # Table 2.1, GPT-2's BPE
    assert dims("gpt3-13b") == (40, 5140, 40, 2048, 50257)
    assert dims("gpt2-1.5b") == (48, 1600, 25, 1024, 50257)  # Radford et al. 2019, Table 2


def test_parameter_counts():
    L, h, s, V = GPT3["L"], GPT3["h"], GPT3["s"], GPT3["V"]
    narayanan = 12 * L * h**2 * (1 + 13 / (12 * h) + (V + s) / (12 * L * h))
    assert cg.narayanan_params(L, h, s, V) == pytest.approx(narayanan, rel=1e-15)
    # simpar tied = Narayanan's count + the final LayerNorm's 2h; untied adds the head's V h
    assert cg.param_count(L, h, s, V, tied=True) == pytest.approx(narayanan + 2 * h, rel=1e-14)
    assert cg.param_count(L, h, s, V) - cg.param_count(L, h, s, V, tied=True) == V * h
    assert narayanan == pytest.approx(175e9, rel=0.003)  # "175B"
    # GPT-2 1.5B: 1.558 B with the tied head (the paper's Table 2 says 1542M, it counts 1.5B loosely)
    assert cg.param_count(48, 1600, 1024, 50257, tied=True) == pytest.approx(1.558e9, rel=1e-3)


def matmul_flops(B, s, L, h, V, recompute=False):
    """Every matmul of a step counted separately: per block forward q, k, v, o 4 x 2Bsh^2, scores and
    P v 2 x 2Bs^2h, MLP 2 x 2Bs(4h)h; the head 2BshV; backward twice the forward; full recomputation
    repeats the blocks' forward (not the head's)."""
    block = 4 * 2 * B * s * h * h + 2 * 2 * B * s * s * h + 2 * 2 * B * s * 4 * h * h
    head = 2 * B * s * h * V
    return 3 * (L * block + head) + (L * block if recompute else 0)


@pytest.mark.parametrize("recompute", ["none", "full", "selective"])
def test_flops_per_step_is_narayanans_formula_and_the_matmul_count(recompute):
    B, L, h, s, V = 1536, GPT3["L"], GPT3["h"], GPT3["s"], GPT3["V"]
    if recompute == "full":
        paper = 96 * B * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h))
    else:
        paper = 72 * B * s * L * h**2 * (1 + s / (6 * h) + V / (12 * L * h))
    # selective: every block's q k^T again (P rebuilt from the kept q and k), 2 s^2 h per sequence
    extra = 2 * B * L * s * s * h if recompute == "selective" else 0
    assert cg.flops_per_step(B, s, L, h, V, recompute) == pytest.approx(paper + extra, rel=1e-12)
    assert paper == pytest.approx(matmul_flops(B, s, L, h, V, recompute == "full"), rel=1e-12)


def test_korthikanti_table_2_for_gpt3_175b():
    """Each row of Table 2, in bytes per layer, for GPT-3 175B with one sequence per micro-batch and
    t = 8 (the paper's setting for it): s b h (34 + 5as/h) etc. 5as/h = 5*96*2048/12288 = 80: the
    attention's s^2 terms are 80 / (34 + 80) = 70% of a layer without parallelism. (The first row is
    also what AWS Neuron's activation-memory guide restates: https://awsdocs-neuron.readthedocs-hosted.com/
    en/latest/libraries/neuronx-distributed/activation_memory_reduction.html)"""
    s, b, h, a, t = 2048, 1, 12288, 96, 8
    sbh = s * b * h
    assert 5 * a * s / h == 80
    rows = {
        ("none", 1, False): sbh * (34 + 5 * a * s / h),
        ("none", t, False): sbh * (10 + 24 / t + 5 * a * s / (h * t)),
        ("none", t, True): sbh * (34 / t + 5 * a * s / (h * t)),
        ("selective", t, False): sbh * (10 + 24 / t),
        ("selective", t, True): sbh * 34 / t,
        ("full", t, True): 2 * sbh,  # the table's row does not divide the kept input by t
        ("full", 1, False): 2 * sbh,
    }
    for (recompute, tp, sp), expected in rows.items():
        assert cg.korthikanti_layer_bytes(s, b, h, a, tp, sp, recompute) == pytest.approx(expected, rel=1e-12)
    assert rows[("none", 1, False)] == pytest.approx(114 * sbh)  # 34 + 80
    assert 80 / 114 == pytest.approx(0.70, abs=0.005)
    # sequence parallelism divides everything by t; without it 10 s b h stays replicated
    assert rows[("none", t, True)] * t == pytest.approx(rows[("none", 1, False)])
    assert rows[("none", t, False)] - rows[("none", t, True)] == pytest.approx(sbh * (10 + 24 / t - 34 / t))


def test_simpars_block_is_korthikantis_without_dropout():
    """16-bit: 32 sbh + 2as^2b + 4sb = 34 sbh + 5as^2b less the two 1-byte dropout masks (2 sbh), the
    attention-dropout mask and its output (3 a s^2 b), plus two LayerNorm row statistics (2 sb)."""
    s, b, h, a = 64, 3, 32, 4
    ours = 2 * cg.simpar_block_elems(s, b, h, a)
    assert ours == 32 * s * b * h + 2 * a * s * s * b + 4 * s * b
    assert ours == cg.korthikanti_layer_bytes(s, b, h, a) - 2 * s * b * h - 3 * a * s * s * b + 4 * s * b


def test_plan_memory_flops_and_mfu():
    shape = cg.PRESETS["gpt3-175b"]
    hw = hardware.load("ib-cluster")
    p = gp.plan(shape, 1536, hw, dp=8, tp=8, pp=16, sp=True, zero=1, microbatches=96, recompute="selective")
    L, h, s, V = shape.layers, shape.hidden, shape.seq, shape.vocab
    block = 12 * h * h // 8 + 7 * h // 8 + 6 * h  # per tp rank: sharded matrices, replicated LN and biases
    P_gpu = 6 * block + V * h // 8 + s * h  # first stage: 96/16 blocks, vocab-parallel embedding, positions
    assert p["params_per_gpu"] == P_gpu
    mem = p["memory_per_gpu"]
    assert mem["params"] == 2 * P_gpu and mem["grads"] == 2 * P_gpu  # mixed: 2-byte weights and grads
    assert mem["optimizer"] == pytest.approx(12 * P_gpu / 8)  # ZeRO-1: K = 12 sharded over dp 8
    b = 1536 / (8 * 96)
    assert mem["activations"] == pytest.approx(6 * 16 * 34 * s * b * h / 8)  # 6 layers x 16 in flight
    # model FLOPs: the scores' causal half (s/12h, Megatron-LM's count); the hardware does every score
    flops = 72 * 1536 * s * L * h**2 * (1 + s / (12 * h) + V / (12 * L * h))
    assert p["flops_per_step"] == pytest.approx(flops, rel=1e-12)
    whole = 72 * 1536 * s * L * h**2 * (1 + s / (6 * h) + V / (12 * L * h)) + 2 * 1536 * L * s * s * h
    assert p["hardware_flops_per_step"] == pytest.approx(whole, rel=1e-12)  # + selective's q k^T
    peak = 989.4e12  # H100 SXM BF16 dense, the datasheet (MFU's denominator, not the achievable rate)
    assert p["mfu"] == pytest.approx(flops / (p["time"]["step_s"] * 1024 * peak), rel=1e-12)
    assert 0 < p["mfu"] < 794.5 / 989.4  # below the achievable share of the peak (the MAMF table's)
    # one GPU, no sharding: (2 + 2 + 12) bytes per parameter of the whole (untied) model
    one = gp.plan(cg.PRESETS["gpt2-1.5b"], 1, hw)
    P = cg.param_count(48, 1600, 1024, 50257)
    assert one["params_per_gpu"] == P
    assert (
        one["memory_per_gpu"]["params"] + one["memory_per_gpu"]["grads"] + one["memory_per_gpu"]["optimizer"]
        == 16 * P
    )


def plan(*args):
    """`simpar plan --arch gpt ARGS` in-process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["plan", "--arch", "gpt", *args])
    return code, out.getvalue(), err.getvalue()


def test_plan_command_prints_the_answers():
    code, out, err = plan("--model", "gpt3-175b", "--dp", "8", "--tp", "8", "--pp", "16", "--batch", "1536")
    assert code == 0, err
    for words in ("parameters: 175.22 billion", "memory per GPU", "FLOPs per step", "MFU", "Table 2.1"):
        assert words in out
    code, _, err = plan("--model", "gpt3-13b", "--tp", "3")
    assert code == 2 and err.strip().startswith("simpar: error: --tp 3 must divide the 40 heads")
    assert plan("--model", "gpt4")[0] == 2
