"""costmodel/moe_rounds.py and gpt_moe_time.py against closed forms written here: the all-to-alls
round by round, the ring all-reduce from uneven starts (== the dense cost model's price when the ranks
start together), and a balanced dp2 x ep2 step on a profile that charges only matmuls and messages.
(predict == simulate on real runs: tests/mpi/runtime/test_moe_simclock.py.)"""

from __future__ import annotations

import pytest

from simpar.config import RunConfig
from simpar.costmodel import hardware
from simpar.costmodel.chunktime import collective_gamma, seconds
from simpar.costmodel.collectives import ring_allreduce, to_bytes
from simpar.costmodel.hardware import Hardware, Link
from simpar.costmodel.moe_rounds import bruck_ends, pairwise_ends, ring_allreduce_ends
from simpar.costmodel.predict import predict_from_config

LINK = Link("test", 1e-6, 1e9)


def test_pairwise_rounds_wait_for_the_slower_peer():
    # 2 ranks, one round: each ends when its own 8-byte rows have left and the peer's have arrived
    ends = pairwise_ends([0.0, 5e-6], [[0, 3], [5, 0]], 8, LINK)
    assert ends[0] == pytest.approx(max(24e-9, 5e-6 + 40e-9 + 1e-6))
    assert ends[1] == pytest.approx(max(5e-6 + 40e-9, 24e-9 + 1e-6))
    # 3 ranks, equal pieces: two rounds of (alpha + r bytes / bw)
    assert pairwise_ends([0.0] * 3, [[0, 2, 2], [2, 0, 2], [2, 2, 0]], 10, LINK) == pytest.approx(
        [2 * (1e-6 + 20e-9)] * 3
    )


def test_bruck_sends_log2_p_messages_of_the_pieces_it_holds():
    rows = [[0, 1, 2, 3], [4, 0, 5, 6], [7, 8, 0, 9], [1, 2, 3, 0]]
    assert bruck_ends([0.0, 1e-6], [[0, 3], [5, 0]], 8, LINK) == pairwise_ends(
        [0.0, 1e-6], [[0, 3], [5, 0]], 8, LINK
    )
    # P = 4, every piece r rows: round 0 moves positions 1 and 3, round 1 positions 2 and 3 -> 2r each
    assert bruck_ends([0.0] * 4, [[3] * 4] * 4, 1, LINK) == pytest.approx([2 * (1e-6 + 6e-9)] * 4)
    # round 0: rank q sends its pieces for q+1 and q+3; round 1: for q+2 and what it got for q+3
    r0 = [rows[q][(q + 1) % 4] + rows[q][(q + 3) % 4] for q in range(4)]
    t0 = [r0[(q - 1) % 4] * 1e-9 + 1e-6 for q in range(4)]  # the peer's arrival (alpha > any own send)
    r1 = [rows[q][(q + 2) % 4] + rows[(q - 1) % 4][(q + 2) % 4] for q in range(4)]
    t1 = [max(t0[q] + r1[q] * 1e-9, t0[(q - 2) % 4] + r1[(q - 2) % 4] * 1e-9 + 1e-6) for q in range(4)]
    assert bruck_ends([0.0] * 4, rows, 1, LINK) == pytest.approx(t1, rel=1e-12)


@pytest.mark.parametrize("name, p, n", [("local", 4, 1000), ("dgx-h100", 4, 1 << 20), ("dgx-h100", 3, 999)])
def test_ring_allreduce_from_together_is_the_dense_models_price(name, p, n):
    hw = hardware.load(name)
    link = hardware.group_link(hw, "dp", p, 1, 1)
    ends = ring_allreduce_ends(n, 4, [1e-3] * p, link, collective_gamma(hw))
    dense = seconds(to_bytes(ring_allreduce(n, p, 0), 4), link, collective_gamma(hw), True)
    assert max(ends) == pytest.approx(1e-3 + dense, rel=1e-9)
    late = ring_allreduce_ends(n, 4, [1e-3] + [0.0] * (p - 1), link, collective_gamma(hw))
    # the last rank to finish waits the whole ring for the late one; the others finish sooner, apart
    assert max(late) == pytest.approx(max(ends), rel=1e-9) and 1e-3 < min(late) < max(ends)


MATMULS = Hardware(
    name="matmuls",
    description="test profile: matmuls at 1 GFLOP/s fp64, 2 us and 200 MB/s between devices",
    flops={"fp64": 1e9, "fp32": 2e9, "mixed": 4e9},
    gamma=0.0,
    intra_alpha=2e-6,
    intra_bw=2e8,
    devices_per_node=8,
)


