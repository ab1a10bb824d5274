"""costmodel/cp_pipeline.py and cp_pipeline_time.py with --recompute and the zero-bubble schedules, no MPI:
the closed forms against values written here from the formulas (the MPI tests check them on real runs:
tests/mpi/parallel/pipeline/test_cp_pipeline.py, tests/mpi/runtime/test_cp_pp_simclock.py).

Shape: L = 4 blocks, h = 32, a = 4 heads, s = 32, V = 32; C = 4 cp ranks (n = s/C = 8 tokens each), S = 2
stages, M = 4 micro-batches of b = 2 sequences (B = 8), float64 (bpe = 8, the wide type too). Per block on
the rank's stage, per step and rank, the attention sends (cp.py) ring 2(C-1) B n h forward + 4(C-1) B n h
backward, Ulysses 8 (C-1)/C B n h; --recompute adds what the forward sends again:
    full       ring 2(C-1) B n h,   Ulysses 4 (C-1)/C B n h
    selective  ring 2(C-1) B n h (the ring runs again to rebuild its log-sum-exp),   Ulysses 0
Kept per sequence: a ring block 16 n h + 2 n elements + its lse a n (wide), an Ulysses block 16 n h + 2 n +
a s n (P of its heads); selective drops the lse, or P; full keeps the chunk's input alone (8 n bytes of
token ids on the first stage, n h elements after). GPipe holds all B sequences, plus, with recomputation,
what the first backward rebuilds for its b sequences.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from simpar.config import RunConfig
from simpar.costmodel import predict_from_config
from simpar.costmodel.cp_pipeline import cp_recompute_kv
from simpar.costmodel.cp_pipeline_time import CpChunkCosts
from simpar.costmodel.cp_time import ring_seconds
from simpar.costmodel.gpt_time import clock_rates
from simpar.costmodel.hardware import LOCAL_DEFAULTS, group_link

L, H, A, S, V, C, STAGES, M, B = 4, 32, 4, 32, 32, 4, 2, 4, 8
N, BPE, b = S // C, 8, B // M
SHAPE = dict(arch="gpt", dataset="copy", blocks=L, hidden=H, heads=A, seq_len=S, vocab=V, batch=B)
SHAPE |= dict(cp=C, pp=STAGES, dp=1, microbatches=M, dtype="float64", steps=1)


def cp_bytes_per_block(algo: str, mode: str) -> int:
    if algo == "ring":
        return (6 * (C - 1) * B * N * H + (2 * (C - 1) * B * N * H if mode != "none" else 0)) * BPE
    return (8 * (C - 1) * B * N * H // C + (4 * (C - 1) * B * N * H // C if mode == "full" else 0)) * BPE


@pytest.mark.parametrize("algo", ["ring", "ulysses"])
@pytest.mark.parametrize("mode", ["none", "full", "selective"])
def test_recompute_sends_the_attention_forward_again(algo, mode):
    pred = predict_from_config(
        RunConfig(**SHAPE, cp_algo=algo, recompute=mode), C * STAGES, hw=LOCAL_DEFAULTS
    )
    op = "activation/cp-kv" if algo == "ring" else "activation/cp-alltoall"
    for r in pred["comm"]["ranks"]:
        lo, hi = pred["stage_units"][r["coords"]["pp"]]
        blocks = sum(1 for u in range(lo, hi) if 0 < u <= L)
        assert r["by_op"][op]["sent"] == blocks * cp_bytes_per_block(algo, mode)


def test_the_recompute_closed_form_per_block():
    """cp_recompute_kv: (bytes, messages) one rank sends again per block and micro-batch."""
    for c in (2, 4, 8):
        ring, uly = 2 * (c - 1) * b * N * H * BPE, 4 * (c - 1) * (b * N * H // c) * BPE
        assert cp_recompute_kv(b, N, H, c, "ring", BPE, "full") == (ring, c - 1)
        assert cp_recompute_kv(b, N, H, c, "ring", BPE, "selective") == (ring, c - 1)
        assert cp_recompute_kv(b, N, H, c, "ulysses", BPE, "full") == (uly, 4 * (c - 1))
        assert cp_recompute_kv(b, N, H, c, "ulysses", BPE, "selective") == (0, 0)
        assert cp_recompute_kv(b, N, H, c, "ring", BPE, "none") == (0, 0)


@pytest.mark.parametrize("algo", ["ring", "ulysses"])
@pytest.mark.parametrize("mode", ["none", "full", "selective"])
def test_gpipe_activation_peak_reflects_recompute(algo, mode):
    pred = predict_from_config(
        RunConfig(**SHAPE, cp_algo=algo, recompute=mode, schedule="gpipe"), C * STAGES, hw=LOCAL_DEFAULTS
    )
    softmax = A * N * BPE if algo == "ring" else A * S * N * BPE  # lse (wide = 8 bytes) or P
    block = (16 * N * H + 2 * N) * BPE + softmax
    for r in pred["comm"]["ranks"]:
        st = r["coords"]["pp"]
        lo, hi = pred["stage_units"][st]
        blocks = sum(1 for u in range(lo, hi) if 0 < u <= L)
        ends = (8 * N if lo == 0 else 0) + ((2 * N * H + N) * BPE if hi == L + 2 else 0)
        full = blocks * block + ends
        kept = {"none": full, "selective": full - blocks * softmax}.get(
            mode, 8 * N if lo == 0 else N * H * BPE
        )
        expected = B * kept + (b * (full - kept) if mode != "none" else 0)
        assert pred["memory"]["ranks"][r["rank"]]["activations_peak"] == expected, (mode, st)


def chunk_costs(algo: str, mode: str, bounds: tuple[int, int]) -> CpChunkCosts:
    """One chunk's costs as cp_pipeline_step_seconds builds them (cp rank 0, dp 1)."""
    cfg = RunConfig(**SHAPE, cp_algo=algo, recompute=mode, schedule="zb-h1")
    hw = LOCAL_DEFAULTS
    spec = SimpleNamespace(dp=1, world=C * STAGES, prec=SimpleNamespace(act=BPE, grad=BPE))
    links = {"cp": group_link(hw, "dp", C, 1, 1), "dp": group_link(hw, "dp", C, 1, STAGES)}
    links |= {"pp": group_link(hw, "pp", C, 1, STAGES), "tp": group_link(hw, "tp", C, 1, STAGES)}
    sizes = [(V + S) * H] + [12 * H * H + 13 * H] * L + [2 * H + H * V]
    return CpChunkCosts(cfg, spec, hw, links, bounds, sizes, 0.0, 0)


