"""costmodel/gpt_moe_zero.py's closed forms (ZeRO with experts), checked against what ZeRO promises,
written here without the module's helpers (Rajbhandari et al. 2020, sec. 7.2; DeepSpeed-MoE):
stages 1 and 2 move exactly the bytes of the two all-reduces they replace when every size divides,
stage 3 moves 1.5 times that with one micro-step; the model states shrink by the group sizes, the dense
ones D ways and the experts' D/P ways; the activations and all-to-alls are the layout's without ZeRO.
The step time (gpt_moe_zero_time.py, as the simulated clock charges it): one rank costs the plain step,
and stage 3 costs stage 1 plus one all-gather of every unit, written here, when the ranks stay together."""

from __future__ import annotations

import pytest

from simpar.config import RunConfig
from simpar.costmodel import predict_from_config
from simpar.costmodel.hardware import LOCAL_DEFAULTS

L, H, A, S, V, B, E, K = 2, 16, 2, 8, 16, 8, 4, 2
SHAPE = dict(arch="gpt", blocks=L, hidden=H, heads=A, seq_len=S, vocab=V, dataset="copy", batch=B)
SHAPE |= dict(dtype="float64", experts=E, top_k=K, capacity_factor=2.0, optimizer="adam", steps=1)
EMBED, BLOCK, HEAD = (V + S) * H, 4 * H * H + 8 * H + H * E, 2 * H + H * V  # dense parts: all divide by 4
M = EMBED + L * BLOCK + HEAD
EXPERT = 8 * H * H + 5 * H


def predict(D: int, P: int, zero: int, C: int = 1, **extra) -> dict:
    cfg = RunConfig(**SHAPE, dp=D, ep=P, cp=C, zero=zero, **extra)
    return predict_from_config(cfg, D * C, 1, LOCAL_DEFAULTS)


