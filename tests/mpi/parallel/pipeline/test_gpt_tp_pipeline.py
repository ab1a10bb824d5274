"""--arch gpt --tp 2 --pp 2 on 4 real MPI ranks: each stage's units split over its tp pair (Megatron's
split, the vocabulary-parallel embedding on the first stage, the head and the cross-entropy on the
last), equal to serial in float64 with gpipe, 1f1b and interleaved (the zero-bubble schedules:
test_gpt_tp_zero_bubble.py), every byte against closed forms written HERE, activations_peak
predicted, checkpoints moving to and from serial.

Shape: L = 2, h = 16, a = 4, s = 8, V = 16. Stages are cut by WHOLE parameter counts as without tp:
embedding (V + s) h = 384, block 12 h^2 + 13 h = 3280, head 2h + hV = 288, so two stages are
[embedding, block 1] and [block 2, head]; interleaved's four chunks are one unit each.
World rank = stage * 2 + tp index (runtime/mesh.py). Per micro-batch of b sequences, R = b s rows,
a tp rank of t = 2 sends (ring: an all-reduce of N sends 2(t-1)/t N = N, an all-gather or
reduce-scatter (t-1)/t N = N/2):
  tp, per block          2 g all-reduces + 2 f all-reduces of R h              (--sp: 4 + 4 halves)
  embedding (unit 0)     1 all-reduce of R h                                     (--sp: 2 halves)
  head (unit L+1)        1 all-reduce of R h, the loss: (t-1) R maxima, an all-reduce of 2R
                                                                                (--sp: 2 halves + the loss)
  pipeline               each chunk boundary crossed: R h forward, R h backward (--sp: R h / t, the
                         tp rank's own rows, to the same tp rank of the next stage)
  model (once a step)    --sp: the LayerNorm gradients, 4h per block and 2h for the head, over tp;
                         --dp 2: one bucket of the rank's shards (embedding V h/t + s h, block
                         12h^2/t + 7h/t + 6h, head 2h + V h/t) all-reduced over its dp pair
  --recompute full       the backward re-runs the chunk's forward: per block its 2 g all-reduces
                         (--sp: 2 gathers + 2 scatters), the embedding's all-reduce (--sp: its
                         scatter), under --sp the head's gather, once more
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import assert_same_model, split_sizes, train_json

L, H, A, S, V, B, STEPS, T = 2, 16, 4, 8, 16, 8, 2, 2
SHAPE = ["--arch", "gpt", "--n-layers", str(L), "--hidden", str(H), "--heads", str(A)]
SHAPE += ["--seq-len", str(S), "--vocab", str(V), "--dataset", "copy", "--samples", "64"]
ARGS = [*SHAPE, "--batch", str(B), "--steps", str(STEPS), "--optimizer", "adam", "--lr", "0.01"]
F64 = [*ARGS, "--dtype", "float64", "--kernels", "numpy"]
BPE = 8

LAYOUTS = {  # name: (dp, M, schedule options, --sp, --recompute)
    "gpipe": (1, 2, ["--schedule", "gpipe"], False, "none"),
    "1f1b": (1, 4, ["--schedule", "1f1b"], False, "none"),
    "interleaved": (1, 2, ["--schedule", "interleaved", "--virtual-stages", "2"], False, "none"),
    "naive-sp": (1, 8, ["--schedule", "naive"], True, "none"),  # b = 1 < t: a shard cuts a sequence
    "1f1b-sp-full": (1, 2, ["--schedule", "1f1b"], True, "full"),
    "interleaved-full": (1, 2, ["--schedule", "interleaved", "--virtual-stages", "2"], False, "full"),
    "gpipe-selective": (1, 2, ["--schedule", "gpipe"], False, "selective"),
    "dp2-1f1b-sp": (2, 2, ["--schedule", "1f1b"], True, "none"),
}
LOCAL = [V * H // T + S * H] + [12 * H * H // T + 7 * H // T + 6 * H] * L + [2 * H + H * V // T]


def chunks_of(stage: int, C: int) -> list[tuple[int, int]]:
    """(lo, hi) units of each chunk on `stage` (chunk c on stage c mod 2)."""
    bounds = [(0, 2), (2, 4)] if C == 2 else [(u, u + 1) for u in range(4)]
    return [bounds[c] for c in range(stage, C, 2)]


def rank_sent(stage: int, C: int, b: int, M: int, sp: bool, full: bool) -> tuple[int, int, int]:
    """(activation, model, of which "pp-send-act") bytes one rank sends in one step (the docstring)."""
    R = b * S
    act = pp_act = 0
    for lo, hi in chunks_of(stage, C):
        blocks = sum(1 for u in range(lo, hi) if 1 <= u <= L)
        if sp:  # every all-reduce's bytes as a reduce-scatter and an all-gather of N/2 each
            act += blocks * 8 * (R * H // 2) + (2 * (R * H // 2) if lo == 0 else 0)
        else:
            act += blocks * 4 * R * H + (R * H if lo == 0 else 0)
        if full and sp:
            act += (blocks * 4 + (lo == 0) + (hi == L + 2)) * (R * H // 2)
        elif full:
            act += (blocks * 2 + (lo == 0)) * R * H
        if hi == L + 2:
            act += (2 * (R * H // 2) if sp else R * H) + (T - 1) * R + 2 * R
        boundary = R * H // T if sp else R * H
        act += boundary * ((lo > 0) + (hi < L + 2))  # the gradient back, the activation on
        pp_act += boundary * (hi < L + 2)
    model = 0
    if sp:
        model = sum(
            4 * H if u <= L else 2 * H for lo, hi in chunks_of(stage, C) for u in range(max(lo, 1), hi)
        )
    return M * act * BPE, model * BPE, M * pp_act * BPE


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_each_schedule_equals_serial_with_exact_bytes(name, serial, tmp_path):
    ref = serial(F64)
    dp, M, schedule, sp, recompute = LAYOUTS[name]
    layout = ["--tp", "2", "--pp", "2", "--dp", str(dp), "--microbatches", str(M), *schedule]
    layout += ["--recompute", recompute] + (["--sp"] if sp else [])
    run = train_json(4 * dp, [*F64, *layout], tmp_path, timeout=240)
    assert_same_model(run, ref, rtol=1e-12)
    C = 4 if "interleaved" in name else 2
    for r, rank in enumerate(run["comm"]["ranks"]):
        stage, d = r // (dp * T), r // T % dp  # rank = (stage * dp + d) * t + tp index
        act, model, pp_act = rank_sent(stage, C, B // (dp * M), M, sp, recompute == "full")
        if dp > 1:
            n = sum(sum(LOCAL[lo:hi]) for lo, hi in chunks_of(stage, C))
            c = split_sizes(n, dp)
            model += (2 * n - c[d] - c[(d + 1) % dp]) * BPE
        assert rank["sent"]["activation"] == act * STEPS, (name, r)
        assert rank["sent"]["model"] == model * STEPS, (name, r)
        assert rank["by_op"].get("activation/pp-send-act", {}).get("sent", 0) == pp_act * STEPS, (name, r)
    assert run["prediction_mismatches"] == []
    got = [m["activations_peak"] for m in run["memory"]["ranks"]]
    assert got == [m["activations_peak"] for m in run["predicted"]["memory"]["ranks"]]


def test_gpipe_holds_every_micro_batch_of_its_shards(tmp_path):
    """GPipe keeps all M micro-batches' contexts: the stage's B sequences, per sequence the token ids
    (8 s bytes), a tp block's 4 s h + 12 s h/t + a s^2/t + 2 s elements, the head's 2 s h + s."""
    run = train_json(
        4, [*F64, "--tp", "2", "--pp", "2", "--microbatches", "2", "--schedule", "gpipe"], tmp_path
    )
    block = (4 * S * H + 12 * S * H // T + A * S * S // T + 2 * S) * BPE
    first, last = B * (8 * S + block), B * (block + (2 * S * H + S) * BPE)
    assert [m["activations_peak"] for m in run["memory"]["ranks"]] == [first, first, last, last]


def test_checkpoints_move_between_tp_pp_and_serial(serial, tmp_path):
    """tp2xpp2 saves at step 2, serial resumes it; serial's step-2 checkpoint resumes on tp2xpp2:
    both continue the serial run within 1e-12 (the checkpoint holds whole units, resharded on load)."""
    args = [*F64[: F64.index("--steps")], "--steps", "4", *F64[F64.index("--steps") + 2 :]]
    ref = serial(args)
    save = ["--checkpoint-every", "2", "--checkpoint-dir"]
    tppp = ["--tp", "2", "--pp", "2", "--microbatches", "2"]
    first = train_json(4, [*args, *tppp, *save, str(tmp_path / "a")], tmp_path, "a", timeout=240)
    assert_same_model(first, ref, 1e-12)
    on_serial = train_json(1, [*args, "--resume", str(tmp_path / "a" / "step-000002")], tmp_path, "b")
    train_json(1, [*args, *save, str(tmp_path / "c")], tmp_path, "c")
    on_tppp = train_json(4, [*args, *tppp, "--resume", str(tmp_path / "c" / "step-000002")], tmp_path, "d")
    for run in (on_serial, on_tppp):
        assert run["checkpoint"]["start_step"] == 2
        np.testing.assert_allclose(run["losses"], ref["losses"][2:], rtol=1e-12)
        for (W, _), (Wr, _) in zip(run["weights"], ref["weights"]):
            assert W.shape == Wr.shape and np.abs(W - Wr).max() <= 1e-12 * np.abs(Wr).max()
        assert run["prediction_mismatches"] == []
