"""costmodel/cp_moe_tp.py's closed forms for MoE blocks under cp x tp (parallel/context_expert_tensor.py),
written again here with balanced routing (every rank keeps K/E of its R = b n token rows per expert):
per micro-step and block, the K/V of a/T heads (ring 6 (C-1) b n h/T, Ulysses 8 (C-1)/C b n h/T),
attention's g and f (one ring all-reduce of R h each), the all-to-alls' 4 (P-1)/P R K h; per micro-step
the vocabulary's four ops on R rows; per step the dense shard over D C ranks and the experts over
D/P x C; memory of a shard and the activations kept. The exact, routed bytes:
tests/mpi/parallel/test_context_expert_tensor.py."""

from __future__ import annotations

import pytest

from simpar.config import RunConfig, validate
from simpar.costmodel import predict_from_config
from simpar.costmodel.hardware import LOCAL_DEFAULTS

L, H, A, S, V, E, K = 2, 16, 4, 16, 16, 4, 2
SHAPE = dict(arch="gpt", blocks=L, hidden=H, heads=A, seq_len=S, vocab=V, dataset="copy", dtype="float64")
SHAPE |= dict(experts=E, top_k=K, capacity_factor=2.0, optimizer="adam", steps=1)
EXPERT = 8 * H * H + 5 * H


