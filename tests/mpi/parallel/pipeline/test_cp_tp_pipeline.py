"""pp x dp x cp x tp on --arch gpt (--cp 2 --tp 2 --pp 2 on 8 real ranks), every schedule: zb-h1 with
--recompute selective, gpipe with --recompute full, zb-v with --sp and --recompute full, naive with --sp
and --recompute selective, and (the last test, resumed from a serial checkpoint) interleaved with --sp
and --recompute full: equal to serial in float64, every byte, the activation memory and (--clock sim)
the step time against closed forms written HERE.

World rank ((stage dp + d) C + c) T + j (mesh.py). The units (embedding, block 1, block 2, head) split by
their whole sizes [(V+s)h, 12h^2+13h, 12h^2+13h, 2h+hV] = [544, 3280, 3280, 320]: naive, gpipe and zb-h1
cut two chunks (embedding + block 1 on stage 0, block 2 + head on stage 1); interleaved with 2 virtual stages
and zb-v cut four chunks of one unit: interleaved puts chunk k on stage k mod 2 (every chunk boundary
crosses stages), zb-v chunks s and 3-s on stage s (stage 0: embedding and head, stage 1: both blocks, so
the boundary between the blocks stays on stage 1: no message). A rank (cp c, tp j) holds n = s/C tokens
of each sequence and a/T heads (parallel/pipeline/context_tensor_stage.py). Per micro-batch of b
sequences, R = b n rows, elements, ring collectives (an all-reduce of N over t ranks sends 2(t-1)/t N):
  pp          the boundary rule: per chunk boundary between stages, tp rank j of cp rank c sends its own
              copy of the cp rank's residual stream, b n h, to the same (dp, cp, tp) coordinates on the
              next stage (pp-send-act) and the gradient back (pp-send-grad); --sp: its rows, b n h/T
  cp-kv       per block: forward 2(C-1) b n h/T + backward 4(C-1) b n h/T
  tp          all-reduces of R h: embedding 1, block 4 (2 g, 2 f), head 1; the loss's all-gather of
              row maxima ((T-1) R) and all-reduce of 2R sums. --sp turns each all-reduce into an
              all-gather and a reduce-scatter, (T-1)/T R h each: the same bytes
  recompute   before a chunk's backward. selective: each block's ring forward again (its log-sum-exp),
              2(C-1) b n h/T; full: the chunk's forward again -- that and each block's two g
              all-reduces (2 all-reduces of R h), the embedding's all-reduce (--sp: its reduce-scatter,
              (T-1)/T R h), the head's nothing (--sp: its all-gather, (T-1)/T R h)
  zb-h1, zb-v the same bytes: the B pass sends what the backward sent, the W pass nothing new
  gradients   each chunk's shards all-reduced over the stage's dp x C = 2 ranks of the same tp index:
              a ring of 2 sends P (any split of P in two halves), per step; --sp adds each unit's
              LayerNorm gradients all-reduced over T = 2: 4h a block, 2h the head
  P_T         embedding V h/T + s h, block 12 h^2/T + 7h/T + 6h, head 2h + V h/T.
Activations kept per sequence, bytes: embedding 8 n; block (4 n h + 12 n h/T + 2 n) + the log-sum-exp
a n/T (--sp: 2 n h + 14 n h/T + 2 n/T + a n/T); head 2 n h + n (--sp: n h + n h/T + n/T). --recompute
selective keeps a chunk's all but its blocks' log-sum-exps, full its input alone (8 n of token ids on
the first chunk, else n h elements, n h/T under --sp); its backward holds the chunk's whole again.
With k the kept and f the whole bytes of a chunk per sequence (the stage's own chunk st, or chunks a, b):
  naive        b f: one micro-batch at a time (F B F B on every stage)
  gpipe        (M - 1) b k + b f: every forward kept, one rebuilt
  zb-h1        stage 0 b (k + f) (F F B W B W); stage 1 M b f (F B F B, then its W passes)
  zb-v         M b (f_a + f_b): with M = S = 2 every forward and every B pass precede the first W pass
  interleaved  (Megatron's warm-up of 2(S - stage - 1) + (V-1) S forwards) all M V forwards of stage 0
               first, b max(M k_a + k_b + f_b, (M-1) k_a + f_a); on stage 1 the M of its first chunk,
               then F B F B on its second: b max(M k_a + f_b, (M-1) k_a + f_a)
The same launches run under --clock sim: costmodel/cp_tp_pipeline_time.py's closed form of the step
(never calling the run's code) equals the simulated clock's to 1e-6, on the CPU profile, a GPU node
and nodes of two devices (there the cp ring and the pipeline leave the node); and they write a
checkpoint after step 1 that resumes serially (a serial one resumes under cp x tp x pp: the last test).
"""

