"""pp x dp x cp x tp on --arch gpt (--cp 2 --tp 2 --pp 2 on 8 real ranks; gpipe, 1f1b with --sp,
interleaved): equal to serial in float64, every byte, the activation memory and (--clock sim) the step
time against closed forms written HERE, and the refusals.

World rank ((stage dp + d) C + c) T + j (mesh.py). The units (embedding, block 1, block 2, head) split by
their whole sizes [(V+s)h, 12h^2+13h, 12h^2+13h, 2h+hV] = [544, 3280, 3280, 320]: gpipe and 1f1b cut two
chunks (embedding + block 1 on stage 0, block 2 + head on stage 1); interleaved with 2 virtual stages
cuts four chunks of one unit, chunk k on stage k mod 2 (stage 0: embedding and block 2, stage 1: block
1 and head), so every chunk boundary crosses stages. A rank (cp c, tp j) holds n = s/C tokens of each
sequence and a/T heads (parallel/pipeline/context_tensor_stage.py). Per micro-batch of b sequences,
R = b n rows, elements, ring collectives (an all-reduce of N over t ranks sends 2(t-1)/t N):
  pp          the boundary rule: per chunk boundary, tp rank j of cp rank c sends its own copy of the
              cp rank's residual stream, b n h, to the same (dp, cp, tp) coordinates on the next stage
              (pp-send-act) and the gradient back (pp-send-grad); --sp: its shard of the rows, b n h/T
  cp-kv       per block: forward 2(C-1) b n h/T + backward 4(C-1) b n h/T
  tp          all-reduces of R h: embedding 1, block 4 (2 g, 2 f), head 1; the loss's all-gather of
              row maxima ((T-1) R) and all-reduce of 2R sums. --sp turns each all-reduce into an
              all-gather and a reduce-scatter, (T-1)/T R h each: the same bytes
  gradients   each chunk's shards all-reduced over the stage's dp x C = 2 ranks of the same tp index:
              a ring of 2 sends P (any split of P in two halves), per step; --sp adds each unit's
              LayerNorm gradients all-reduced over T = 2: 4h a block, 2h the head
  P_T         embedding V h/T + s h, block 12 h^2/T + 7h/T + 6h, head 2h + V h/T.
Activations kept per sequence, bytes: embedding 8 n; block (4 n h + 12 n h/T + 2 n) + the log-sum-exp
a n/T (--sp: 2 n h + 14 n h/T + 2 n/T + a n/T); head 2 n h + n (--sp: n h + n h/T + n/T).
gpipe keeps all M micro-batches alive, 1f1b S - stage; interleaved (Megatron's warm-up of
2(S - stage - 1) + (V-1) S forwards) runs all M V forwards of stage 0 first, and on stage 1 the M of its
first chunk and one of its second.
The same launches run under --clock sim: costmodel/cp_tp_pipeline_time.py's closed form of the step
(never calling the run's code) equals the simulated clock's to 1e-6, on the CPU profile, a GPU node
and nodes of two devices (there the cp ring and the pipeline leave the node); and they write a
checkpoint after step 1 that resumes serially (a serial one resumes under cp x tp x pp: the last test).
"""

from __future__ import annotations

import pytest

from tests.conftest import assert_same_model, train_json
from tests.mpi.runtime.test_gpt_simclock import assert_agrees, hardware_option
from tests.mpiutil import run_mpi

L, H, A, S, V, B, M, STEPS = 2, 16, 4, 16, 18, 4, 2, 2
C, T, PP = 2, 2, 2
SHAPE = ["--arch", "gpt", "--n-layers", str(L), "--hidden", str(H), "--heads", str(A)]
SHAPE += ["--seq-len", str(S), "--vocab", str(V), "--dataset", "copy", "--samples", "64"]
ARGS = [*SHAPE, "--batch", str(B), "--steps", str(STEPS), "--dtype", "float64", "--optimizer", "adam"]
ARGS += ["--lr", "0.01", "--kernels", "numpy"]
LAYOUT = ["--cp", str(C), "--tp", str(T), "--pp", str(PP), "--microbatches", str(M)]
BPE = 8
N = S // C  # a cp rank's tokens of each sequence
b = B // M  # sequences per micro-batch (dp = 1)
R = b * N
EMB, BLOCK, HEAD = V * H // T + S * H, 12 * H * H // T + 7 * H // T + 6 * H, 2 * H + V * H // T
P_UNIT = (EMB, BLOCK, BLOCK, HEAD)
SP_GRAD = (0, 4 * H, 4 * H, 2 * H)  # --sp: LayerNorm gradients all-reduced over T = 2 (sends them once)


def allreduce(n: int, t: int) -> int:
    assert n % t == 0
    return 2 * (t - 1) * n // t


KV = 2 * (C - 1) * b * N * H // T + 4 * (C - 1) * b * N * H // T  # per block and micro-batch
TP_UNIT = tuple(k * allreduce(R * H, T) for k in (1, 4, 4, 1))
LOSS = (T - 1) * R + allreduce(2 * R, T)  # with the head
LSE = A * N // T * BPE  # the ring's log-sum-exp per sequence


