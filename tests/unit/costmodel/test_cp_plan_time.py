"""`plan --cp`'s step time (costmodel/cp.py plan_cp), no MPI: the attention hop by hop, as the simulated
clock times simpar's ring (cp_time.py), at plan scale -- and equal to the simulated clock's step where
the two models coincide.

The plan counts matmuls at the profile's rate (no memory-bound work). gpt.plan's compute counts every
score in full (Narayanan et al. 2021, sec. 5.1: 72 B s L h^2 (1 + s/(6h) + V/(12 L h))); with cp the
score products, 12 B s^2 L h, leave it, and each of the ceil(L/pp) layers of a stage adds, in every one
of the K (M + pp - 1) micro-batch slots of 1F1B, its attention on one cp rank (b sequences of n = s/C
tokens, m = n/2, h/t wide, a/t heads, the cp group's link: alpha, bw):
  ring      f = 2 x 2 b m^2 (h/t) / rate, g = 5 x 2 b m^2 (h/t) / rate; w = 2 b n (h/t) 2 / bw (K, V in
            16 bits), u = 2 b n (h/t) 4 / bw (dK, dV in float32)
            forward  max(3 f, w + alpha) + (C-2) max(2 f, w + alpha) + 2 f
            backward max(3 g, w + alpha) + (C-2) (max(2 g, w) + u + alpha) + 2 g + u + alpha
            of which the 2C+1 blocks' (2C+1)(f + g) are compute, the rest exposed transfer (cp_s)
  Ulysses   4 (C-1)(alpha + b n (h/t)/C 2 / bw) each way, blocking, and the core of (a/t)/C heads over
            all s tokens: the same score products gpt.plan counted.
"""

from __future__ import annotations

import dataclasses

import pytest

from simpar.config import RunConfig
from simpar.costmodel import gpt as cg
from simpar.costmodel import gpt_plan as gp
from simpar.costmodel import hardware, predict_from_config
from simpar.costmodel.cp import plan_cp
from simpar.costmodel.hardware import Hardware, group_link

LONG = dataclasses.replace(cg.PRESETS["gpt3-175b"], seq=131072)  # Brown et al. 2020, at 131k tokens
L, h, a, s, V = LONG.layers, LONG.hidden, LONG.heads, LONG.seq, LONG.vocab
t, pp, M, B = 8, 16, 16, 16  # tp 8 + sp, pp 16, 16 micro-batches of one sequence (docs/context.md)
LAYOUT = dict(
    tp=t, pp=pp, sp=True, microbatches=M, recompute="selective", precision="mixed", optimizer="adam"
)


def non_score_compute(C: int, rate: float) -> float:
    """gpt.plan's matmuls without the attention's score products, per GPU, the 1F1B bubble included."""
    world = C * t * pp
    flops = 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h)) - 12 * B * s * s * L * h
    return flops / world / rate * (M + pp - 1) / M