from __future__ import annotations

import pytest

from tests.conftest import assert_same_model, train_json
from tests.mpi.runtime.test_gpt_simclock import assert_agrees, hardware_option

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


def again(unit: int, mode: str, sp: bool) -> int:
    """Elements a unit sends once more per micro-batch under --recompute `mode` (module docstring)."""
    if mode == "none" or unit == 0 and mode == "selective":
        return 0
    if unit == L + 1:  # the head's forward: nothing without --sp, its all-gather with it
        return (T - 1) * R * H // T if sp and mode == "full" else 0
    kv = 2 * (C - 1) * b * N * H // T if unit > 0 else 0  # the ring's forward hops again
    if mode == "selective":
        return kv
    if unit == 0:  # the embedding's all-reduce, or its reduce-scatter under --sp
        return (T - 1) * R * H // T if sp else allreduce(R * H, T)
    return kv + 2 * allreduce(R * H, T)  # the block's two g all-reduces (--sp: 2 gathers, 2 scatters)


def held(chunk: tuple, mode: str, sp: bool) -> tuple[int, int]:
    """(bytes one sequence keeps from a chunk's forward to its backward, bytes its backward holds)."""
    lo, hi = chunk
    full = sum(kept(u, sp) for u in range(lo, hi))
    if mode == "full":
        return (8 * N if lo == 0 else (N * H // T if sp else N * H) * BPE), full
    blocks = sum(1 for u in range(lo, hi) if 0 < u <= L)
    return (full - blocks * LSE if mode == "selective" else full), full


TWO_CHUNKS = [(0, 2), (2, 4)]
FOUR_CHUNKS = [(0, 1), (1, 2), (2, 3), (3, 4)]
CASES = [  # schedule, extra options, hardware, chunks
    ("zb-h1", ["--recompute", "selective"], "local", TWO_CHUNKS),
    # tp's and dp x cp's all-reduces by Rabenseifner's algorithm (or MPI's own): on 2 ranks the ring's
    # bytes, and under --clock sim ranks that leave each one together (GptChunkCosts._secs)
    ("gpipe", ["--recompute", "full", "--collectives", "rabenseifner"], "dgx-h100", TWO_CHUNKS),
    ("zb-v", ["--sp", "--recompute", "full"], "two-per-node", FOUR_CHUNKS),
    ("naive", ["--sp", "--recompute", "selective", "--collectives", "mpi"], "local", TWO_CHUNKS),
]


def stage_of(schedule: str, k: int) -> int:
    """The stage chunk k runs on: zb-v's V (chunks s and 2S-1-s on stage s), else k mod S."""
    return (k if k < PP else 2 * PP - 1 - k) if schedule == "zb-v" else k % PP


def peak(schedule: str, st: int, chunks: list, sp: bool, mode: str = "none") -> int:
    """activations_peak of a stage, from the schedule's order (module docstring)."""
    kept_, full = zip(*(held(chunk, mode, sp) for chunk in chunks))
    mine = [k for k in range(len(chunks)) if stage_of(schedule, k) == st]
    if schedule == "naive":  # one micro-batch at a time, rebuilt
        return b * full[st]
    if schedule == "gpipe":  # all M forwards kept, one rebuilt
        return (M - 1) * b * kept_[st] + b * full[st]
    if schedule == "zb-h1":  # stage 0: both kept, one rebuilt; stage 1: F B F B, then its W passes
        return b * (kept_[0] + full[0]) if st == 0 else M * b * full[1]
    if schedule == "zb-v":  # every F and every B before the first W a rebuilt chunk frees
        return M * b * sum(full[k] for k in mine)
    a, z = mine  # interleaved: stage 0 F F F F B B B B, stage 1 F F F B F B B B
    second = M * kept_[a] + (kept_[z] if st == 0 else 0) + full[z]  # at its second chunk's first B
    return b * max(second, (M - 1) * kept_[a] + full[a])  # or at its first chunk's first B


def assert_ledger(run: dict, schedule: str, extra: list, chunks: list, steps: int) -> None:
    """Every rank's bytes by op and per category, its parameters and activation peak, against the
    closed forms above, and the cost model's prediction equal to them."""
    sp, K = "--sp" in extra, len(chunks)
    mode = extra[extra.index("--recompute") + 1] if "--recompute" in extra else "none"
    stream = b * N * H // T if sp else b * N * H  # the boundary rule's message (--sp: my rows)
    for w in range(C * T * PP):
        rank = run["comm"]["ranks"][w]
        st, c, j = w // (C * T), (w // T) % C, w % T
        assert (rank["coords"]["pp"], rank["coords"]["cp"], rank["coords"]["tp"]) == (st, c, j)
        mine = [k for k in range(K) if stage_of(schedule, k) == st]
        units = [u for k in mine for u in range(*chunks[k])]
        acts = sum(1 for k in mine if k < K - 1 and stage_of(schedule, k + 1) != st)
        grads = sum(1 for k in mine if k > 0 and stage_of(schedule, k - 1) != st)
        blocks = sum(1 for u in units if 0 < u <= L)
        tp = sum(TP_UNIT[u] for u in units) + (LOSS if L + 1 in units else 0)
        redo = sum(again(u, mode, sp) for u in units)
        by_op = rank["by_op"]
        assert by_op.get("activation/pp-send-act", {}).get("sent", 0) == steps * M * acts * stream * BPE
        assert by_op.get("activation/pp-send-grad", {}).get("sent", 0) == steps * M * grads * stream * BPE
        kv_again = blocks * 2 * (C - 1) * b * N * H // T if mode != "none" else 0
        assert by_op.get("activation/cp-kv", {}).get("sent", 0) == steps * M * (blocks * KV + kv_again) * BPE
        activation = M * ((acts + grads) * stream + blocks * KV + tp + redo)
        assert rank["sent"]["activation"] == steps * activation * BPE, (w, by_op)
        P = sum(P_UNIT[u] for u in units)
        model = P + (sum(SP_GRAD[u] for u in units) if sp else 0)
        assert rank["sent"]["model"] == steps * model * BPE, (w, by_op)
        assert run["memory"]["ranks"][w]["params"] == P * BPE
        want = peak(schedule, st, chunks, sp, mode)
        assert run["memory"]["ranks"][w]["activations_peak"] == want, (w, schedule, mode)
        assert run["predicted"]["memory"]["ranks"][w]["activations_peak"] == want, w
    assert run["prediction_mismatches"] == []


@pytest.mark.parametrize("schedule, extra, hardware, chunks", CASES)
def test_cp_x_tp_x_pp_equals_serial_with_exact_bytes_memory_and_time(
    schedule, extra, hardware, chunks, serial, tmp_path
):
    ref = serial(ARGS)
    sim = ["--clock", "sim", "--hardware", hardware_option(tmp_path, hardware)]
    ckpt = ["--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "1"]
    layout = [*LAYOUT, "--schedule", schedule, *extra]
    run = train_json(C * T * PP, [*ARGS, *layout, *sim, *ckpt], tmp_path, timeout=420)
    assert_same_model(run, ref, rtol=1e-12)
    # its step-1 checkpoint is full-shape: it resumes serially into the run's last step and weights
    res = train_json(1, [*ARGS, "--resume", str(tmp_path / "ckpt" / "step-000001")], tmp_path, "res")
    assert_same_model(res, {"losses": run["losses"][1:], "weights": run["weights"]}, rtol=1e-12)
    assert run["predicted"]["stage_units"] == [list(x) for x in chunks]
    assert_ledger(run, schedule, extra, chunks, STEPS)
    assert_agrees(run, (schedule, hardware))  # predict == simulate (cp_tp_pipeline_time.py)


def test_a_serial_checkpoint_resumes_under_cp_x_tp_x_pp(tmp_path):
    """The other way round (each case above resumes its own checkpoint serially): a serial step-1
    checkpoint, sliced into cp2 x tp2 x pp2's interleaved --sp chunks and shards (Adam's moments too),
    resumes into the uninterrupted run's last step and final weights, with --recompute full; its one
    step's bytes, memory and simulated time as the cases above check theirs."""
    ckpt = tmp_path / "ckpt"
    full = train_json(1, [*ARGS, "--checkpoint-dir", str(ckpt), "--checkpoint-every", "1"], tmp_path, "full")
    extra = ["--virtual-stages", "2", "--sp", "--recompute", "full"]
    sim = ["--clock", "sim", "--hardware", hardware_option(tmp_path, "two-per-node")]
    layout = [*LAYOUT, "--schedule", "interleaved", *extra, *sim]
    resume = [*ARGS, *layout, "--resume", str(ckpt / "step-000001")]
    res = train_json(C * T * PP, resume, tmp_path, "res", timeout=420)
    assert_same_model(res, {"losses": full["losses"][1:], "weights": full["weights"]}, rtol=1e-12)
    assert_ledger(res, "interleaved", extra, FOUR_CHUNKS, STEPS - 1)  # its one step, every byte
    assert_agrees(res, ("interleaved", "two-per-node"))
