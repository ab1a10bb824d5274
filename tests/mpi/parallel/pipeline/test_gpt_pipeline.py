"""--arch gpt on pipeline stages (real MPI ranks): every schedule built for it equals the serial run in
float64, the pipeline moves exactly the closed form below, activations_peak is the predicted one,
half precision matches serial at the same precision, and checkpoints move between pp, dp and ZeRO.

The stages are runs of units (embedding, L blocks, head: model/gpt.py) balanced by parameters. Here
L = 2, h = 16, s = 8, V = 17: embedding (V + s) h = 400, blocks 12 h^2 + 13 h = 3280, head 2h + hV
= 304; two stages are [embedding, block 1] (3680) and [block 2, head] (3584), four are one unit each.
The boundary between two stages carries the residual stream of b sequences, (b s, h): per boundary
and micro-batch b s h elements forward and b s h backward (Narayanan et al. 2021, sec. 2.2).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import assert_same_model, split_sizes, train_json

L, H, A, S, V, B, STEPS = 2, 16, 2, 8, 17, 8, 3
SHAPE = ["--arch", "gpt", "--n-layers", str(L), "--hidden", str(H), "--heads", str(A)]
SHAPE += ["--seq-len", str(S), "--vocab", str(V), "--dataset", "copy", "--samples", "64"]
ARGS = [*SHAPE, "--batch", str(B), "--steps", str(STEPS), "--optimizer", "adam", "--lr", "0.01"]
F64 = [*ARGS, "--dtype", "float64", "--kernels", "numpy"]
UNITS = [(V + S) * H] + [12 * H * H + 13 * H] * L + [2 * H + H * V]


def boundaries_sent(stage: int, n_stages: int, chunks: int, zb_v: bool = False) -> tuple[int, int]:
    """(activation sends, gradient sends) of one rank per micro-batch: chunk c on stage c mod S sends
    its output on unless it is the last chunk, and its input gradient back unless it is the first.
    zb-v: 2S chunks, rank s holds s and 2S-1-s; chunks S-1 and S share the last rank (no message)."""
    if zb_v:
        where = lambda c: min(c, 2 * n_stages - 1 - c)  # noqa: E731
        mine = (stage, 2 * n_stages - 1 - stage)
        C = 2 * n_stages
        acts = sum(c < C - 1 and where(c + 1) != stage for c in mine)
        return acts, sum(c > 0 and where(c - 1) != stage for c in mine)
    mine = range(stage, chunks, n_stages)
    return sum(c < chunks - 1 for c in mine), sum(c > 0 for c in mine)


def check_pipeline_bytes(
    run: dict, pp: int, dp: int = 1, chunks=None, bpe: int = 8, zb_v: bool = False
) -> None:
    chunks = chunks or pp
    rows = B // dp  # sequences per step on each dp rank, all its micro-batches together
    for r in run["comm"]["ranks"]:
        acts, grads = boundaries_sent(r["coords"]["pp"], pp, chunks, zb_v)
        per_boundary = STEPS * rows * S * H * bpe  # b s h per micro-batch, summed over micro-batches
        assert r["by_op"].get("activation/pp-send-act", {}).get("sent", 0) == acts * per_boundary
        assert r["by_op"].get("activation/pp-send-grad", {}).get("sent", 0) == grads * per_boundary
        assert r["sent"]["activation"] == (acts + grads) * per_boundary
    assert run["prediction_mismatches"] == []
    got = [m["activations_peak"] for m in run["memory"]["ranks"]]
    assert got == [m["activations_peak"] for m in run["predicted"]["memory"]["ranks"]]


LAYOUTS = {
    "pp2-naive": (2, ["--pp", "2", "--microbatches", "2", "--schedule", "naive"]),
    "pp2-gpipe": (2, ["--pp", "2", "--microbatches", "4", "--schedule", "gpipe"]),
    "pp2-1f1b": (2, ["--pp", "2", "--microbatches", "4", "--schedule", "1f1b"]),
    "pp2-interleaved": (
        2,
        ["--pp", "2", "--microbatches", "2", "--schedule", "interleaved", "--virtual-stages", "2"],
    ),
    "pp2-zb-h1": (2, ["--pp", "2", "--microbatches", "4", "--schedule", "zb-h1"]),
    "pp2-zb-v": (2, ["--pp", "2", "--microbatches", "2", "--schedule", "zb-v"]),
    "pp4-1f1b": (4, ["--pp", "4", "--microbatches", "4", "--schedule", "1f1b"]),
    "dp2xpp2": (4, ["--dp", "2", "--pp", "2", "--microbatches", "2"]),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_each_schedule_equals_serial_with_exact_pipeline_bytes(name, serial, tmp_path):
    ref = serial(F64)
    n, layout = LAYOUTS[name]
    run = train_json(n, [*F64, *layout], tmp_path, timeout=240)
    assert_same_model(run, ref, rtol=1e-12)
    opt = dict(zip(layout[::2], layout[1::2]))
    pp, dp = int(opt["--pp"]), int(opt.get("--dp", 1))
    zb_v = opt.get("--schedule") == "zb-v"  # 2S chunks in a V: rank s holds s and 2S-1-s
    check_pipeline_bytes(run, pp, dp, pp * int(opt.get("--virtual-stages", 1)), zb_v=zb_v)
    if dp > 1:  # each stage all-reduces its own units' gradients over its dp pair (one bucket)
        for r in run["comm"]["ranks"]:
            n_stage = sum(UNITS[:2]) if r["coords"]["pp"] == 0 else sum(UNITS[2:])
            c = split_sizes(n_stage, dp)
            d = r["coords"]["dp"]
            assert r["sent"]["model"] == (2 * n_stage - c[d] - c[(d + 1) % dp]) * 8 * STEPS


def test_gpipe_holds_every_micro_batch_of_its_units(serial, tmp_path):
    """GPipe keeps all M micro-batches' contexts until the backwards: the stage's whole batch of B
    sequences, per sequence the embedding's 8 s bytes of token ids, a block's 16 s h + a s^2 + 2 s
    elements, the head's 2 s h + s (model/gpt.py, attention.py)."""
    run = train_json(2, [*F64, *LAYOUTS["pp2-gpipe"][1]], tmp_path, timeout=240)
    block = (16 * S * H + A * S * S + 2 * S) * 8
    first, last = B * (8 * S + block), B * (block + (2 * S * H + S) * 8)
    assert [m["activations_peak"] for m in run["memory"]["ranks"]] == [first, last]