def test_a_balanced_step_in_closed_form():
    """dp 2 x ep 2, E = 4, top-2, float64, only matmuls and messages cost: each rank's n = B s / 2
    tokens route n K / E to every expert; its 2 experts compute n K rows; 4 all-to-alls per block of
    n K / 2 rows; one ring all-reduce of the non-expert parameters over 2 (the experts' edp is 1)."""
    L, h, a, s, V, E, K, B = 2, 16, 4, 8, 16, 4, 2, 8
    cfg = RunConfig(arch="gpt", dataset="copy", blocks=L, hidden=h, heads=a, seq_len=s, vocab=V, batch=B)
    cfg.dtype, cfg.dp, cfg.ep, cfg.experts, cfg.top_k, cfg.capacity_factor = "float64", 2, 2, E, K, 2.0
    n = B * s // 2
    fwd = 2 * n * (L * (4 * h * h + 2 * s * h + h * E + 8 * K * h * h) + h * V)
    compute = 3 * fwd / 1e9
    alltoall = 4 * L * (2e-6 + n * K / 2 * h * 8 / 2e8)
    M = (V + s) * h + L * (4 * h * h + 8 * h + h * E) + 2 * h + h * V
    allreduce = 2 * (2e-6 + M // 2 * 8 / 2e8)
    t = predict_from_config(cfg, 2, steps=1, hw=MATMULS)["time"]
    assert t["step_s"] == pytest.approx(compute + alltoall + allreduce, rel=1e-12)
    assert t["compute_s"] == pytest.approx(compute, rel=1e-12)


def test_a_naive_pipeline_in_closed_form():
    """pp 2, one rank a stage, the naive schedule (one micro-batch through both stages and back before
    the next), M = 2, balanced top-2 of 4 experts all local, only matmuls and messages cost: each
    micro-batch's forward and backward FLOPs in a row, plus two boundary messages of n h 8 bytes."""
    L, h, a, s, V, E, K, B, M = 2, 16, 4, 8, 16, 4, 2, 8, 2
    cfg = RunConfig(arch="gpt", dataset="copy", blocks=L, hidden=h, heads=a, seq_len=s, vocab=V, batch=B)
    cfg.dtype, cfg.pp, cfg.experts, cfg.top_k, cfg.capacity_factor = "float64", 2, E, K, 2.0
    cfg.schedule, cfg.microbatches = "naive", M
    n = B * s // M  # tokens of a micro-batch
    fwd = 2 * n * (L * (4 * h * h + 2 * s * h + h * E + 8 * K * h * h) + h * V)
    boundary = 2 * (2e-6 + n * h * 8 / 2e8)
    t = predict_from_config(cfg, 2, steps=1, hw=MATMULS)["time"]
    assert t["step_s"] == pytest.approx(M * (3 * fwd / 1e9 + boundary), rel=1e-12)


@pytest.mark.parametrize("recompute", ["full", "selective"])
def test_a_naive_pipeline_recomputes_in_closed_form(recompute):
    """The same pipeline with --recompute: each micro-batch's backward first runs its chunk's forward
    again (full: every matmul of the forward, the head's included, no loss), or rebuilds each block's
    softmax (selective: q k^T, 2 n s h FLOPs a block)."""
    L, h, a, s, V, E, K, B, M = 2, 16, 4, 8, 16, 4, 2, 8, 2
    cfg = RunConfig(arch="gpt", dataset="copy", blocks=L, hidden=h, heads=a, seq_len=s, vocab=V, batch=B)
    cfg.dtype, cfg.pp, cfg.experts, cfg.top_k, cfg.capacity_factor = "float64", 2, E, K, 2.0
    cfg.schedule, cfg.microbatches, cfg.recompute = "naive", M, recompute
    n = B * s // M
    fwd = 2 * n * (L * (4 * h * h + 2 * s * h + h * E + 8 * K * h * h) + h * V)
    again = fwd if recompute == "full" else L * 2 * n * s * h
    boundary = 2 * (2e-6 + n * h * 8 / 2e8)
    t = predict_from_config(cfg, 2, steps=1, hw=MATMULS)["time"]
    assert t["step_s"] == pytest.approx(M * ((3 * fwd + again) / 1e9 + boundary), rel=1e-12)