def ring_rank(n: int, p: int, r: int) -> int:
    """What rank r sends in a ring all-reduce of n elements cut in np.array_split's p chunks."""
    c = [n // p + (i < n % p) for i in range(p)]
    return 2 * n - c[r] - c[(r + 1) % p] if p > 1 else 0


CASES = [  # C, T, D, P, G, B, algo
    (2, 2, 1, 1, 1, 4, "ring"),
    (2, 2, 2, 2, 2, 8, "ulysses"),
    (2, 4, 2, 1, 1, 8, "ring"),
    (4, 2, 2, 2, 1, 8, "ring"),
]


@pytest.mark.parametrize("C,T,D,P,G,B,algo", CASES)
def test_balanced_bytes_memory_and_activations(C, T, D, P, G, B, algo):
    cfg = RunConfig(**SHAPE, cp=C, tp=T, dp=D, ep=P, grad_accum=G, batch=B, cp_algo=algo)
    validate(cfg, C * T * D)  # built: no longer refused (config/moe.py refuses --cp with --pp only)
    pred = predict_from_config(cfg, C * T * D, steps=1, hw=LOCAL_DEFAULTS)
    assert len(pred["comm"]["ranks"]) == C * T * D
    dense = V * H // T + S * H + L * (4 * H * H // T + 3 * H // T + 5 * H + H * E) + 2 * H + H * V // T
    experts = L * E // P * EXPERT
    b, n = B // G // D, S // C  # every size here divides
    R = b * n
    for w, rank in enumerate(pred["comm"]["ranks"]):
        (d, c), k = divmod(w // T, C), w % T
        by_op = {op: v["sent"] for op, v in rank["by_op"].items()}
        if algo == "ring":
            assert by_op["activation/cp-kv"] == G * L * 6 * (C - 1) * b * n * H // T * 8
        else:
            assert by_op["activation/cp-alltoall"] == G * L * 8 * (C - 1) * b * n * H // T // C * 8
        ar = ring_rank(R * H, T, k)
        assert by_op["activation/tp-g-allreduce"] == by_op["activation/tp-f-allreduce"] == G * L * ar * 8
        assert (
            by_op["activation/vocab-embed-allreduce"]
            == by_op["activation/vocab-head-allreduce"]
            == G * ar * 8
        )
        assert by_op["activation/vocab-ce-max"] == G * (T - 1) * R * 8
        a2a = G * L * 4 * (P - 1) * R * K * H * 8 / P
        assert sum(v for op, v in by_op.items() if "/ep-" in op) == pytest.approx(a2a)
        assert by_op.get("model/grad-allreduce", 0) == ring_rank(dense, D * C, d * C + c) * 8
        edp = D // P * C
        assert by_op.get("model/expert-grad-allreduce", 0) == ring_rank(experts, edp, d // P * C + c) * 8
        mem = pred["memory"]["ranks"][w]
        assert (mem["params"], mem["grads"], mem["optimizer"]) == tuple(
            (dense + experts) * x for x in (8, 8, 16)
        )
        scores = A * R // T * 8 if algo == "ring" else A * S * R // T * 8
        block = (3 * R * H + 4 * R * H // T + 2 * R + R * H + R * K * H + 9 * H * R * K + R * E) * 8 + scores
        assert mem["activations_peak"] == round(8 * R + (2 * R * H + R) * 8 + L * block)


def test_the_ring_carries_a_tp_rank_s_heads_only():
    """cp_moe_tp.py, not cp_moe.py, predicts --experts --cp --tp: its K/V at tp 2 is half of cp2's alone."""
    with_tp = predict_from_config(RunConfig(**SHAPE, cp=2, tp=2, batch=4), 4, steps=1, hw=LOCAL_DEFAULTS)
    alone = predict_from_config(RunConfig(**SHAPE, cp=2, batch=4), 2, steps=1, hw=LOCAL_DEFAULTS)
    kv = [p["comm"]["ranks"][0]["by_op"]["activation/cp-kv"]["sent"] for p in (with_tp, alone)]
    assert 2 * kv[0] == kv[1] > 0


@pytest.mark.parametrize("C,T,D,P,G,B,algo", CASES)
def test_sp_balanced_bytes_and_activations(C, T, D, P, G, B, algo):
    """--sp (context_expert_tensor.py on row shards): per block and micro-step 4 ring all-gathers of R h
    (attention's f-bar, the MoE input; backward g-bar's and dL/dm's) and 2 reduce-scatters (g-bar, f-bar's
    backward), each sending (T-1)/T R h, in place of tp-g and tp-f; the vocabulary's embed and head as one
    reduce-scatter and one all-gather each; K/V and all-to-alls as without --sp. Per step the LayerNorms'
    row-shard gradients (4h a block, 2h the head) all-reduced over tp. Activations: the LayerNorms' xh and
    1/sigma on R/T rows, the rest as without."""
    cfg = RunConfig(**SHAPE, cp=C, tp=T, dp=D, ep=P, grad_accum=G, batch=B, cp_algo=algo, sp=True)
    validate(cfg, C * T * D)  # built: no longer refused
    pred = predict_from_config(cfg, C * T * D, steps=1, hw=LOCAL_DEFAULTS)
    b, n = B // G // D, S // C
    R = b * n
    part = (T - 1) * R * H // T  # what one ring all-gather or reduce-scatter of R h sends
    for w, rank in enumerate(pred["comm"]["ranks"]):
        k = w % T
        by_op = {op: v["sent"] for op, v in rank["by_op"].items()}
        assert by_op["activation/sp-gather"] == G * 4 * L * part * 8
        assert by_op["activation/sp-scatter"] == G * 2 * L * part * 8
        for op in ("vocab-embed-scatter", "vocab-embed-gather", "vocab-head-gather", "vocab-head-scatter"):
            assert by_op[f"activation/{op}"] == G * part * 8
        assert not any("allreduce" in op for op in by_op if op.startswith("activation/"))
        if algo == "ring":
            assert by_op["activation/cp-kv"] == G * L * 6 * (C - 1) * b * n * H // T * 8
        a2a = G * L * 4 * (P - 1) * R * K * H * 8 / P
        assert sum(v for op, v in by_op.items() if "/ep-" in op) == pytest.approx(a2a)
        assert by_op["model/sp-grad-allreduce"] == (L * ring_rank(4 * H, T, k) + ring_rank(2 * H, T, k)) * 8
        mem = pred["memory"]["ranks"][w]
        scores = A * R // T * 8 if algo == "ring" else A * S * R // T * 8
        ln = R * H // T + R // T  # a LayerNorm's xh and 1/sigma on this rank's R/T rows
        block = (R * H + 2 * ln + 4 * R * H // T + R * H + R * K * H + 9 * H * R * K + R * E) * 8 + scores
        assert mem["activations_peak"] == round(8 * R + (R * H + ln) * 8 + L * block)