@pytest.mark.parametrize("D,P,C", [(2, 2, 1), (4, 2, 1), (4, 1, 1), (4, 4, 1), (2, 2, 2)])
def test_stages_1_and_2_send_the_all_reduces_bytes_and_stage_3_half_as_much_again(D, P, C):
    """With --cp C the groups are dp x cp (D C ranks) and edp x cp ((D/P) C ranks)."""
    plain = predict(D, P, 0, C)
    Me, Q, D = L * E // P * EXPERT, D // P * C, D * C
    ring = lambda n, p: 2 * (p - 1) * n // p  # noqa: E731  (every size here divides by p)
    for zero in (1, 2, 3):
        pred = predict(D // C, P, zero, C)
        for r, base in zip(pred["comm"]["ranks"], plain["comm"]["ranks"]):
            ops = {k: v["sent"] for k, v in r["by_op"].items()}
            assert "model/grad-allreduce" not in ops and "model/expert-grad-allreduce" not in ops
            factor = 1.5 if zero == 3 else 1  # stage 3 gathers twice: 3(p-1)/p instead of 2(p-1)/p
            assert r["sent"]["model"] == factor * (ring(M, D) + ring(Me, Q)) * 8
            assert ops.get("model/expert-grad-reduce-scatter", 0) == (Q - 1) * Me // Q * 8
            assert r["sent"]["activation"] == base["sent"]["activation"]  # all-to-alls, K/V: unchanged
        assert f"zero{zero}" in pred["layout"] and f"zero{zero}" not in plain["layout"]


@pytest.mark.parametrize("zero,accum", [(1, 1), (2, 1), (2, 2), (3, 1), (3, 2)])
def test_model_states_shrink_by_their_groups(zero, accum):
    D, P = 4, 2
    Me = L * E // P * EXPERT
    shard = M // D + Me // (D // P)  # every size here divides: this rank's chunks
    unit = BLOCK + E // P * EXPERT  # the largest unit whole: a block with its experts
    pred = predict(D, P, zero, grad_accum=accum)
    params = M + Me if zero < 3 else shard + unit
    grads = {1: M + Me, 2: shard + (M + Me if accum > 1 else unit), 3: shard + unit}[zero]
    plain = predict(D, P, 0, grad_accum=accum)
    for mem, base in zip(pred["memory"]["ranks"], plain["memory"]["ranks"]):
        assert (mem["params"], mem["grads"], mem["optimizer"]) == (8 * params, 8 * grads, 16 * shard)
        assert mem["activations_peak"] == base["activations_peak"]


def test_mixed_bf16_keeps_float32_masters_of_the_chunks_only():
    """--precision mixed-bf16: 2-byte parameters and gradients, 12 B a parameter of optimizer state
    (float32 master and Adam's two moments) -- of this rank's chunks only."""
    D, P = 4, 2
    shard = M // D + L * E // P * EXPERT // (D // P)
    shape = {k: v for k, v in SHAPE.items() if k != "dtype"}
    cfg = RunConfig(**shape, dp=D, ep=P, zero=1, precision="mixed-bf16")
    pred = predict_from_config(cfg, D, 1, LOCAL_DEFAULTS)
    for mem in pred["memory"]["ranks"]:
        assert (mem["params"], mem["optimizer"]) == (2 * (M + L * E // P * EXPERT), 12 * shard)


def test_one_rank_moves_nothing_so_every_stage_costs_the_plain_step():
    """On one rank every group has one member: ZeRO's rings are skipped and its optimizer sweeps the
    whole model, so gpt_moe_zero_time.py's unit-by-unit step is gpt_moe_time.py's step exactly."""
    plain = predict(1, 1, 0)["time"]["step_s"]
    for zero in (1, 2, 3):
        assert predict(1, 1, zero)["time"]["step_s"] == pytest.approx(plain, rel=1e-12)


def test_stage_3_adds_one_gather_of_every_unit_to_stage_1_when_the_ranks_stay_together():
    """dp4 x ep2, one micro-step, balanced routing, every size dividing: every rank's clock is the same
    throughout, so a blocking ring costs (p - 1) rounds of alpha + chunk / bandwidth on each. Stage 1
    reduce-scatters and gathers every unit once, stage 3 reduce-scatters once and gathers twice, the
    optimizer sweeps the same chunks: stage 3 - stage 1 = one all-gather of every part (the dense over
    dp 4, the experts over edp 2; one node: the intra-node link)."""
    hw = LOCAL_DEFAULTS
    gather = lambda n, p: (p - 1) * (hw.intra_alpha + n // p * 8 / hw.intra_bw)  # noqa: E731
    parts = [(EMBED, 0), *[(BLOCK, E // 2 * EXPERT)] * L, (HEAD, 0)]
    extra = sum(gather(n, 4) + (gather(m, 2) if m else 0.0) for n, m in parts)
    one, three = (predict(4, 2, zero)["time"]["step_s"] for zero in (1, 3))
    assert three - one == pytest.approx(extra, rel=1e-9)


# --tp T (expert_zero_tp.py): a unit's dense part is one tp rank's share -- embedding V H/T + S H, a
# block 4H^2/T + 3H/T + 5H + HE (Wq, Wk, Wv by columns with their biases, Wo by rows; LayerNorms, bo and
# the router whole), head 2H + HV/T -- and the experts replicated over tp shard over each tp index's edp.
T = 2
EMBED_T, BLOCK_T, HEAD_T = V * H // T + S * H, 4 * H * H // T + 3 * H // T + 5 * H + H * E, 2 * H + H * V // T
M_T = EMBED_T + L * BLOCK_T + HEAD_T  # every size here divides by D = 2


@pytest.mark.parametrize("D,C,P,sp", [(2, 1, 2, False), (2, 1, 1, True), (1, 2, 1, True)])
@pytest.mark.parametrize("zero", [1, 2, 3])
def test_with_tp_each_tp_share_shards_over_dp_and_the_experts_over_edp(zero, D, C, P, sp):
    """dp2 x tp2 or cp2 x tp2, --grad-accum 2: the tp layout's all-reduces become ZeRO's halves over dp
    x cp (2 ranks) and edp x cp (2/P), K = 2 times 1.5 of them under stage 3; --sp's LayerNorm sums run
    on every micro-step under stage 3; tp's own traffic, the K/V and the all-to-alls are the layout's
    without ZeRO; model states as without tp, read with the tp shares."""
    K = 2
    Me, Q = L * E // P * EXPERT, D // P * C

    def run(z):
        cfg = RunConfig(**SHAPE, dp=D, ep=P, cp=C, tp=T, sp=sp, zero=z, grad_accum=K)
        return predict_from_config(cfg, D * C * T, 1, LOCAL_DEFAULTS)

    plain, pred = run(0), run(zero)
    D = D * C  # the dense group: dp x cp
    ring = lambda n, p: 2 * (p - 1) * n // p  # noqa: E731
    factor = 1.5 * K if zero == 3 else 1
    shard = M_T // D + Me // Q
    unit, whole = BLOCK_T + E // P * EXPERT, M_T + Me
    for r, base, mem in zip(pred["comm"]["ranks"], plain["comm"]["ranks"], pred["memory"]["ranks"]):
        ops, before = r["by_op"], base["by_op"]
        zero_bytes = sum(v["sent"] for k, v in ops.items() if k.startswith("model/") and "sp-" not in k)
        assert zero_bytes == factor * (ring(M_T, D) + (ring(Me, Q) if Q > 1 else 0)) * 8
        assert "model/grad-allreduce" not in ops and "model/expert-grad-allreduce" not in ops
        if sp:  # each block's 4H and the head's 2H over tp (2 ranks): H (4L + 2) elements a time
            once = (4 * L + 2) * H * 8
            assert before["model/sp-grad-allreduce"]["sent"] == once
            assert ops["model/sp-grad-allreduce"]["sent"] == once * (K if zero == 3 else 1)
        assert r["sent"]["activation"] == base["sent"]["activation"]
        params = whole if zero < 3 else shard + unit
        grads = {1: whole, 2: shard + whole, 3: shard + unit}[zero]  # stage 2, K > 1: whole buffers
        assert (mem["params"], mem["grads"], mem["optimizer"]) == (8 * params, 8 * grads, 16 * shard)
