"""The MFU column of `tour --arch gpt --clock sim` (run/tour.py), against PaLM's definition written here:
model FLOPs per step (the causal count, costmodel/gpt.py) / (step time x ranks x the device's dense peak)."""

from __future__ import annotations

import pytest

from simpar.config import RunConfig
from simpar.run.tour import model_flops_utilisation


def test_mfu_is_causal_model_flops_over_step_ranks_and_the_dense_peak():
    shape = dict(arch="gpt", blocks=2, hidden=16, heads=4, seq_len=8, vocab=16, batch=8)
    cfg = RunConfig(**shape, hardware="dgx-h100")
    B, s, L, h, V = 8, 8, 2, 16, 16
    # Narayanan et al. 2021, sec. 5.1, with the causal half of the scores (s/12h: Megatron-LM's count)
    flops = 72 * B * s * L * h**2 * (1 + s / (12 * h) + V / (12 * L * h))
    peak = 67e12  # H100 SXM dense FP32 (datasheet): --dtype float32 runs on the CUDA cores, not TF32
    assert model_flops_utilisation(cfg, 4, 1e-4) == pytest.approx(flops / (1e-4 * 4 * peak), rel=1e-12)
    mixed = RunConfig(**{**cfg.__dict__, "precision": "mixed-bf16"})
    assert model_flops_utilisation(mixed, 4, 1e-4) == pytest.approx(flops / (1e-4 * 4 * 989.4e12), rel=1e-12)


def test_mfu_of_experts_counts_the_k_experts_and_the_router():
    """--experts 4 --top-k 2: each token runs two expert MLPs (48 B s L h^2 more) and the router
    (6 B s L h E)."""
    shape = dict(arch="gpt", blocks=2, hidden=16, heads=4, seq_len=8, vocab=16, batch=8, hardware="dgx-h100")
    B, s, L, h, V, E = 8, 8, 2, 16, 16, 4
    flops = (
        72 * B * s * L * h**2 * (1 + s / (12 * h) + V / (12 * L * h))  # the causal count, as above
        + 48 * B * s * L * h**2
        + 6 * B * s * L * h * E
    )
    moe = RunConfig(**shape, experts=E, top_k=2)
    assert model_flops_utilisation(moe, 4, 1e-4) == pytest.approx(flops / (1e-4 * 4 * 67e12), rel=1e-12)