def kept(unit: int, sp: bool) -> int:
    """Bytes one sequence keeps in a unit (module docstring)."""
    if unit == 0:
        return 8 * N
    if unit == L + 1:
        return ((N * H + N * H // T + N // T) if sp else (2 * N * H + N)) * BPE
    return (
        (2 * N * H + 14 * N * H // T + 2 * N // T) if sp else (4 * N * H + 12 * N * H // T + 2 * N)
    ) * BPE + LSE


TWO_CHUNKS = [(0, 2), (2, 4)]
FOUR_CHUNKS = [(0, 1), (1, 2), (2, 3), (3, 4)]
CASES = [  # schedule, extra options, hardware, chunks
    ("gpipe", [], "local", TWO_CHUNKS),
    ("1f1b", ["--sp"], "dgx-h100", TWO_CHUNKS),
    ("interleaved", ["--virtual-stages", "2"], "two-per-node", FOUR_CHUNKS),
]


def peak(schedule: str, st: int, chunks: list, sp: bool) -> int:
    """activations_peak of a stage, from the schedule's order (module docstring)."""
    per_seq = [sum(kept(u, sp) for u in range(lo, hi)) for lo, hi in chunks]
    mine = [k for k in range(len(chunks)) if k % PP == st]
    if schedule == "gpipe":
        return M * b * per_seq[st]
    if schedule == "1f1b":
        return (PP - st) * b * per_seq[st]
    first, second = mine
    return M * b * per_seq[first] + (M if st == 0 else 1) * b * per_seq[second]


@pytest.mark.parametrize("schedule, extra, hardware, chunks", CASES)
def test_cp_x_tp_x_pp_equals_serial_with_exact_bytes_memory_and_time(
    schedule, extra, hardware, chunks, serial, tmp_path
):
    ref = serial(ARGS)
    sp, K = "--sp" in extra, len(chunks)
    sim = ["--clock", "sim", "--hardware", hardware_option(tmp_path, hardware)]
    ckpt = ["--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "1"]
    layout = [*LAYOUT, "--schedule", schedule, *extra]
    run = train_json(C * T * PP, [*ARGS, *layout, *sim, *ckpt], tmp_path, timeout=420)
    assert_same_model(run, ref, rtol=1e-12)
    # its step-1 checkpoint is full-shape: it resumes serially into the run's last step and weights
    res = train_json(1, [*ARGS, "--resume", str(tmp_path / "ckpt" / "step-000001")], tmp_path, "res")
    assert_same_model(res, {"losses": run["losses"][1:], "weights": run["weights"]}, rtol=1e-12)
    assert run["predicted"]["stage_units"] == [list(x) for x in chunks]
    stream = b * N * H // T if sp else b * N * H  # the boundary rule's message (--sp: my rows)
    for w in range(C * T * PP):
        rank = run["comm"]["ranks"][w]
        st, c, j = w // (C * T), (w // T) % C, w % T
        assert (rank["coords"]["pp"], rank["coords"]["cp"], rank["coords"]["tp"]) == (st, c, j)
        mine = [k for k in range(K) if k % PP == st]
        units = [u for k in mine for u in range(*chunks[k])]
        acts = sum(1 for k in mine if k < K - 1)  # every chunk boundary crosses stages here
        grads = sum(1 for k in mine if k > 0)
        blocks = sum(1 for u in units if 0 < u <= L)
        tp = sum(TP_UNIT[u] for u in units) + (LOSS if L + 1 in units else 0)
        by_op = rank["by_op"]
        assert by_op.get("activation/pp-send-act", {}).get("sent", 0) == STEPS * M * acts * stream * BPE
        assert by_op.get("activation/pp-send-grad", {}).get("sent", 0) == STEPS * M * grads * stream * BPE
        assert by_op["activation/cp-kv"]["sent"] == STEPS * M * blocks * KV * BPE
        activation = M * ((acts + grads) * stream + blocks * KV + tp)
        assert rank["sent"]["activation"] == STEPS * activation * BPE, (w, by_op)
        P = sum(P_UNIT[u] for u in units)
        model = P + (sum(SP_GRAD[u] for u in units) if sp else 0)
        assert rank["sent"]["model"] == STEPS * model * BPE, (w, by_op)
        assert run["memory"]["ranks"][w]["params"] == P * BPE
        assert run["memory"]["ranks"][w]["activations_peak"] == peak(schedule, st, chunks, sp), w
    assert run["prediction_mismatches"] == []
    assert_agrees(run, (schedule, hardware))  # predict == simulate (cp_tp_pipeline_time.py)


def test_unbuilt_cp_x_tp_x_pp_schedule_is_refused_in_one_line_on_every_rank():
    """The words of every refusal are in tests/unit/config/test_messages.py; here 8 real ranks end."""
    res = run_mpi(8, ["train", *ARGS, *LAYOUT, "--schedule", "zb-h1", "--quiet"], timeout=60)
    assert res.returncode == 2, res.stderr
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    want = "simpar: error: --cp with --tp and --pp runs --schedule gpipe, 1f1b or interleaved without"
    assert len(lines) == 1 and lines[0].startswith(want), res.stderr


def test_a_serial_checkpoint_resumes_under_cp_x_tp_x_pp(tmp_path):
    """The other way round (each case above resumes its own checkpoint serially): a serial step-1
    checkpoint, sliced into cp2 x tp2 x pp2's interleaved --sp chunks and shards (Adam's moments too),
    resumes into the uninterrupted run's last step and final weights."""
    ckpt = tmp_path / "ckpt"
    full = train_json(1, [*ARGS, "--checkpoint-dir", str(ckpt), "--checkpoint-every", "1"], tmp_path, "full")
    layout = [*LAYOUT, "--schedule", "interleaved", "--virtual-stages", "2", "--sp"]
    resume = [*ARGS, *layout, "--resume", str(ckpt / "step-000001")]
    res = train_json(C * T * PP, resume, tmp_path, "res", timeout=420)
    assert_same_model(res, {"losses": full["losses"][1:], "weights": full["weights"]}, rtol=1e-12)
