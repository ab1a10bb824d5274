"""costmodel/cp_moe_pipeline.py's closed forms for MoE pipeline stages with context parallelism, written
again here: a segment table with drops counted by hand into each (dp, cp) rank's kept rows, the
all-to-alls at each cp coordinate, the cp rank's boundary b (s/C) h, the ring's and Ulysses' K/V
traffic per block, the dense and expert all-reduces over dp x cp and (dp/ep) x cp, and one rank's
activation peak; balanced (no routing) with Ulysses and interleaved chunks."""

from __future__ import annotations

import pytest

from simpar.config import RunConfig
from simpar.costmodel import predict_from_config
from simpar.costmodel.hardware import LOCAL_DEFAULTS

H, A, S, V, E, K = 16, 2, 8, 17, 4, 2
SHAPE = dict(arch="gpt", hidden=H, heads=A, seq_len=S, vocab=V, dataset="copy", dtype="float64")
SHAPE |= dict(experts=E, top_k=K, optimizer="adam", steps=1, blocks=2)
BLOCK, EXPERT = 4 * H * H + 8 * H + H * E, 8 * H * H + 5 * H
DENSE = [(V + S) * H + BLOCK, BLOCK + 2 * H + H * V]  # stage 0: embedding + block 1; stage 1: block 2 + head

# One micro-step of 2 sequences, C = 2: 8 segments of s/(2C) = 2 tokens (row g's chunk q is segment 4g + q),
# 4 assignments each. Capacity ceil(1 x 2 x 16 / 4) = 8: expert 0 has 7 before segment 4, keeps 1 of its
# 2 there and none after. Rank (d, c) holds segments 4d + c and 4d + 3 - c.
T = [
    [2, 2, 0, 0],
    [2, 1, 1, 0],
    [2, 0, 1, 1],
    [1, 1, 1, 1],
    [2, 1, 0, 1],
    [2, 0, 2, 0],
    [0, 2, 1, 1],
    [1, 1, 1, 1],
]
KEPT = {(0, 0): [3, 3, 1, 1], (0, 1): [4, 1, 2, 1], (1, 0): [1, 2, 1, 2], (1, 1): [0, 2, 3, 1]}


