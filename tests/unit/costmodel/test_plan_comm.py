"""`plan --arch gpt`'s collectives (costmodel/plan_comm.py): --collectives is honoured, ZeRO's halves and
full recomputation's extra all-reduces, --sp's LayerNorm gradients and the pipeline's sends are counted,
each priced by the algorithm's textbook cost.

On `local` (no protocol table: plain alpha-beta-gamma, the reduction on the CPU) the expected seconds are
written here from Thakur, Rabenseifner & Gropp 2005 (sec. 4) with simpar's chunking (ceil(n/p) per ring
step); on the GPU profiles only what must hold whatever the tuner's numbers: orders and ratios.
"""

from __future__ import annotations

import math

import pytest

from simpar.costmodel import gpt as cg
from simpar.costmodel import gpt_plan as gp
from simpar.costmodel import hardware

SHAPE = cg.Shape(4, 256, 8, 128, 1000, "a small test shape")


def local():
    hw = hardware.load("local")
    assert not hw.reduce_in_transfer and not hw.ring_proto  # so: alpha, beta, gamma alone
    return hw, hw.intra_alpha, 1 / hw.intra_bw, hw.gamma


def textbook_allreduce(algo: str, n: int, p: int, bpe: int, alpha: float, beta: float, gamma: float) -> float:
    """Critical path of one all-reduce (Thakur et al. 2005): rounds x alpha + bytes through the slowest
    link x beta + bytes reduced x gamma."""
    if algo == "ring":  # reduce-scatter + all-gather, p - 1 steps each of one ceil(n/p) chunk
        c = math.ceil(n / p) * bpe
        return 2 * (p - 1) * alpha + 2 * (p - 1) * c * beta + (p - 1) * c * gamma
    if algo == "tree":  # binomial reduce then broadcast: ceil(log2 p) rounds each way, the whole buffer
        d = math.ceil(math.log2(p))
        return 2 * d * alpha + 2 * d * n * bpe * beta + d * n * bpe * gamma
    if algo == "ps":  # the server takes p - 1 buffers in, sums them, sends p - 1 out
        return 2 * alpha + 2 * (p - 1) * n * bpe * beta + (p - 1) * n * bpe * gamma
    raise ValueError(algo)


@pytest.mark.parametrize("algo", ["ring", "tree", "ps"])
def test_tp_all_reduces_are_priced_by_the_chosen_algorithm(algo):
    hw, alpha, beta, gamma = local()
    batch, tp = 8, 4
    p = gp.plan(SHAPE, batch, hw, tp=tp, precision="fp32", optimizer="sgd", collectives=algo)
    R = batch * SHAPE.seq  # token rows of the one micro-batch (no dp)
    one = textbook_allreduce(algo, R * SHAPE.hidden, tp, 4, alpha, beta, gamma)  # b s h activations
    # the loss: an all-gather of t R numbers (a ring: p - 1 steps of R, nothing reduced), an all-reduce of 2R
    loss = (tp - 1) * (alpha + R * 4 * beta) + textbook_allreduce(algo, 2 * R, tp, 4, alpha, beta, gamma)
    # f and g of every block forward and backward, the embedding's and the head's
    assert p["time"]["tp_s"] == pytest.approx((4 * SHAPE.layers + 2) * one + loss, rel=1e-12)
    assert p["time"]["dp_s"] == 0
    kw = dict(precision="fp32", optimizer="sgd", collectives=algo, recompute="full")
    full = gp.plan(SHAPE, batch, hw, tp=tp, **kw)  # the forward's again: blocks' f and g, the embedding's
    assert full["time"]["tp_s"] == pytest.approx((6 * SHAPE.layers + 3) * one + loss, rel=1e-12)


@pytest.mark.parametrize("algo", ["ring", "tree", "ps"])
def test_sp_splits_each_all_reduce_in_halves_and_sums_the_layernorm_gradients_once_a_step(algo):
    hw, alpha, beta, gamma = local()
    batch, tp, K, L, h = 8, 4, 2, SHAPE.layers, SHAPE.hidden
    kw = dict(tp=tp, sp=True, grad_accum=K, precision="fp32", optimizer="sgd", collectives=algo)
    p = gp.plan(SHAPE, batch, hw, **kw)
    R = batch // K * SHAPE.seq  # token rows of a micro-step
    c = math.ceil(R * h / tp) * 4
    halves = (tp - 1) * (alpha + c * beta + c * gamma) + (tp - 1) * (alpha + c * beta)  # scatter + gather
    loss = (tp - 1) * (alpha + R * 4 * beta) + textbook_allreduce(algo, 2 * R, tp, 4, alpha, beta, gamma)
    # Korthikanti's sec. 4.2.2 pairs in place of every all-reduce, each micro-step; then, once a step,
    # each block's 4h LayerNorm gradients and the final LayerNorm's 2h by --collectives
    layernorms = L * textbook_allreduce(algo, 4 * h, tp, 4, alpha, beta, gamma)
    layernorms += textbook_allreduce(algo, 2 * h, tp, 4, alpha, beta, gamma)
    expected = K * ((4 * L + 2) * halves + loss) + layernorms
    assert p["time"]["tp_s"] == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("tp,sp", [(1, False), (2, True), (2, False)])
