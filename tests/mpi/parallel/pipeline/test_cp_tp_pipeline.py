"""pp x dp x cp x tp on --arch gpt (--cp 2 --tp 2 --pp 2 on 8 real ranks): equal to serial in float64,
every byte and the activation memory against closed forms written HERE, and the refusals.

World rank ((stage dp + d) C + c) T + j (mesh.py). The units (embedding, block 1, block 2, head) split by
their whole sizes [(V+s)h, 12h^2+13h, 12h^2+13h, 2h+hV] = [544, 3280, 3280, 320]: stage 0 holds the
embedding and block 1, stage 1 block 2 and the head. A rank (cp c, tp j) holds n = s/C tokens of each
sequence and a/T heads (parallel/pipeline/context_tensor_stage.py). Per micro-batch of b sequences,
R = b n rows, elements, ring collectives (an all-reduce of N over t ranks sends 2(t-1)/t N):
  pp          the boundary rule: tp rank j of cp rank c sends its own copy of the cp rank's residual
              stream, b n h, to the same (dp, cp, tp) coordinates on the next stage (pp-send-act, stage
              0), and receives its gradient back (pp-send-grad, sent by stage 1)
  cp-kv       per block: forward 2(C-1) b n h/T + backward 4(C-1) b n h/T
  tp          stage 0: the embedding's all-reduce + block 1's 2 g and 2 f = 5 all-reduces of R h;
              stage 1: block 2's 4 + the head's backward 1 = 5 all-reduces of R h, and the loss's
              all-gather of row maxima ((T-1) R) and all-reduce of 2R sums
  gradients   each stage's shards all-reduced over its dp x C = 2 ranks of the same tp index: a ring of
              2 sends P (any split of P in two halves), per step
  P_T         embedding V h/T + s h, block 12 h^2/T + 7h/T + 6h, head 2h + V h/T.
Activations kept per sequence, bytes: embedding 8 n; block (4 n h + 12 n h/T + 2 n) + the log-sum-exp
a n/T; head 2 n h + n. 1f1b keeps S - stage micro-batches alive, gpipe all M.
The same launches run under --clock sim: costmodel/cp_tp_pipeline_time.py's closed form of the step
(never calling the run's code) equals the simulated clock's to 1e-6, on the CPU profile and a GPU node.
"""

from __future__ import annotations

import pytest

from tests.conftest import assert_same_model, train_json
from tests.mpi.runtime.test_gpt_simclock import assert_agrees
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
P_STAGE = (EMB + BLOCK, BLOCK + HEAD)


def allreduce(n: int, t: int) -> int:
    assert n % t == 0
    return 2 * (t - 1) * n // t


STREAM = b * N * H  # the boundary rule's message: one cp rank's residual stream, on every tp rank
KV = 2 * (C - 1) * b * N * H // T + 4 * (C - 1) * b * N * H // T
TP = (5 * allreduce(R * H, T), 5 * allreduce(R * H, T) + (T - 1) * R + allreduce(2 * R, T))
ACTIVATION = tuple(M * (STREAM + KV + TP[st]) for st in range(PP))  # per step, elements
KEPT_BLOCK = (4 * N * H + 12 * N * H // T + 2 * N) * BPE + A * N // T * BPE
KEPT = (8 * N + KEPT_BLOCK, KEPT_BLOCK + (2 * N * H + N) * BPE)  # per sequence, bytes


@pytest.mark.parametrize("schedule, hardware", [("gpipe", "local"), ("1f1b", "dgx-h100")])
def test_cp_x_tp_x_pp_equals_serial_with_exact_bytes_memory_and_time(schedule, hardware, serial, tmp_path):
    ref = serial(ARGS)
    sim = ["--clock", "sim", "--hardware", hardware]
    run = train_json(C * T * PP, [*ARGS, *LAYOUT, "--schedule", schedule, *sim], tmp_path, timeout=420)
    assert_same_model(run, ref, rtol=1e-12)
    assert_agrees(run, (schedule, hardware))  # predict == simulate (cp_tp_pipeline_time.py)
    assert run["predicted"]["stage_units"] == [[0, 2], [2, 4]]
    for w in range(C * T * PP):
        rank = run["comm"]["ranks"][w]
        st, c, j = w // (C * T), (w // T) % C, w % T
        assert (rank["coords"]["pp"], rank["coords"]["cp"], rank["coords"]["tp"]) == (st, c, j)
        send = "activation/pp-send-act" if st == 0 else "activation/pp-send-grad"
        assert rank["by_op"][send]["sent"] == STEPS * M * STREAM * BPE, (w, rank["by_op"])
        assert rank["by_op"]["activation/cp-kv"]["sent"] == STEPS * M * KV * BPE
        assert rank["sent"]["activation"] == STEPS * ACTIVATION[st] * BPE, (w, rank["by_op"])
        assert rank["sent"]["model"] == STEPS * P_STAGE[st] * BPE
        assert run["memory"]["ranks"][w]["params"] == P_STAGE[st] * BPE
        alive = M if schedule == "gpipe" else PP - st
        assert run["memory"]["ranks"][w]["activations_peak"] == alive * b * KEPT[st], w
    assert run["prediction_mismatches"] == []


def test_unbuilt_cp_x_tp_x_pp_schedule_is_refused_in_one_line_on_every_rank():
    """The words of every refusal are in tests/unit/config/test_messages.py; here 8 real ranks end."""
    res = run_mpi(8, ["train", *ARGS, *LAYOUT, "--schedule", "zb-h1", "--quiet"], timeout=60)
    assert res.returncode == 2, res.stderr
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    want = "simpar: error: --cp with --tp and --pp runs --schedule gpipe, 1f1b or interleaved without"
    assert len(lines) == 1 and lines[0].startswith(want), res.stderr