@pytest.mark.parametrize("precision,tol", [("mixed-bf16", 16 * 2.0**-8), ("mixed-fp16", 16 * 2.0**-11)])
def test_half_precision_pipeline_equals_serial_at_that_precision(precision, tol, serial, tmp_path):
    """2-byte messages between the stages (b s h x 2 bytes each way), the softmax in float32
    (attention.py), the overflow vote over the stages; the same model as serial at that precision.
    The 2 micro-batches add their half gradients (+=) as serial --grad-accum 2 does over the same
    4-sequence parts (one float32 matmul rounded once would differ by half's rounding)."""
    half = [*ARGS, "--precision", precision, "--kernels", "numpy"]
    ref = serial([*half, "--grad-accum", "2"])
    run = train_json(2, [*half, "--pp", "2", "--microbatches", "2"], tmp_path, timeout=240)
    assert run["precision"]["skipped_at"] == ref["precision"]["skipped_at"]
    assert_same_model(run, ref, rtol=tol)
    check_pipeline_bytes(run, 2, bpe=2)


def test_checkpoints_move_between_pp_dp_and_zero(serial, tmp_path):
    """pp2 (1f1b) saves at step 2; dp2 resumes it and saves at step 4; ZeRO-3 resumes that. Each
    continues the serial run bit for bit where the arithmetic is the same (dp2 from pp2: same
    float64 sums within 1e-12), and the full-shape checkpoint has one flat vector per unit."""
    args = [*F64[: F64.index("--steps")], "--steps", "6", *F64[F64.index("--steps") + 2 :]]
    ref = serial(args)
    save = ["--checkpoint-every", "2", "--checkpoint-dir"]
    first = train_json(
        2, [*args, "--pp", "2", "--microbatches", "2", *save, str(tmp_path / "a")], tmp_path, "a"
    )
    assert_same_model(first, ref, 1e-12)
    resume = ["--resume", str(tmp_path / "a" / "step-000002")]
    second = train_json(2, [*args, "--dp", "2", *resume, *save, str(tmp_path / "b")], tmp_path, "b")
    resume = ["--resume", str(tmp_path / "b" / "step-000004")]
    third = train_json(2, [*args, "--zero", "3", *resume], tmp_path, "c")
    for run, start in ((second, 2), (third, 4)):
        assert run["checkpoint"]["start_step"] == start
        np.testing.assert_allclose(run["losses"], ref["losses"][start:], rtol=1e-12)
        for (W, _), (Wr, _) in zip(run["weights"], ref["weights"]):
            assert W.shape == Wr.shape and np.abs(W - Wr).max() <= 1e-12 * np.abs(Wr).max()
        assert run["prediction_mismatches"] == []
    # and back: dp2's own run resumed on pp2 continues it exactly (same step, same bytes)
    dp_full = train_json(2, [*args, "--dp", "2", *save, str(tmp_path / "d")], tmp_path, "d")
    back = train_json(
        2,
        [*args, "--pp", "2", "--microbatches", "2", "--resume", str(tmp_path / "d" / "step-000004")],
        tmp_path,
        "e",
    )
    np.testing.assert_allclose(back["losses"], dp_full["losses"][4:], rtol=1e-12)


def test_stages_are_balanced_by_parameters_not_by_unit_count(serial, tmp_path):
    """With V = 300 the embedding ((V + s) h = 4928) and the head (2h + hV = 4832) outweigh a block
    (3280): three stages by parameters are [embedding] [block 1, block 2] [head] (largest 6560),
    not [embedding] [block 1] [block 2, head] (8112) as counting units would cut them."""
    args = [*F64, "--vocab", "300"]
    ref = serial(args)
    run = train_json(3, [*args, "--pp", "3", "--microbatches", "2"], tmp_path, timeout=240)
    assert_same_model(run, ref, rtol=1e-12)
    emb, block, head = (300 + S) * H, 12 * H * H + 13 * H, 2 * H + H * 300
    assert [m["params"] for m in run["memory"]["ranks"]] == [8 * emb, 8 * 2 * block, 8 * head]
    check_pipeline_bytes(run, 3)