def test_the_w_pass_and_the_recompute_seconds():
    """zb's W pass of a block: its six matrices' dW on R = b n rows, 2 R 12 h^2 / rate, and 3 stream
    passes over its parameters; the head's 2 R h V / rate and the same. Selective: the ring's forward
    again (cp_time.ring_seconds' F) or Ulysses' q k^T, 2 b s (h/C) s / rate, per block."""
    rate, stream, _ = clock_rates(LOCAL_DEFAULTS, "fp64", C * STAGES)
    R = b * N
    costs = chunk_costs("ring", "selective", (L, L + 2))  # block L and the head
    block_p, head_p = 12 * H * H + 13 * H, 2 * H + H * V
    expected = [
        2 * R * H * V / rate + 3 * head_p * BPE * stream,
        2 * R * 12 * H * H / rate + 3 * block_p * BPE * stream,
    ]
    assert costs.weight_layers(b) == pytest.approx(expected, rel=1e-12)
    F = ring_seconds(b, N, H, A, C, BPE, rate, stream, costs.links["cp"])[0]
    assert costs.recompute(b) == pytest.approx(F, rel=1e-12)
    assert chunk_costs("ulysses", "selective", (L, L + 2)).recompute(b) == pytest.approx(
        2 * b * S * (H // C) * S / rate, rel=1e-12
    )
    # B is the backward less W: the attention's backward (its hops) stays in B
    assert costs.backward_input(b) == pytest.approx(costs.backward(b) - sum(expected), rel=1e-12)
