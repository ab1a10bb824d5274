"""One simulated step end to end on a toy cluster, against closed forms written HERE, not taken from
simpar.costmodel (which the other simclock tests compare with the clock): an independent witness.

The toy profile: nodes of 2 devices, 1 CPU core per node (two ranks share it: each computes at half
speed), a per-layer call overhead, no memory-bound cost (gamma 0) and no NCCL protocols, so that a
step is matmuls, layer overheads and alpha-beta messages only:

    a matmul (m x k)(k x n)          2mkn / (R * share)          share = cores / ranks on the node
    a layer's forward call           + overhead / share
    a message of n bytes on a link   alpha + n / bw
    GPipe, 2 stages, M micro-batches F0 + B0 + M (F1 + B1) + 2 c     (c: one boundary message; equal
                                     stages give the textbook (M + S - 1)(F + B) + 2 (S - 1) c)
    ring all-reduce, p ranks         2 (p - 1) (alpha + (N / p) bpe / bw)

A message between nodes takes the node's network card (inter_alpha, nic_bw), one inside a node the
intra-node link: the dp4 case puts its ring across the two nodes, so only where the ranks sit decides
which numbers apply.
"""

from __future__ import annotations

import json

import pytest

from simpar.run.launch import launch

R = 1e9  # FLOP/s of a whole core, float64
OVERHEAD = 1e-6  # s per layer forward call
TOY = {
    "name": "toy",
    "description": "test profile: 2 devices per node sharing 1 core, slow network",
    "flops": {"fp64": R, "fp32": R},
    "gamma": 0.0,
    "intra_alpha": 2e-6,
    "intra_bw": 1e9,
    "devices_per_node": 2,
    "inter_alpha": 10e-6,
    "nic_bw": 1e8,
    "nics_per_node": 1,
    "cores": 1,
    "layer_overhead": OVERHEAD,
}
W = 16  # every layer 16 -> 16: four equal layers, so two pipeline stages get two each
LAYERS = [W] * 5
BPE = 8  # float64
SHARE = 0.5  # two ranks on a node's one core


def common(tmp_path) -> dict:
    path = tmp_path / "toy.json"
    path.write_text(json.dumps(TOY))
    return dict(
        clock="sim", hardware=str(path), dataset="synthetic", samples=256, layers=LAYERS, batch=32,
        steps=2, dtype="float64", optimizer="sgd", momentum=0.0,
    )  # fmt: skip


def matmul(m: int, k: int, n: int) -> float:
    return 2 * m * k * n / (R * SHARE)


def forward(rows: int, layers: int) -> float:
    return layers * (matmul(rows, W, W) + OVERHEAD / SHARE)


def backward(rows: int, layers: int, first: bool) -> float:
    """dW for every layer, dX for every layer but the model's first."""
    return (2 * layers - (1 if first else 0)) * matmul(rows, W, W)


def params() -> int:
    return 4 * (W * W + W)


def test_a_gpipe_step_is_the_textbook_formula(tmp_path):
    M = 4
    m = launch(2, pp=2, schedule="gpipe", microbatches=M, **common(tmp_path))
    rows = 32 // M
    c = TOY["intra_alpha"] + rows * W * BPE / TOY["intra_bw"]  # both stages on node 0
    F0 = F1 = forward(rows, 2)
    B0, B1 = backward(rows, 2, first=True), backward(rows, 2, first=False)
    expected = F0 + B0 + M * (F1 + B1) + 2 * c
    assert m["time"]["sim"]["step_s"] == pytest.approx(expected, rel=1e-9)
    assert m["predicted"]["time"]["step_s"] == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize(
    "ranks, link",
    [(2, ("intra_alpha", "intra_bw")), (4, ("inter_alpha", "nic_bw"))],
    ids=["one-node", "across-nodes"],
)
def test_a_data_parallel_step_is_compute_plus_the_ring(tmp_path, ranks, link):
    m = launch(ranks, dp=ranks, bucket_mb=64, **common(tmp_path))
    rows = 32 // ranks
    alpha, bw = TOY[link[0]], TOY[link[1]]
    ring = 2 * (ranks - 1) * (alpha + params() / ranks * BPE / bw)
    expected = forward(rows, 4) + backward(rows, 4, first=True) + ring
    assert m["time"]["sim"]["step_s"] == pytest.approx(expected, rel=1e-9)
    assert m["predicted"]["time"]["step_s"] == pytest.approx(expected, rel=1e-6)
