"""costmodel/gpt_moe_tp.py's closed forms for MoE blocks under tp, written again here with balanced
routing: per micro-step of R = b s rows, attention's g and f (L ring all-reduces of R h each, the
MoE part being replicated over tp: no MLP split), the vocabulary's four ops, the all-to-alls'
4 (P-1)/P R K h per block, the dense shards over dp and the experts over D/P, the memory of a shard."""

from __future__ import annotations

import pytest

from simpar.config import RunConfig
from simpar.costmodel import predict_from_config
from simpar.costmodel.hardware import LOCAL_DEFAULTS

L, H, A, S, V, E, K = 2, 16, 4, 8, 16, 4, 2
SHAPE = dict(arch="gpt", blocks=L, hidden=H, heads=A, seq_len=S, vocab=V, dataset="copy", dtype="float64")
SHAPE |= dict(experts=E, top_k=K, capacity_factor=2.0, optimizer="adam", steps=1)
EXPERT = 8 * H * H + 5 * H


def ring(n: int, p: int) -> float:
    return 2 * (p - 1) * n / p


def ring_rank(n: int, p: int, r: int) -> int:
    """What rank r sends in a ring all-reduce of n elements cut in np.array_split's p chunks."""
    c = [n // p + (i < n % p) for i in range(p)]
    return 2 * n - c[r] - c[(r + 1) % p] if p > 1 else 0


@pytest.mark.parametrize("T,D,P,G,B", [(2, 1, 1, 1, 8), (2, 2, 2, 2, 8), (4, 2, 1, 1, 16), (2, 4, 2, 1, 16)])
def test_balanced_bytes_and_memory(T, D, P, G, B):
    cfg = RunConfig(**SHAPE, tp=T, dp=D, ep=P, grad_accum=G, batch=B)
    pred = predict_from_config(cfg, T * D, steps=1, hw=LOCAL_DEFAULTS)
    dense = V * H // T + S * H + L * (4 * H * H // T + 3 * H // T + 5 * H + H * E) + 2 * H + H * V // T
    experts = L * E // P * EXPERT
    for r, rank in enumerate(pred["comm"]["ranks"]):
        by_op = {k: v["sent"] for k, v in rank["by_op"].items()}
        R = B // G // D * S  # rows per micro-step on this rank (every size here divides)
        assert (
            by_op["activation/tp-g-allreduce"]
            == by_op["activation/tp-f-allreduce"]
            == G * L * ring(R * H, T) * 8
        )
        assert by_op["activation/vocab-embed-allreduce"] == G * ring(R * H, T) * 8
        assert by_op["activation/vocab-ce-max"] == G * (T - 1) * R * 8
        a2a = G * L * 4 * (P - 1) * R * K * H * 8 / P
        assert sum(v for k, v in by_op.items() if "/ep-" in k) == pytest.approx(a2a)
        assert by_op.get("model/grad-allreduce", 0) == ring_rank(dense, D, r // T) * 8
        assert by_op.get("model/expert-grad-allreduce", 0) == ring(experts, D // P) * 8
        assert pred["memory"]["ranks"][r]["params"] == (dense + experts) * 8


@pytest.mark.parametrize("T,D,P", [(2, 2, 2), (4, 1, 1)])
def test_sequence_parallel_bytes_and_activations(T, D, P):
    """--sp, balanced routing, B = 8 sequences, one micro-step: R = 8/D s rows a dp rank. Per block 4
    all-gathers of R h (attention's f-bar, the MoE input, backward g-bar's and dL/dm's) and 2
    reduce-scatters (attention's g-bar, f-bar's backward), (T-1)/T R h each; the vocabulary's four ops
    one each; sp-grad-allreduce 2 (T-1)/T of 4h a block and 2h the head. Activations (8 B elements, n =
    R): per block attention's gathered input n h, LN1's and LN2's xh 2 n h/T, q k v o 4 n h/T, P a s
    n/T, 1/sigma 2 n/T, the MoE part n h + n K h + 9 h n K + n E (balanced: every row's K slots kept,
    n K rows received); the head n h + n h/T + n/T; the tokens 8 n bytes."""
    cfg = RunConfig(**SHAPE, tp=T, dp=D, ep=P, batch=8, sp=True)
    pred = predict_from_config(cfg, T * D, steps=1, hw=LOCAL_DEFAULTS)
    n = 8 // D * S
    part = (T - 1) * n * H // T * 8
    block = n * H + 6 * n * H // T + A * S * n // T + 2 * n // T + n * H + n * K * H + 9 * H * n * K + n * E
    head = n * H + n * H // T + n // T
    for r, rank in enumerate(pred["comm"]["ranks"]):
        by_op = {k: v["sent"] for k, v in rank["by_op"].items()}
        assert (by_op["activation/sp-gather"], by_op["activation/sp-scatter"]) == (4 * L * part, 2 * L * part)
        for op in ("vocab-embed-scatter", "vocab-embed-gather", "vocab-head-gather", "vocab-head-scatter"):
            assert by_op[f"activation/{op}"] == part
        assert "activation/tp-g-allreduce" not in by_op and "activation/tp-f-allreduce" not in by_op
        assert by_op["model/sp-grad-allreduce"] == ring(4 * H * L + 2 * H, T) * 8
        assert pred["memory"]["ranks"][r]["activations_peak"] == 8 * n + (L * block + head) * 8