def ring(n: int, p: int, r: int) -> int:
    c = [n // p + (i < n % p) for i in range(p)]
    return 2 * n - c[r] - c[(r + 1) % p] if p > 1 else 0


def test_hand_counted_segments_give_each_cp_coordinate_its_all_to_alls():
    """pp2 x dp2 x ep2 x cp2 (8 ranks, r = (st 2 + d) 2 + c), ring, one micro-step. Experts 0, 1 on
    ep rank 0, 2, 3 on ep rank 1; the ep group at cp coordinate c is (0, c), (1, c). Rank (d, c) dispatches
    its kept rows to the other rank's experts and combines the other rank's kept rows to its own:
        (0, 0): out 1 + 1 = 2, back 1 + 2 = 3    (1, 0): out 1 + 2 = 3, back 1 + 1 = 2
        (0, 1): out 2 + 1 = 3, back 0 + 2 = 2    (1, 1): out 0 + 2 = 2, back 2 + 1 = 3"""
    layout = dict(pp=2, dp=2, ep=2, cp=2, microbatches=1, schedule="gpipe", cp_algo="ring")
    cfg = RunConfig(**SHAPE, batch=2, capacity_factor=1.0, **layout)
    pred = predict_from_config(cfg, 8, steps=1, hw=LOCAL_DEFAULTS, routing={"routed_by_segment": [[T, T]]})
    rows = {(0, 0): (2, 3), (1, 0): (3, 2), (0, 1): (3, 2), (1, 1): (2, 3)}
    n = S // 2  # a cp rank's tokens of its one sequence
    for r, rank in enumerate(pred["comm"]["ranks"]):
        (st, d), c = divmod(r // 2, 2), r % 2
        out, back = rows[d, c]
        want = {
            "activation/ep-dispatch": out * H * 8,
            "activation/ep-combine-grad": out * H * 8,
            "activation/ep-combine": back * H * 8,
            "activation/ep-dispatch-grad": back * H * 8,
            f"activation/{'pp-send-act' if st == 0 else 'pp-send-grad'}": n * H * 8,
            "activation/cp-kv": 6 * (2 - 1) * n * H * 8,  # the stage's one block: 2 (C-1) + 4 (C-1) b n h
            "model/grad-allreduce": ring(DENSE[st], 4, d * 2 + c) * 8,
            "model/expert-grad-allreduce": ring(2 * EXPERT, 2, c) * 8,  # its 2 experts, (D/P) C = 2 ranks
        }
        assert {k: v["sent"] for k, v in rank["by_op"].items()} == want, r
        assert rank["by_op"]["activation/cp-kv"]["messages"] == 3
        mem = pred["memory"]["ranks"][r]
        assert (mem["params"], mem["optimizer"]) == (
            (DENSE[st] + 2 * EXPERT) * 8,
            (DENSE[st] + 2 * EXPERT) * 16,
        )
    # rank (st 1, d 0, c 0): block 2 and the head on n = 4 tokens; the block keeps 7h + 2 per token, its
    # input h, the 3 + 3 + 1 + 1 outputs that came back, 9h per row its experts 0, 1 received from the
    # group at c = 0 (3 + 3 from itself, 1 + 2 from (1, 0)), the ring's a n log-sum-exps and n E router
    # probabilities; the head 2 n h + n.
    received = sum(KEPT[0, 0][:2]) + sum(KEPT[1, 0][:2])  # 6 + 3
    block = n * (7 * H + 2) + n * H + sum(KEPT[0, 0]) * H + 9 * H * received + A * n + n * E
    assert pred["memory"]["ranks"][4]["activations_peak"] == (block + 2 * n * H + n) * 8


@pytest.mark.parametrize("schedule,virtual", [("1f1b", 1), ("interleaved", 2)])
def test_balanced_ulysses_boundaries_and_gradients(schedule, virtual):
    """pp2 x dp2 x cp2, --ep 1 (no all-to-all), balanced, 2 micro-batches of 2 sequences a dp rank: per
    micro-batch each boundary the stage's chunks cross carries 2 x (s/C) h; each block 8 (C-1) pieces of
    b n h / C (Ulysses); each chunk's dense part over the D C = 4 ranks, its experts over (D/P) C = 4."""
    layout = dict(pp=2, dp=2, cp=2, microbatches=2, schedule=schedule, cp_algo="ulysses")
    cfg = RunConfig(**SHAPE, batch=8, capacity_factor=2.0, virtual_stages=virtual, **layout)
    pred = predict_from_config(cfg, 8, steps=1, hw=LOCAL_DEFAULTS)
    stream = 2 * 2 * (S // 2) * H * 8  # 2 micro-batches of 2 sequences, s/C tokens each
    kv = 2 * 8 * (2 - 1) * (2 * (S // 2) * H // 2) * 8
    if schedule == "interleaved":  # stage 0: embedding, block 2; stage 1: block 1, head (one unit a chunk)
        chunks = [[(V + S) * H, BLOCK], [BLOCK, 2 * H + H * V]]
        sends = [(2, 1), (1, 2)]  # (activations, gradients) a micro-batch: every chunk boundary crosses
    else:
        chunks, sends = [[DENSE[0]], [DENSE[1]]], [(1, 0), (0, 1)]
    for r, rank in enumerate(pred["comm"]["ranks"]):
        (st, d), c = divmod(r // 2, 2), r % 2
        by_op = {k: v["sent"] for k, v in rank["by_op"].items()}
        assert (by_op.get("activation/pp-send-act", 0), by_op.get("activation/pp-send-grad", 0)) == tuple(
            x * stream for x in sends[st]
        )
        assert by_op["activation/cp-alltoall"] == kv  # one block a stage
        assert by_op["model/grad-allreduce"] == sum(ring(p, 4, d * 2 + c) for p in chunks[st]) * 8
        assert by_op["model/expert-grad-allreduce"] == ring(E * EXPERT, 4, d * 2 + c) * 8
        assert not any("/ep-" in k for k in by_op)


def test_full_mesh_adds_each_chunks_tensor_traffic_and_shards():
    """pp2 x cp2 x tp2 (the full mesh, D = P = 1), ring, gpipe, 2 micro-batches of 2 sequences: R = 2 s/C
    = 8 rows a micro-batch on a cp rank, every tp rank with its own copy. Per micro-batch a tp rank sends
    one ring all-reduce of R h (T = 2: R h elements) for each of its block's g and f, stage 0 one for the
    embedding, stage 1 one for the head plus the (T-1) R row maxima and 2R sums (T = 2: 2 (T-1)/T x 2R);
    the ring K/V of its a/T heads, 6 (C-1) b n h/T; the boundary R h. Per step its dense shard (attention
    by heads, the vocabulary by words, LayerNorms, bo and router whole) over the D C = 2 ranks of its tp
    index, the E experts (whole on every tp rank) over (D/P) C = 2."""
    T, C, V18 = 2, 2, 18
    layout = dict(pp=2, cp=C, tp=T, microbatches=2, schedule="gpipe", cp_algo="ring")
    cfg = RunConfig(**(SHAPE | dict(vocab=V18)), batch=4, capacity_factor=2.0, **layout)
    pred = predict_from_config(cfg, 8, steps=1, hw=LOCAL_DEFAULTS)
    R, b, n = 2 * S // C, 2, S // C
    block = 4 * H * H // T + 3 * H // T + 5 * H + H * E
    dense = [V18 * H // T + S * H + block, block + 2 * H + H * V18 // T]
    for w, rank in enumerate(pred["comm"]["ranks"]):
        st, c = divmod(w // T, C)
        per_mb = {"tp-g-allreduce": R * H, "tp-f-allreduce": R * H, "cp-kv": 6 * (C - 1) * b * n * H // T}
        if st == 0:
            per_mb |= {"vocab-embed-allreduce": R * H, "pp-send-act": R * H}
        else:
            per_mb |= {"vocab-head-allreduce": R * H, "vocab-ce-max": R, "vocab-ce-sums": 2 * R}
            per_mb |= {"pp-send-grad": R * H}
        want = {f"activation/{op}": 2 * elems * 8 for op, elems in per_mb.items()}
        want["model/grad-allreduce"] = ring(dense[st], C, c) * 8
        want["model/expert-grad-allreduce"] = ring(E * EXPERT, C, c) * 8
        assert {k: v["sent"] for k, v in rank["by_op"].items()} == want, w
        assert pred["memory"]["ranks"][w]["params"] == (dense[st] + E * EXPERT) * 8


@pytest.mark.parametrize(
    "recompute,algo,kv,msgs",
    [  # per block and micro-batch, in units of b (s/C) h elements, and messages (C = 2)
        ("none", "ring", 6, 3),
        ("full", "ring", 8, 4),  # the ring's forward hops again: 2 (C-1) b n h in C-1 messages
        ("selective", "ring", 8, 4),  # the ring's lse is rebuilt by its forward, hops included
        ("full", "ulysses", 12 / 2, 12),  # 4 forward all-to-alls again: 8 + 4 pieces of b n h / C
        ("selective", "ulysses", 8 / 2, 8),  # P from the kept q, k: no message
    ],
)
def test_recompute_resends_kv_and_forward_all_to_alls_and_keeps_less(recompute, algo, kv, msgs):
    """pp2 x dp2 x ep2 x cp2 (8 ranks), zb-h1, the hand-counted segments above in each of 2 micro-steps:
    --recompute full sends each block's ep-dispatch and ep-combine twice (the forward again, the same
    routes), the backward's two once; the K/V as in the parametrization. The zero-bubble split moves no
    byte: zb-h1's ledger is gpipe's."""
    layout = dict(pp=2, dp=2, ep=2, cp=2, microbatches=2, schedule="zb-h1", cp_algo=algo, recompute=recompute)
    cfg = RunConfig(**SHAPE, batch=4, capacity_factor=1.0, **layout)
    routing = {"routed_by_segment": [[T, T], [T, T]]}
    pred = predict_from_config(cfg, 8, steps=1, hw=LOCAL_DEFAULTS, routing=routing)
    gpipe = layout | dict(schedule="gpipe", recompute="none")
    plain = RunConfig(**SHAPE, batch=4, capacity_factor=1.0, **gpipe)
    plain = predict_from_config(plain, 8, steps=1, hw=LOCAL_DEFAULTS, routing=routing)
    rows = {(0, 0): (2, 3), (1, 0): (3, 2), (0, 1): (3, 2), (1, 1): (2, 3)}
    again = 2 if recompute == "full" else 1
    n = S // 2  # one sequence a dp rank a micro-step, s/C tokens of it
    op = "cp-kv" if algo == "ring" else "cp-alltoall"
    for r, (rank, base) in enumerate(zip(pred["comm"]["ranks"], plain["comm"]["ranks"])):
        d, c = r // 2 % 2, r % 2
        out, back = rows[d, c]
        by_op = {k: v["sent"] for k, v in rank["by_op"].items()}
        assert by_op["activation/ep-dispatch"] == 2 * again * out * H * 8
        assert by_op["activation/ep-combine"] == 2 * again * back * H * 8
        assert by_op["activation/ep-combine-grad"] == 2 * out * H * 8
        assert by_op["activation/ep-dispatch-grad"] == 2 * back * H * 8
        assert by_op[f"activation/{op}"] == 2 * kv * n * H * 8
        assert rank["by_op"][f"activation/{op}"]["messages"] == 2 * msgs
        same = {k: v for k, v in by_op.items() if "/ep-" not in k and "/cp-" not in k}
        assert same == {k: v["sent"] for k, v in base["by_op"].items() if "/ep-" not in k and "/cp-" not in k}


@pytest.mark.parametrize("recompute", ["none", "full", "selective"])
def test_recompute_activation_peak_closed_form(recompute):
    """pp2 x cp2 (D = P = 1), ring, gpipe, balanced, 2 micro-batches of 2 sequences: R = 2 s/C = 8 rows
    on a cp rank. Stage 1 (block 2, head) holds per micro-batch, float64,
        held = (R h + 2 R h + 4 R h + 2R  + R h + R K h + 9 h R K + R E) 8 + a R 8 + (2 R h + R) 8
    (LayerNorms' xh and attention's input, q k v o, two 1/sigma, the MoE input, kept outputs, received
    rows, router; the ring's a n lse; the head). gpipe runs both forwards, then the backwards: none keeps
    2 held; full keeps the chunk's input R h (8 B) and rebuilds one micro-batch's held at a time:
    R h 8 + held; selective drops each block's lse and rebuilds it: 2 held - a R 8."""
    layout = dict(pp=2, cp=2, microbatches=2, schedule="gpipe", cp_algo="ring", recompute=recompute)
    cfg = RunConfig(**SHAPE, batch=4, capacity_factor=2.0, **layout)
    pred = predict_from_config(cfg, 4, steps=1, hw=LOCAL_DEFAULTS)
    R = 2 * S // 2
    held = (8 * R * H + 2 * R + R * K * H + 9 * H * R * K + R * E) * 8 + A * R * 8 + (2 * R * H + R) * 8
    want = {"none": 2 * held, "full": R * H * 8 + held, "selective": 2 * held - A * R * 8}[recompute]
    assert [m["activations_peak"] for m in pred["memory"]["ranks"][2:]] == [want, want]


def test_full_mesh_sp_with_zero_bubble_and_full_recompute():
    """pp2 x cp2 x tp2 --sp, zb-h1, --recompute full, ring, 2 micro-batches of 2 sequences: R = 8 rows of
    N = R h elements on a cp rank, T = 2 (a ring all-gather or reduce-scatter of N sends N/2). Per
    micro-batch each block sends 6 sp-gathers (f-bar and the MoE input forward, twice under full; g-bar's
    and dL/dm's backward) and 3 sp-scatters (g-bar twice, f-bar's backward); stage 0 the embedding's
    scatter twice and its gather, stage 1 the head's gather twice and its scatter, the loss's R maxima
    and 2R sums; the K/V of a/T heads 8 (C-1) b n h/T (the ring's forward again); a boundary R h / T.
    Per step the LayerNorms' row-shard gradients over tp: 4h a block, 2h the head."""
    T, C, V18 = 2, 2, 18
    layout = dict(pp=2, cp=C, tp=T, sp=True, microbatches=2, schedule="zb-h1", cp_algo="ring")
    cfg = RunConfig(**(SHAPE | dict(vocab=V18)), batch=4, capacity_factor=2.0, recompute="full", **layout)
    pred = predict_from_config(cfg, 8, steps=1, hw=LOCAL_DEFAULTS)
    R, b, n = 2 * S // C, 2, S // C
    N = R * H
    block = 4 * H * H // T + 3 * H // T + 5 * H + H * E
    dense = [V18 * H // T + S * H + block, block + 2 * H + H * V18 // T]
    for w, rank in enumerate(pred["comm"]["ranks"]):
        st, c = divmod(w // T, C)
        per_mb = {"sp-gather": 6 * N // 2, "sp-scatter": 3 * N // 2, "cp-kv": 8 * (C - 1) * b * n * H // T}
        if st == 0:
            per_mb |= {"vocab-embed-scatter": 2 * N // 2, "vocab-embed-gather": N // 2, "pp-send-act": N // T}
        else:
            per_mb |= {"vocab-head-gather": 2 * N // 2, "vocab-head-scatter": N // 2, "pp-send-grad": N // T}
            per_mb |= {"vocab-ce-max": R, "vocab-ce-sums": 2 * R}
        want = {f"activation/{op}": 2 * elems * 8 for op, elems in per_mb.items()}
        want["model/grad-allreduce"] = ring(dense[st], C, c) * 8
        want["model/expert-grad-allreduce"] = ring(E * EXPERT, C, c) * 8
        want["model/sp-grad-allreduce"] = (4 * H if st == 0 else 6 * H) * 8
        assert {k: v["sent"] for k, v in rank["by_op"].items()} == want, w
