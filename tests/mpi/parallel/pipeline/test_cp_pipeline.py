"""Context parallelism inside pipeline stages (--arch gpt --cp 2 --pp 2, 4 ranks; gpipe, 1f1b, interleaved,
zb-h1, zb-v; --recompute full and selective): equal to serial in float64, every byte and the activation
memory against closed forms written HERE, checkpoints to and from serial.

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
--recompute sends again, per block and step, what the attention's forward sends: full re-runs the chunk's
forward, 2(C-1) B n h (ring) or 4 (C-1)/C B n h (ulysses); selective rebuilds the ring's log-sum-exp by
running the ring again, 2(C-1) B n h, and ulysses' P from its kept q, k, nothing. Selective drops that
softmax part (ulysses: a s n of P a sequence) until the backward rebuilds it: under GPipe the peak is the
B sequences' kept arrays less it, plus it again for the first backward's micro-batch of b = B/M.
--schedule zb-h1 and zb-v split the backward into B and W: the cp traffic is in B, the same bytes. zb-v cuts
4 chunks of one unit, stage 0 holding chunks 0 and 3 ([embedding], [head]: P0 = 864), stage 1 chunks 1 and 2
(the two blocks, P1 = 6560, passed on in memory): each stage sends one activation and one gradient, and
only stage 1 has blocks (twice the cp traffic; stage 0 none).
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


def cp_per_block(algo: str, recompute: str = "none") -> int:
    if algo == "ring":
        again = 2 * (C - 1) * B * N * H if recompute != "none" else 0
        return 2 * (C - 1) * B * N * H + 4 * (C - 1) * B * N * H + again
    again = 4 * (C - 1) * B * N * H // C if recompute == "full" else 0
    return 8 * (C - 1) * B * N * H // C + again


def kept_per_sequence(stage: int, algo: str) -> int:
    block = (16 * N * H + 2 * N + (A * N if algo == "ring" else A * S * N)) * BPE
    return block + (8 * N if stage == 0 else (2 * N * H + N) * BPE)


LAYOUTS = [
    ("gpipe", "ring", "none"),
    ("1f1b", "ring", "full"),
    ("gpipe", "ulysses", "selective"),
    ("interleaved", "ring", "selective"),
    ("zb-h1", "ring", "none"),
    ("zb-v", "ulysses", "full"),
]
# (activations, gradients) sent by stage 0, 1; else one way each
SENDS = {"interleaved": [(2, 1), (1, 2)], "zb-v": [(1, 1), (1, 1)]}
ZB_V_P = [(V + S) * H + 2 * H + V * H, 2 * (12 * H * H + 13 * H)]


@pytest.mark.parametrize(
    "schedule,algo,recompute", LAYOUTS, ids=[f"cp2xpp2-{s}-{a}-{r}" for s, a, r in LAYOUTS]
)
def test_cp_x_pp_equals_serial_with_exact_bytes(schedule, algo, recompute, serial, tmp_path):
    ref = serial(ARGS)
    layout = ["--cp", str(C), "--pp", "2", "--schedule", schedule, "--cp-algo", algo]
    layout += ["--recompute", recompute]
    layout += ["--virtual-stages", "2"] if schedule == "interleaved" else []
    stage_p = ZB_V_P if schedule == "zb-v" else STAGE_P
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
        blocks = (0, 2)[stage] if schedule == "zb-v" else 1  # zb-v: both blocks on stage 1
        cp_sent = STEPS * blocks * cp_per_block(algo, recompute) * BPE
        assert rank["by_op"].get(op, {}).get("sent", 0) == cp_sent, (w, rank["by_op"])
        assert rank["sent"]["activation"] == (acts + grads) * boundary + cp_sent
        assert rank["sent"]["model"] == STEPS * grad_sent(stage_p[stage], c) * BPE  # even P: every chunk too
        memory = run["memory"]["ranks"][w]
        assert memory["params"] == stage_p[stage] * BPE
        if schedule == "gpipe":  # selective (ulysses): the block's P dropped, rebuilt for one micro-batch
            dropped = A * S * N * BPE if recompute == "selective" else 0
            assert memory["activations_peak"] == B * kept_per_sequence(stage, algo) - (B - B // M) * dropped
        assert memory["activations_peak"] == run["predicted"]["memory"]["ranks"][w]["activations_peak"]
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
