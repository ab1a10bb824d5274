"""costmodel/gpt_moe_pipeline.py's closed forms for MoE blocks on pipeline stages, written again here:
the stage cut, the boundaries' b s h per micro-batch (the serial run's micro-steps of G M, then dp),
the all-to-alls of the stage's blocks (balanced: 4 (P-1)/P n K h bpe per block and micro-step; from a
routing with drops: counted here by hand), the stage's dense and expert all-reduces, its memory; and
the feeder's G x M cut (run/data.feeder_splits)."""

from __future__ import annotations

import pytest

from simpar.config import RunConfig
from simpar.costmodel import predict_from_config
from simpar.costmodel.hardware import LOCAL_DEFAULTS
from simpar.run.data import feeder_splits

H, A, S, V, E, K = 16, 2, 8, 17, 4, 2
SHAPE = dict(arch="gpt", hidden=H, heads=A, seq_len=S, vocab=V, dataset="copy", dtype="float64")
SHAPE |= dict(experts=E, top_k=K, optimizer="adam", steps=1)
BLOCK, EXPERT = 4 * H * H + 8 * H + H * E, 8 * H * H + 5 * H


def sizes(n: int, p: int) -> list[int]:
    return [n // p + (i < n % p) for i in range(p)]


def ring(n: int, p: int, r: int) -> int:
    c = sizes(n, p)
    return 2 * n - c[r] - c[(r + 1) % p] if p > 1 else 0


@pytest.mark.parametrize(
    "L,D,P,G,M,B,schedule",
    [(2, 2, 2, 1, 2, 8, "gpipe"), (4, 2, 1, 2, 2, 10, "1f1b"), (4, 4, 4, 1, 2, 16, "1f1b")],
)
def test_balanced_bytes_and_memory(L, D, P, G, M, B, schedule):
    """Two stages: the embedding and the first L/2 blocks, the other L/2 blocks and the head."""
    layout = dict(pp=2, dp=D, ep=P, grad_accum=G, microbatches=M, schedule=schedule)
    cfg = RunConfig(**SHAPE, blocks=L, batch=B, capacity_factor=2.0, **layout)
    pred = predict_from_config(cfg, 2 * D, steps=1, hw=LOCAL_DEFAULTS)
    assert pred["stage_units"] == [(0, L // 2 + 1), (L // 2 + 1, L + 2)]
    dense = [(V + S) * H + L // 2 * BLOCK, L // 2 * BLOCK + 2 * H + H * V]
    experts = L // 2 * E // P * EXPERT
    for r, rank in enumerate(pred["comm"]["ranks"]):
        st, d = divmod(r, D)
        rows = [sizes(n, D)[d] for n in sizes(B, G * M)]  # this rank's sequences per micro-step
        by_op = {k: v["sent"] for k, v in rank["by_op"].items()}
        assert by_op[f"activation/{'pp-send-act' if st == 0 else 'pp-send-grad'}"] == sum(rows) * S * H * 8
        a2a = sum(4 * (P - 1) * b * S * K * H * 8 * (L // 2) / P for b in rows)
        assert sum(v for k, v in by_op.items() if "/ep-" in k) == pytest.approx(a2a, abs=4)
        assert by_op["model/grad-allreduce"] == ring(dense[st], D, d) * 8
        assert by_op.get("model/expert-grad-allreduce", 0) == ring(experts, D // P, d // P) * 8
        mem = pred["memory"]["ranks"][r]
        assert (mem["params"], mem["optimizer"]) == ((dense[st] + experts) * 8, (dense[st] + experts) * 16)
    assert pred["params"] == (V + S) * H + L * (BLOCK + E * EXPERT) + 2 * H + H * V


def test_routing_with_drops_counted_by_hand():
    """One micro-step of 2 sequences (16 tokens, capacity ceil(1 x 2 x 16 / 4) = 8), dp2 x ep2: rank 0
    routed [8, 4, 2, 2] and keeps them all; rank 1 routed [6, 2, 6, 2] and keeps [0, 2, 6, 2] (expert 0
    full). Rank 0 (experts 0, 1) dispatches 2 + 2 = 4 rows and gets back rank 1's 0 + 2; rank 1
    dispatches 0 + 2 = 2 and returns rank 0's 2 + 2 = 4: rows x h x 8 B, the same on both stages."""
    cfg = RunConfig(**SHAPE, blocks=2, batch=2, pp=2, dp=2, ep=2, microbatches=1, capacity_factor=1.0)
    Hs = [[8, 4, 2, 2], [6, 2, 6, 2]]
    pred = predict_from_config(cfg, 4, steps=1, hw=LOCAL_DEFAULTS, routing={"routed_by_rank": [[Hs, Hs]]})
    for r, rank in enumerate(pred["comm"]["ranks"]):
        out, back = (4, 2) if r % 2 == 0 else (2, 4)
        by_op = {k: v["sent"] for k, v in rank["by_op"].items()}
        assert by_op["activation/ep-dispatch"] == by_op["activation/ep-combine-grad"] == out * H * 8
        assert by_op["activation/ep-combine"] == by_op["activation/ep-dispatch-grad"] == back * H * 8


def test_the_feeder_cuts_g_x_m_micro_steps_only_for_moe_pipelines():
    base = dict(arch="gpt", dataset="copy", grad_accum=2, microbatches=3)
    assert feeder_splits(RunConfig(**base, experts=4, pp=2)) == 6
    assert feeder_splits(RunConfig(**base, experts=4)) == 2
    assert feeder_splits(RunConfig(**base, pp=2)) == 2


def test_interleaved_two_chunks_a_stage():
    """--schedule interleaved --virtual-stages 2, L = 2: four chunks of one unit, stage 0 holding the
    embedding and block 2, stage 1 block 1 and the head. Every chunk boundary crosses stages, so per
    micro-batch stage 0 sends 2 activations and 1 gradient, stage 1 1 and 2, b s h each; each chunk
    all-reduces its own dense part (and its experts) in its own call."""
    layout = dict(pp=2, dp=2, ep=2, microbatches=2, schedule="interleaved", virtual_stages=2)
    cfg = RunConfig(**SHAPE, blocks=2, batch=8, capacity_factor=2.0, **layout)
    pred = predict_from_config(cfg, 4, steps=1, hw=LOCAL_DEFAULTS)
    assert pred["stage_units"] == [(0, 1), (1, 2), (2, 3), (3, 4)]
    chunks = [[(V + S) * H, BLOCK], [BLOCK, 2 * H + H * V]]
    for r, rank in enumerate(pred["comm"]["ranks"]):
        st, d = divmod(r, 2)
        by_op = {k: v["sent"] for k, v in rank["by_op"].items()}
        stream = 8 // 2 * S * H * 8  # 4 sequences a step on this dp rank, in 2 micro-batches
        acts, grads = (2, 1) if st == 0 else (1, 2)
        sent = (by_op["activation/pp-send-act"], by_op["activation/pp-send-grad"])
        assert sent == (acts * stream, grads * stream)
        assert by_op["model/grad-allreduce"] == sum(ring(n, 2, d) for n in chunks[st]) * 8
        assert "model/expert-grad-allreduce" not in by_op  # D/P = 1
        a2a = 4 * (2 - 1) / 2 * 4 * S * K * H * 8  # one block a stage, 4 sequences: 4 (P-1)/P n K h
        assert sum(v for k, v in by_op.items() if "/ep-" in k) == pytest.approx(a2a)


def test_pp_x_tp_adds_attention_and_vocabulary_traffic_per_chunk():
    """pp2 x dp2 x ep2 x tp2, L = 2, gpipe, 2 micro-batches of 2 sequences (R = 16 rows): stage 0 (the
    embedding and block 1) sends, per micro-batch, one ring all-reduce of R h for the embedding and one
    each for block 1's g and f (T = 2: 2 (T-1)/T R h = R h elements); stage 1 (block 2 and the head)
    block 2's g and f, the head's all-reduce, the row maxima (T-1) R and the sums 2 R; each tp rank its
    own b s h copy at the boundary; its dense shards all-reduced over dp."""
    T, D = 2, 2
    layout = dict(pp=2, dp=D, ep=2, tp=T, microbatches=2, schedule="gpipe")
    cfg = RunConfig(**(SHAPE | dict(vocab=18)), blocks=2, batch=8, capacity_factor=2.0, **layout)
    pred = predict_from_config(cfg, 8, steps=1, hw=LOCAL_DEFAULTS)
    R, Vt = 2 * S, 18
    block = 4 * H * H // T + 3 * H // T + 5 * H + H * E
    dense = [Vt * H // T + S * H + block, block + 2 * H + H * Vt // T]
    stream = 2 * R * H * 8  # R h elements, once per micro-batch: ring all-reduce over 2 or a boundary
    for r, rank in enumerate(pred["comm"]["ranks"]):
        st, d = divmod(r // T, D)
        by_op = {op: v["sent"] for op, v in rank["by_op"].items()}
        want = {"activation/tp-g-allreduce": stream, "activation/tp-f-allreduce": stream}
        if st == 0:
            want |= {"activation/vocab-embed-allreduce": stream, "activation/pp-send-act": stream}
        else:
            want |= {"activation/vocab-head-allreduce": stream, "activation/pp-send-grad": stream}
            want |= {"activation/vocab-ce-max": 2 * R * 8, "activation/vocab-ce-sums": 2 * 2 * R * 8}
        for op, n in want.items():
            assert by_op[op] == n, (r, op)
        assert by_op["model/grad-allreduce"] == ring(dense[st], D, d) * 8
        assert pred["memory"]["ranks"][r]["params"] == (dense[st] + E // 2 * EXPERT) * 8


@pytest.mark.parametrize("schedule", ["gpipe", "zb-h1"])
def test_recompute_sends_the_forward_all_to_alls_again_and_holds_less(schedule):
    """pp2 x dp2 x ep2, L = 2, 2 micro-batches of b = 2 sequences (n = 16 rows) a dp rank, balanced
    routing (each expert keeps n K / E of every rank, so a rank receives n K rows). --recompute full
    re-runs each forward: ep-dispatch and ep-combine twice ((P-1)/P n K h x 8 B per block and
    micro-batch each), the backward's two once, the boundaries as before; selective moves nothing more.
    Activations (8 B elements), a micro-batch: block 1 or 2 (8 n h + a s n + 2 n) + n K h + 9 h n K + n E,
    the embedding's 8 n token bytes, the head 2 n h + n. The last stage holds its two micro-batches'
    forwards, then a backward rebuilds one in full: gpipe's peak = 2 kept + (full - kept) on both stages;
    full recompute keeps the stage's input (n h, or the tokens), selective drops the block's P (a s n).
    zb-h1's last stage runs F0 B0 F1 B1 before its W passes: both micro-batches rebuilt, 2 full, the
    saving gone there (the first stage's order: the MPI test, measured against the prediction)."""
    n = 2 * S
    block = (8 * n * H + A * S * n + 2 * n + n * K * H + 9 * H * n * K + n * E) * 8
    full = [8 * n + block, block + (2 * H * n + n) * 8]
    kept = {"none": full, "full": [8 * n, n * H * 8], "selective": [f - A * S * n * 8 for f in full]}
    a2a = 2 * (2 - 1) / 2 * n * K * H * 8  # 2 micro-batches, one block a stage
    layout = dict(pp=2, dp=2, ep=2, microbatches=2, schedule=schedule)
    by_mode = {}
    for mode in ("none", "full", "selective"):
        cfg = RunConfig(**SHAPE, blocks=2, batch=8, capacity_factor=2.0, recompute=mode, **layout)
        pred = predict_from_config(cfg, 4, steps=1, hw=LOCAL_DEFAULTS)
        by_mode[mode] = [{k: v["sent"] for k, v in rank["by_op"].items()} for rank in pred["comm"]["ranks"]]
        again = 2 if mode == "full" else 1
        for by_op in by_mode[mode]:
            assert by_op["activation/ep-dispatch"] == pytest.approx(again * a2a)
            assert by_op["activation/ep-combine"] == pytest.approx(again * a2a)
            assert (
                by_op["activation/ep-combine-grad"]
                == by_op["activation/ep-dispatch-grad"]
                == pytest.approx(a2a)
            )
        peaks = [pred["memory"]["ranks"][r]["activations_peak"] for r in (0, 2)]
        if schedule == "gpipe":
            assert peaks == [2 * k + f - k for k, f in zip(kept[mode], full)]
        else:
            assert peaks[1] == 2 * full[1]
    for none, full_, sel in zip(by_mode["none"], by_mode["full"], by_mode["selective"]):
        assert sel == none
        assert {
            k: v for k, v in full_.items() if k not in ("activation/ep-dispatch", "activation/ep-combine")
        } == {k: v for k, v in none.items() if k not in ("activation/ep-dispatch", "activation/ep-combine")}


def test_recompute_full_with_tp_sends_the_forwards_tp_messages_again():
    """pp2 x dp2 x ep2 x tp2 as the test above: --recompute full re-runs each chunk's forward, so each
    block's g all-reduce and stage 0's embedding all-reduce are sent twice (2 R h elements a micro-batch
    each); the backward's f, the head's all-reduce and the loss's row maxima and sums once."""
    T, D, R = 2, 2, 2 * S
    layout = dict(pp=2, dp=D, ep=2, tp=T, microbatches=2, schedule="gpipe", recompute="full")
    cfg = RunConfig(**(SHAPE | dict(vocab=18)), blocks=2, batch=8, capacity_factor=2.0, **layout)
    pred = predict_from_config(cfg, 8, steps=1, hw=LOCAL_DEFAULTS)
    stream = 2 * R * H * 8
    for r, rank in enumerate(pred["comm"]["ranks"]):
        st = r // T // D
        by_op = {op: v["sent"] for op, v in rank["by_op"].items()}
        assert (by_op["activation/tp-g-allreduce"], by_op["activation/tp-f-allreduce"]) == (
            2 * stream,
            stream,
        )
        if st == 0:
            assert by_op["activation/vocab-embed-allreduce"] == 2 * stream
        else:
            assert by_op["activation/vocab-head-allreduce"] == stream
            assert by_op["activation/vocab-ce-max"] == 2 * R * 8


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_sp_stages_send_row_shards_and_recompute_repeats_the_forward_gathers(recompute):
    """pp2 x tp2 --sp, L = 2, gpipe, 2 micro-batches of b = 4 sequences (R = 32 rows; a ring all-gather
    or reduce-scatter of R h over 2 ranks sends R h / 2 = one shard). Per micro-batch a boundary carries
    the shard; stage 0 (the embedding and block 1) sends block 1's 4 all-gathers and 2 reduce-scatters
    (expert_tensor_gpt.py's --sp), the embedding's reduce-scatter and its backward all-gather; stage 1
    (block 2 and the head) block 2's, the head's all-gather and reduce-scatter, the row maxima and sums.
    --recompute full re-runs the forward: per block 2 all-gathers and 1 reduce-scatter more, the
    embedding's reduce-scatter, the head's all-gather. Once a step the LayerNorms' gradients over tp:
    4h a block, 2h the head (2 (T-1)/T of each)."""
    again = recompute == "full"
    layout = dict(pp=2, tp=2, sp=True, microbatches=2, schedule="gpipe", recompute=recompute)
    cfg = RunConfig(**(SHAPE | dict(vocab=18)), blocks=2, batch=8, capacity_factor=2.0, **layout)
    pred = predict_from_config(cfg, 4, steps=1, hw=LOCAL_DEFAULTS)
    R = 4 * S
    shard = 2 * R * H // 2 * 8  # two micro-batches
    for r, rank in enumerate(pred["comm"]["ranks"]):
        st = r // 2
        by_op = {k: v["sent"] for k, v in rank["by_op"].items()}
        want = {"activation/sp-gather": (4 + 2 * again) * shard, "activation/sp-scatter": (2 + again) * shard}
        if st == 0:
            want["activation/pp-send-act"] = shard
            want["activation/vocab-embed-scatter"] = (1 + again) * shard
            want["activation/vocab-embed-gather"] = shard
            want["model/sp-grad-allreduce"] = 4 * H * 8
        else:
            want["activation/pp-send-grad"] = shard
            want["activation/vocab-head-gather"] = (1 + again) * shard
            want["activation/vocab-head-scatter"] = shard
            want["activation/vocab-ce-max"] = 2 * R * 8
            want["activation/vocab-ce-sums"] = 2 * 2 * R * 8
            want["model/sp-grad-allreduce"] = (4 * H + 2 * H) * 8
        assert {k: v for k, v in by_op.items() if k != "model/grad-allreduce"} == want, r
