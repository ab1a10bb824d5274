"""costmodel/gpt_moe.py's closed forms for the MoE transformer, written again here: balanced routing
moves 4 x (P-1)/P x n_d K h bpe per block and micro-step through the four all-to-alls; the gradient
all-reduces are the ring's 2(p-1)/p over the non-expert parameters (dp) and the rank's experts (edp)."""

from __future__ import annotations

import pytest

from simpar.config import RunConfig
from simpar.costmodel import predict_from_config
from simpar.costmodel.hardware import LOCAL_DEFAULTS

L, H, A, S, V, B, E, K = 2, 16, 2, 8, 17, 8, 4, 2
SHAPE = dict(arch="gpt", blocks=L, hidden=H, heads=A, seq_len=S, vocab=V, dataset="copy", batch=B)
SHAPE |= dict(dtype="float64", experts=E, top_k=K, capacity_factor=2.0, optimizer="adam", steps=1)
M = (V + S) * H + L * (4 * H * H + 8 * H + H * E) + 2 * H + H * V
EXPERT = 8 * H * H + 5 * H


@pytest.mark.parametrize("D,P", [(1, 1), (2, 2), (4, 2), (4, 4)])
def test_balanced_routing_bytes_and_memory(D, P):
    cfg = RunConfig(**SHAPE, dp=D, ep=P)
    pred = predict_from_config(cfg, D, steps=1, hw=LOCAL_DEFAULTS)
    n = B // D * S  # tokens per rank
    for d, r in enumerate(pred["comm"]["ranks"]):
        a2a = 4 * L * (P - 1) * n * K * H * 8 // P
        assert r["sent"]["activation"] == a2a
        ring = lambda count, p: 2 * (p - 1) * count // p  # noqa: E731  (every size here divides by p)
        assert r["sent"]["model"] == (ring(M, D) + ring(L * E // P * EXPERT, D // P)) * 8
        mem = pred["memory"]["ranks"][d]
        assert mem["params"] == (M + L * E // P * EXPERT) * 8
    assert pred["params"] == M + L * E * EXPERT
