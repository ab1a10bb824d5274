"""--arch gpt --tp 2 --pp 2 with the zero-bubble schedules (zb-h1, zb-v) on 4 real MPI ranks (8 with
--dp 2): each tp block's and the head's backward split into B (every tp message) and W (local
products, parallel/tensor_gpt_split.py), equal to serial in float64, every byte against closed forms
written HERE, activations_peak against closed forms (and the cost model's prediction).

Shape: L = 2, h = 16, a = 4, s = 8, V = 16, batch 8, M = 4 micro-batches of b = 2 sequences, R = b s
rows. Units: embedding 0, blocks 1 and 2, head 3. zb-h1 cuts two chunks, [0, 1] on stage 0 and
[2, 3] on stage 1 (cut by whole parameter counts as without tp); zb-v cuts four chunks of one unit,
stage 0 holding chunks 0 and 3 (the embedding and the head: the V), stage 1 chunks 1 and 2.
World rank = (stage * dp + d) * 2 + tp index. Per micro-batch a tp rank of t = 2 sends (ring: an all-reduce of
N sends N, an all-gather or reduce-scatter N/2):
  per block       2 g all-reduces + 2 f all-reduces of R h   (--sp: 4 gathers + 4 scatters of R h)
  embedding       1 all-reduce of R h                          (--sp: its scatter and its gather)
  head            1 all-reduce of R h, the loss: (t-1) R maxima and an all-reduce of 2R
                                                               (--sp: its gather and its scatter + loss)
  pipeline        each chunk boundary that changes stage: R h forward, R h backward (--sp: R h / t)
  model (a step)  --sp: the LayerNorm gradients summed over tp, 4h per block, 2h for the head;
                  --dp 2 (8 ranks, b = 1): the stage's shards (embedding V h/t + s h, block 12h^2/t +
                  7h/t + 6h, head 2h + V h/t) in one bucket, a ring all-reduce over the dp pair
B and W together send what the fused backward sends: the split moves no byte.

Activations held at the peak (per sequence: token ids 8 s bytes; a tp block 4 s h + 12 s h/t +
a s^2/t + 2 s elements, under --sp 2 s h + 14 s h/t + a s^2/t + 2 s/t; the head 2 s h + s, under --sp
s h + s h/t + s/t), from each stage's order (Qi et al. 2023: a micro-batch's activations go at its W):
  zb-h1  stage 0: F0 F1 B0 W0 ..  -> 2 micro-batches of [embedding, block 1]
         stage 1: F0 B0 F1 B1 W0 .. -> 2 micro-batches of [block 2, head] (W0 waits after B1)
  zb-v   stage 0: F0.0 F1.0 F2.0 F0.3 B0.3 W0.3 .. -> 3 micro-batches' token ids + 1 head
         stage 1: F0.1 F0.2 F1.1 F1.2 B0.2 .. -> 4 (micro-batch, block) contexts
"""

from __future__ import annotations

import pytest

from tests.conftest import assert_same_model, split_sizes, train_json