@pytest.mark.parametrize("C", [2, 4, 16])
def test_the_plan_times_each_ring_hop_as_the_longer_of_its_blocks_and_its_transfer(C):
    hw = hardware.load("dgx-h100")
    rate, link = hw.flop_rate("mixed"), group_link(hw, "dp", C, t, 1)  # cp ranks: stride tp
    b, n, hl = 1, s // C, h // t
    m = n // 2
    f, g = 2 * 2 * b * m * m * hl / rate, 5 * 2 * b * m * m * hl / rate
    w, u, al = 2 * b * n * hl * 2 / link.bw, 2 * b * n * hl * 4 / link.bw, link.alpha
    forward = max(3 * f, w + al) + (C - 2) * max(2 * f, w + al) + 2 * f
    backward = max(3 * g, w + al) + (C - 2) * (max(2 * g, w) + u + al) + 2 * g + u + al
    slots = (M + pp - 1) * (L // pp)
    blocks = (2 * C + 1) * (f + g)
    plan = plan_cp(LONG, B, hw, C, "ring", **LAYOUT)
    base = gp.plan(LONG, B, hw, dp=C, **LAYOUT)  # tp's, pp's and dp's terms are gpt.plan's, over dp x C ranks
    time = plan["time"]
    assert time["compute_s"] == pytest.approx(non_score_compute(C, rate) + slots * blocks, rel=1e-12)
    assert time["cp_s"] == pytest.approx(slots * (forward + backward - blocks), rel=1e-12)
    same = ("imbalance_s", "tp_s", "pp_s", "dp_s")
    # the slowest stage's extra: the same, the blocks' score passes (kept off chip or not) being alike
    # on every stage
    assert [time[k] for k in same] == pytest.approx([base["time"][k] for k in same], rel=1e-12)
    parts = time["compute_s"] + time["memory_s"] + sum(time[k] for k in same) + time["cp_s"]
    assert time["step_s"] == pytest.approx(parts, rel=1e-12)
    # the ring keeps each block's scores on chip: gpt.plan's memory passes without the per-score ones
    on_chip = gp.plan(LONG, B, hw, dp=C, materialized_scores=False, **LAYOUT)["time"]["memory_s"]
    assert time["memory_s"] == on_chip < base["time"]["memory_s"]
    # every hop here waits for its transfer (the cp group leaves the node: h/t = 1536 is too narrow
    # for a block to outlast its K/V), yet less than the whole traffic's time, bubble-stretched
    assert 0 < time["cp_s"] < time["cp_wire_s"] * (M + pp - 1) / M


def test_full_recomputation_runs_the_ring_forward_twice():
    """Under --recompute full every block's forward runs again in backward, its hops and K/V included:
    gpt.plan's 96 B s L h^2 (1 + s/(6h) + V/(16 L h)) less the 16 B s^2 L h of scores it counts, two
    ring forwards and one backward per layer and slot, and the forward's K/V bytes twice."""
    hw, C = hardware.load("dgx-h100"), 4
    layout = dict(LAYOUT, recompute="full")
    rate, link = hw.flop_rate("mixed"), group_link(hw, "dp", C, t, 1)
    n, hl = s // C, h // t
    m = n // 2
    f, g = 2 * 2 * m * m * hl / rate, 5 * 2 * m * m * hl / rate
    w, u, al = 2 * n * hl * 2 / link.bw, 2 * n * hl * 4 / link.bw, link.alpha
    forward = max(3 * f, w + al) + (C - 2) * max(2 * f, w + al) + 2 * f
    backward = max(3 * g, w + al) + (C - 2) * (max(2 * g, w) + u + al) + 2 * g + u + al
    slots, blocks = (M + pp - 1) * (L // pp), 2 * C + 1
    flops = 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h)) - 16 * B * s * s * L * h
    compute = flops / (C * t * pp) / rate * (M + pp - 1) / M + slots * blocks * (2 * f + g)
    plan = plan_cp(LONG, B, hw, C, "ring", **layout)
    assert plan["time"]["compute_s"] == pytest.approx(compute, rel=1e-12)
    exposed = 2 * (forward - blocks * f) + backward - blocks * g
    assert plan["time"]["cp_s"] == pytest.approx(slots * exposed, rel=1e-12)
    kv = (C - 1) * n * hl  # elements of K (or V) a rank sends per layer and micro-batch, per pass
    per_layer = 2 * (2 * kv * 2) + 2 * kv * 2 + 2 * kv * 4  # K/V forward x 2, backward; dK/dV in float32
    assert plan["cp_bytes_per_gpu"] == pytest.approx(per_layer * (L // pp) * M, rel=1e-12)


def test_blocks_that_outlast_their_transfers_leave_only_the_partial_sums_exposed():
    """cp 8 on one NVLink node (tp 1, pp 1): 2 f > w + alpha and 2 g > w at every hop, so of the ring
    only the dK/dV sends after the blocks stay exposed: (C-1)(u + alpha) per layer of backward."""
    hw, C = hardware.load("dgx-h100"), 8
    rate, link = hw.flop_rate("mixed"), group_link(hw, "dp", C, 1, 1)
    n = s // C
    m = n // 2
    f, w = 2 * 2 * m * m * h / rate, 2 * n * h * 2 / link.bw
    assert 2 * f > w + link.alpha
    plan = plan_cp(LONG, 1, hw, C, "ring", precision="mixed", optimizer="adam")  # one sequence
    u = 2 * n * h * 4 / link.bw
    assert plan["time"]["cp_s"] == pytest.approx(L * (C - 1) * (u + link.alpha), rel=1e-12)


def test_ulysses_keeps_the_score_compute_and_blocks_on_its_all_to_alls():
    hw, C = hardware.load("dgx-h100"), 4
    link = group_link(hw, "dp", C, t, 1)
    A = (C - 1) * (link.alpha + 1 * (s // C) * (h // t) // C * 2 / link.bw)
    plan = plan_cp(LONG, B, hw, C, "ulysses", **LAYOUT)
    base = gp.plan(LONG, B, hw, dp=C, **LAYOUT)
    assert plan["time"]["compute_s"] == pytest.approx(base["time"]["compute_s"], rel=1e-12)
    assert plan["time"]["cp_s"] == pytest.approx((M + pp - 1) * (L // pp) * 8 * A, rel=1e-12)


# A profile where the simulated clock charges matmuls only (gamma 0: no memory-bound work, no layer
# overhead, no NCCL protocols): the plan's model exactly. Blocks of this tiny gpt take ~0.13 ms a
# forward block, its K/V ~0.33 ms on the link: hop 0's three blocks hide it, later hops' two do not.
MATMULS_ONLY = Hardware(
    name="matmuls-only",
    description="test profile: matmuls at 1 GFLOP/s fp64, 2 us and 200 MB/s between devices",
    flops={"fp64": 1e9, "fp32": 2e9, "mixed": 4e9},
    gamma=0.0,
    intra_alpha=2e-6,
    intra_bw=2e8,
    devices_per_node=8,
)
TINY = dict(blocks=2, hidden=32, heads=4, vocab=16, batch=8)


@pytest.mark.parametrize(
    "algo,C,dp", [("ring", 2, 1), ("ring", 3, 1), ("ring", 4, 1), ("ring", 2, 2), ("ulysses", 4, 1)]
)
def test_plan_equals_the_simulated_clock_where_their_models_meet(algo, C, dp):
    """cp_time.py's step (== the simulated clock: tests/mpi/runtime/test_cp_simclock.py) and the plan,
    for a layout both run: pp 1, one gradient bucket (ready as backward ends, so not overlapped)."""
    seq = 16 * C
    cfg = RunConfig(
        arch="gpt", dataset="copy", seq_len=seq, dtype="float64", cp=C, dp=dp, cp_algo=algo, **TINY
    )
    sim = predict_from_config(cfg, C * dp, steps=1, hw=MATMULS_ONLY)["time"]["step_s"]
    shape = cg.Shape(TINY["blocks"], TINY["hidden"], TINY["heads"], seq, TINY["vocab"])
    plan = plan_cp(shape, TINY["batch"], MATMULS_ONLY, C, algo, dp=dp, precision="fp64", optimizer="sgd")
    assert plan["time"]["step_s"] == pytest.approx(sim, rel=1e-12)