def test_pipeline_sends_are_b_s_h_each_way_per_micro_batch_through_the_bubble(tp, sp):
    hw, alpha, beta, gamma = local()
    batch, pp, M, K = 16, 2, 4, 2
    kw = dict(tp=tp, sp=sp, pp=pp, microbatches=M, grad_accum=K, precision="fp32", optimizer="sgd")
    p = gp.plan(SHAPE, batch, hw, **kw)
    n = batch // (M * K) * SHAPE.seq * SHAPE.hidden  # b s h activations of a micro-batch
    # each tp rank sends its 1/t of the rows (Narayanan et al. 2021 sec. 4.1's scatter); without --sp
    # the next stage gathers them back over tp (a ring all-gather); forward and backward, M K times,
    # the fill and drain stretching them as the passes: (M + pp - 1) / M
    one = alpha + math.ceil(n / tp) * 4 * beta
    if tp > 1 and not sp:
        one += (tp - 1) * (alpha + math.ceil(n / tp) * 4 * beta)
    assert p["time"]["pp_s"] == pytest.approx(K * (M + pp - 1) * 2 * one, rel=1e-12)
    assert gp.plan(SHAPE, batch, hw, **(kw | dict(pp=1)))["time"]["pp_s"] == 0


@pytest.mark.parametrize("algo", ["ring", "tree", "ps"])
def test_dp_gradients_are_priced_by_the_chosen_algorithm(algo):
    hw, alpha, beta, gamma = local()
    p = gp.plan(SHAPE, 8, hw, dp=4, precision="fp32", optimizer="sgd", collectives=algo)
    P = p["params_per_gpu"]
    expected = textbook_allreduce(algo, P, 4, 4, alpha, beta, gamma)
    assert p["time"]["dp_s"] == pytest.approx(expected, rel=1e-12)
    assert p["layout"]["collectives"] == algo


def test_zero_moves_ring_halves_and_zero3_gathers_twice_per_accumulation_step():
    hw, alpha, beta, gamma = local()
    dp, K = 4, 3
    P = gp.plan(SHAPE, 24, hw, dp=dp, precision="mixed", optimizer="adam")["params_per_gpu"]
    c = math.ceil(P / dp) * 2  # mixed: 2-byte gradients and 2-byte parameters
    scatter = (dp - 1) * (alpha + c * beta + c * gamma)
    gather = (dp - 1) * (alpha + c * beta)
    for zero, expected in ((1, scatter + gather), (2, scatter + gather), (3, K * (scatter + 2 * gather))):
        # ZeRO's halves are rings whatever --collectives says (as in a run: chunktime.RING_HALVES)
        p = gp.plan(SHAPE, 24, hw, dp=dp, zero=zero, grad_accum=K, collectives="tree")
        assert p["time"]["dp_s"] == pytest.approx(expected, rel=1e-12), zero


def test_gpu_profiles_order_the_algorithms_as_their_critical_paths_do():
    hw = hardware.load("dgx-h100")
    big = cg.PRESETS["gpt2-1.5b"]
    t = {a: gp.plan(big, 64, hw, dp=8, collectives=a)["time"]["dp_s"] for a in ("ring", "auto", "tree", "ps")}
    # one node of 8: auto may take NVLink SHARP (faster than the ring for GiB-scale buffers); the tree
    # sends the whole buffer log2(8) = 3 times each way, the server 7 times each way
    assert t["auto"] < t["ring"] < t["tree"] < t["ps"]
    assert t["tree"] / t["ring"] == pytest.approx(3 * 8 / 7, rel=0.15)  # 2 log2 p n vs 2 (p-1)/p n bytes
    assert t["ps"] / t["ring"] == pytest.approx(8, rel=0.15)  # 2 (p-1) n vs 2 (p-1)/p n


def test_the_command_line_says_which_collectives_and_refuses_unknown_ones():
    from tests.unit.costmodel.test_gpt import plan

    common = ("--model", "gpt2-1.5b", "--dp", "8", "--batch", "64", "--hardware", "dgx-h100")
    code, out, err = plan(*common, "--collectives", "tree")
    assert code == 0, err
    assert "--collectives tree" in out
    code, _, err = plan(*common, "--cp", "2", "--collectives", "ps", "--json")
    assert code == 0 and '"collectives": "ps"' in _, err
    code, _, err = plan(*common, "--collectives", "bogus")
    assert code == 2 and err.strip().startswith("simpar: error: unknown --collectives 'bogus'")