L, H, A, S, V, BATCH, M, STEPS, T = 2, 16, 4, 8, 16, 8, 4, 2, 2
SHAPE = ["--arch", "gpt", "--n-layers", str(L), "--hidden", str(H), "--heads", str(A)]
SHAPE += ["--seq-len", str(S), "--vocab", str(V), "--dataset", "copy", "--samples", "64"]
F64 = [*SHAPE, "--batch", str(BATCH), "--steps", str(STEPS), "--optimizer", "adam", "--lr", "0.01"]
F64 += ["--dtype", "float64", "--kernels", "numpy", "--microbatches", str(M)]
BPE = 8
CHUNKS = {  # schedule: [(lo, hi, stage)] in chunk order
    "zb-h1": [(0, 2, 0), (2, 4, 1)],
    "zb-v": [(0, 1, 0), (1, 2, 1), (2, 3, 1), (3, 4, 0)],
}
LAYOUTS = {  # name: (dp, schedule, --sp, --recompute)
    "zb-h1": (1, "zb-h1", False, "none"),
    "zb-v-sp": (1, "zb-v", True, "none"),
    "zb-v-selective": (1, "zb-v", False, "selective"),
    "dp2-zb-h1": (2, "zb-h1", False, "none"),
}
LOCAL = [V * H // T + S * H] + [12 * H * H // T + 7 * H // T + 6 * H] * L + [2 * H + H * V // T]


def rank_sent(schedule: str, stage: int, sp: bool, b: int) -> tuple[int, int, int]:
    """(activation, model, of which "pp-send-act") bytes one rank sends in one step (the docstring),
    before the dp all-reduce; micro-batches of b sequences."""
    chunks, R = CHUNKS[schedule], b * S
    act = pp_act = model = 0
    for c, (lo, hi, st) in enumerate(chunks):
        if st != stage:
            continue
        blocks = sum(1 for u in range(lo, hi) if 1 <= u <= L)
        act += blocks * (8 * (R * H // 2) if sp else 4 * R * H)
        if lo == 0:
            act += 2 * (R * H // 2) if sp else R * H
        if hi == L + 2:
            act += (2 * (R * H // 2) if sp else R * H) + (T - 1) * R + 2 * R
        boundary = R * H // T if sp else R * H
        on = c + 1 < len(chunks) and chunks[c + 1][2] != stage
        back = c > 0 and chunks[c - 1][2] != stage
        act += boundary * (on + back)
        pp_act += boundary * on
        if sp:
            model += sum(4 * H if u <= L else 2 * H for u in range(max(lo, 1), hi))
    return M * act * BPE, model * BPE, M * pp_act * BPE


def peaks(schedule: str, sp: bool, b: int) -> tuple[int, int]:
    """activations_peak of stage 0's and stage 1's ranks in bytes (the docstring's orders), no
    recomputation, micro-batches of b sequences."""
    tokens = 8 * S
    if sp:
        block = (2 * S * H + 14 * S * H // T + A * S * S // T + 2 * S // T) * BPE
        head = (S * H + S * H // T + S // T) * BPE
    else:
        block = (4 * S * H + 12 * S * H // T + A * S * S // T + 2 * S) * BPE
        head = (2 * S * H + S) * BPE
    if schedule == "zb-h1":
        first, last = 2 * b * (tokens + block), 2 * b * (block + head)
    else:
        first, last = b * (3 * tokens + head), 4 * b * block
    return first, last


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_zero_bubble_equals_serial_with_exact_bytes(name, serial, tmp_path):
    ref = serial(F64)
    dp, schedule, sp, recompute = LAYOUTS[name]
    layout = ["--tp", "2", "--pp", "2", "--dp", str(dp), "--schedule", schedule, "--recompute", recompute]
    run = train_json(4 * dp, [*F64, *layout, *(["--sp"] if sp else [])], tmp_path, timeout=240)
    assert_same_model(run, ref, rtol=1e-12)
    b = BATCH // (dp * M)
    for r, rank in enumerate(run["comm"]["ranks"]):
        stage, d = r // (dp * T), r // T % dp
        act, model, pp_act = rank_sent(schedule, stage, sp, b)
        if dp > 1:
            n = sum(sum(LOCAL[lo:hi]) for lo, hi, st in CHUNKS[schedule] if st == stage)
            c = split_sizes(n, dp)
            model += (2 * n - c[d] - c[(d + 1) % dp]) * BPE
        assert rank["sent"]["activation"] == act * STEPS, (name, r)
        assert rank["sent"]["model"] == model * STEPS, (name, r)
        assert rank["by_op"].get("activation/pp-send-act", {}).get("sent", 0) == pp_act * STEPS, (name, r)
    assert run["prediction_mismatches"] == []
    got = [m["activations_peak"] for m in run["memory"]["ranks"]]
    assert got == [m["activations_peak"] for m in run["predicted"]["memory"]["ranks"]]
    if recompute == "none":
        assert got == [peaks(schedule, sp, b)[r // (dp * T)] for r in range(4 * dp)], name
