"""Context parallelism inside pipeline stages (--arch gpt --cp 2 --pp 2, 4 ranks; gpipe, 1f1b, interleaved):
equal to serial in float64, every byte and the activation memory against closed forms written HERE,
checkpoints to and from serial.

World rank = stage * C + c (mesh.py: pp outermost, dp = 1). The stages are gpt_pipeline's split of the units
by parameters: with L = 2, h = 16, s = 16, V = 18 the embedding (V + s) h = 544, a block 12 h^2 + 13 h = 3280,
the head 2h + V h = 320, so stage 0 is [embedding, block 1] (P0 = 3824) and stage 1 [block 2, head]
(P1 = 3600).
Cp rank c holds n = s/C = 8 tokens of each sequence (context_stage.py). Per step, per rank, elements (b summed
over the M micro-batches is the batch B; one block per stage):
  pp-send-act    stage 0: B n h (each micro-batch's b n h: the cp rank's own residual stream)
  pp-send-grad   stage 1: B n h
  cp-kv (ring)   2(C-1) B n h forward + 4(C-1) B n h backward;  cp-alltoall (ulysses): 8 (C-1)/C B n h
  gradients      the stage's P all-reduced (ring) over its C cp ranks: 2 P - chunk[c] - chunk[c+1]
Activations kept per sequence, bytes: the embedding 8 n (int64 ids); a block (16 n h + 2 n) + scores
(ring: the log-sum-exp a n; ulysses: P of a/C heads over s x s, a s n) elements; the head (2 n h + n).
GPipe holds all M micro-batches of a stage at once: B sequences' worth.
--schedule interleaved --virtual-stages 2 cuts 4 chunks of one unit each, chunk k on stage k mod 2: stage 0
holds [embedding] and [block 2], stage 1 [block 1] and [head] (the same P0, P1 and one block a stage), so
stage 0 sends 2 activations (chunks 0 and 2 on) and 1 gradient (chunk 2 back), stage 1 1 and 2, each
B n h per step; each chunk's gradients are all-reduced alone (with C = 2 a ring all-reduce of P sends P).
"""

from __future__ import annotations

import pytest

from tests.conftest import assert_same_model, split_sizes, train_json

L, H, A, S, V, B, M, STEPS = 2, 16, 4, 16, 18, 8, 2, 2
C, N = 2, 16 // 2
SHAPE = ["--arch", "gpt", "--n-layers", str(L), "--hidden", str(H), "--heads", str(A)]
SHAPE += ["--seq-len", str(S), "--vocab", str(V), "--dataset", "copy", "--samples", "64"]
ARGS = [*SHAPE, "--batch", str(B), "--steps", str(STEPS), "--dtype", "float64", "--optimizer", "adam"]
ARGS += ["--lr", "0.01", "--kernels", "numpy", "--microbatches", str(M)]
BPE = 8
STAGE_P = [(V + S) * H + 12 * H * H + 13 * H, 12 * H * H + 13 * H + 2 * H + V * H]


def grad_sent(P: int, c: int) -> int:
    chunks = split_sizes(P, C)
    return 2 * P - chunks[c] - chunks[(c + 1) % C]


def cp_per_block(algo: str) -> int:
    if algo == "ring":
        return 2 * (C - 1) * B * N * H + 4 * (C - 1) * B * N * H
    return 8 * (C - 1) * B * N * H // C


def kept_per_sequence(stage: int, algo: str) -> int:
    block = (16 * N * H + 2 * N + (A * N if algo == "ring" else A * S * N)) * BPE
    return block + (8 * N if stage == 0 else (2 * N * H + N) * BPE)


LAYOUTS = [("gpipe", "ring"), ("1f1b", "ring"), ("gpipe", "ulysses"), ("interleaved", "ring")]
SENDS = {"interleaved": [(2, 1), (1, 2)]}  # (activations, gradients) sent by stage 0, 1; else one way each


@pytest.mark.parametrize("schedule,algo", LAYOUTS, ids=[f"cp2xpp2-{s}-{a}" for s, a in LAYOUTS])
def test_cp_x_pp_equals_serial_with_exact_bytes(schedule, algo, serial, tmp_path):
    ref = serial(ARGS)
    layout = ["--cp", str(C), "--pp", "2", "--schedule", schedule, "--cp-algo", algo]
    layout += ["--virtual-stages", "2"] if schedule == "interleaved" else []
    run = train_json(4, [*ARGS, *layout], tmp_path, timeout=240)
    assert_same_model(run, ref, rtol=1e-12)
    assert run["mesh"]["cp"] == C and run["mesh"]["pp"] == 2
    op = "activation/cp-kv" if algo == "ring" else "activation/cp-alltoall"
    for w in range(4):
        rank, (stage, c) = run["comm"]["ranks"][w], divmod(w, C)
        assert rank["coords"]["pp"] == stage and rank["coords"]["cp"] == c
        boundary = STEPS * B * N * H * BPE
        acts, grads = SENDS.get(schedule, [(1, 0), (0, 1)])[stage]
        sent = {
            op: rank["by_op"].get(f"activation/{op}", {}).get("sent", 0)
            for op in ("pp-send-act", "pp-send-grad")
        }
        assert sent == {"pp-send-act": acts * boundary, "pp-send-grad": grads * boundary}, (w, rank["by_op"])
        assert rank["by_op"][op]["sent"] == STEPS * cp_per_block(algo) * BPE, (w, rank["by_op"])
        assert rank["sent"]["activation"] == (acts + grads) * boundary + STEPS * cp_per_block(algo) * BPE
        assert rank["sent"]["model"] == STEPS * grad_sent(STAGE_P[stage], c) * BPE  # even P: interleaved too
        assert run["memory"]["ranks"][w]["params"] == STAGE_P[stage] * BPE
        if schedule == "gpipe":
            assert run["memory"]["ranks"][w]["activations_peak"] == B * kept_per_sequence(stage, algo)
    assert run["prediction_mismatches"] == []


def test_cp_x_pp_checkpoints_resume_serially_and_back(tmp_path):
    """A cp2 x pp2 checkpoint (full-shape) resumes serially and a serial one under cp2 x pp2: the last steps
    and final weights are those of the uninterrupted run."""
    args = [*ARGS[: ARGS.index("--steps")], "--steps", "4", *ARGS[ARGS.index("--steps") + 2 :]]
    cppp = ["--cp", str(C), "--pp", "2"]
    for (n_write, writer), (n_read, reader) in (((4, cppp), (1, [])), ((1, []), (4, cppp))):
        ckpt = tmp_path / f"ckpt-{n_write}"
        every = ["--checkpoint-dir", str(ckpt), "--checkpoint-every", "2"]
        full = train_json(n_write, [*args, *writer, *every], tmp_path, f"full{n_write}", timeout=240)
        res = train_json(
            n_read,
            [*args, *reader, "--resume", str(ckpt / "step-000002")],
            tmp_path,
            f"res{n_read}",
            timeout=240,
        )
        assert_same_model(res, {"losses": full["losses"][2:], "weights": full["weights"]}, rtol=1e-12)
