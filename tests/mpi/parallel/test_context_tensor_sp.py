"""Context parallelism with tensor AND sequence parallelism (--arch gpt --cp C --tp T --sp) on real ranks:
equal to serial in float64, every byte and the activation memory against closed forms written HERE, and
a checkpoint that resumes serially.

A rank (cp index c, tp index j) holds n = s/C tokens of each of its b sequences, R = b n rows, and a/T heads
(parallel/context_tensor.py); --sp cuts those R rows into T contiguous shards of R/T for the LayerNorms
and the residual adds (Korthikanti et al. 2022, sec. 4.2.2), so f and g become all-gathers and
reduce-scatters over tp. Per step, per rank, elements, ring collectives (an all-gather or reduce-scatter
of N over t ranks sends (t-1)/t N, an all-reduce 2(t-1)/t N):
  cp-kv (ring)          per block: forward 2(C-1) b n h/T + backward 4(C-1) b n h/T (K, V of a/T heads)
  cp-alltoall           per block: 8 (C-1)/C b n h/T
  sp-gather, sp-scatter 4L each of R h (two f-bar and two g-bar per block, forward and backward)
  vocab-embed-scatter/gather, vocab-head-gather/scatter: one each of R h
  the loss              row maxima all-gathered ((T-1) R) and [sum exp, label logit] all-reduced (2R)
  gradients (model)     grad-allreduce: this rank's P_T over the dp x cp ranks of its tp index (p = 2:
                        exactly P_T); sp-grad-allreduce: the LayerNorms' 4h per block and LN_f's 2h,
                        all-reduced over tp
  P_T = V h/T + s h + L (12 h^2/T + 7h/T + 6h) + 2h + V h/T.
Activations kept for b sequences, bytes: 8 n b token ids; per block (2 n h + 14 n h/T + 2 n/T) b elements
and the scores -- ring: the log-sum-exp a n b/T, Ulysses: P of a/(T C) heads over s x s, a s n b/T; the
head (n h + n h/T + n/T) b.
"""

from __future__ import annotations

import pytest

from tests.conftest import assert_same_model, train_json

L, H, A, S, V, B, STEPS = 2, 16, 4, 16, 18, 5, 3
C, T = 2, 2
SHAPE = ["--arch", "gpt", "--n-layers", str(L), "--hidden", str(H), "--heads", str(A)]
SHAPE += ["--seq-len", str(S), "--vocab", str(V), "--dataset", "copy", "--samples", "64"]
ARGS = [*SHAPE, "--batch", str(B), "--steps", str(STEPS), "--dtype", "float64", "--optimizer", "adam"]
ARGS += ["--lr", "0.01", "--kernels", "numpy"]
BPE = 8
P_T = V * H // T + S * H + L * (12 * H * H // T + 7 * H // T + 6 * H) + 2 * H + V * H // T
N = S // C  # a cp rank's tokens of each sequence
R = B * N  # its rows per step (one micro-step, dp = 1)
assert (R // T) % N  # an odd B: a tp rank's row shard starts mid-sequence, so its positions must be right


def gather(n: int, t: int) -> int:
    assert n % t == 0  # the shapes here divide: every ring chunk is n/t
    return (t - 1) * n // t


def allreduce(n: int, t: int) -> int:
    return 2 * gather(n, t)


def cp_per_block(algo: str) -> int:
    if algo == "ring":
        return 2 * (C - 1) * B * N * H // T + 4 * (C - 1) * B * N * H // T
    return 8 * (C - 1) * B * N * H // (T * C)


SP_OPS = {  # op: elements one rank sends per step
    "sp-gather": 4 * L * gather(R * H, T),
    "sp-scatter": 4 * L * gather(R * H, T),
    "vocab-embed-scatter": gather(R * H, T),
    "vocab-embed-gather": gather(R * H, T),
    "vocab-head-gather": gather(R * H, T),
    "vocab-head-scatter": gather(R * H, T),
    "vocab-ce-max": (T - 1) * R,
    "vocab-ce-sums": allreduce(2 * R, T),
}


def activations_kept(algo: str) -> int:
    scores = A * N * B // T if algo == "ring" else A * S * N * B // T
    block = (2 * N * H + 14 * N * H // T + 2 * N // T) * B + scores
    return 8 * N * B + (L * block + (N * H + N * H // T + N // T) * B) * BPE


@pytest.mark.parametrize("algo", ["ring", "ulysses"])
def test_cp2xtp2_with_sp_equals_serial_with_exact_bytes_and_memory(algo, serial, tmp_path):
    ref = serial(ARGS)
    layout = ["--cp", str(C), "--tp", str(T), "--sp", "--cp-algo", algo]
    run = train_json(4, [*ARGS, *layout], tmp_path, timeout=240)
    assert_same_model(run, ref, rtol=1e-12)
    cp_op = "activation/cp-kv" if algo == "ring" else "activation/cp-alltoall"
    for w in range(C * T):
        rank = run["comm"]["ranks"][w]
        assert rank["coords"]["cp"] == w // T and rank["coords"]["tp"] == w % T  # tp fastest (mesh.py)
        assert rank["by_op"][cp_op]["sent"] == STEPS * L * cp_per_block(algo) * BPE, (w, rank["by_op"])
        for op, elems in SP_OPS.items():
            assert rank["by_op"][f"activation/{op}"]["sent"] == STEPS * elems * BPE, (w, op, rank["by_op"])
        assert not any(k.startswith("activation/tp-") for k in rank["by_op"])  # f, g are the sp pair
        activation = STEPS * (L * cp_per_block(algo) + sum(SP_OPS.values())) * BPE
        assert rank["sent"]["activation"] == activation, (w, rank["by_op"])
        assert rank["by_op"]["model/grad-allreduce"]["sent"] == STEPS * P_T * BPE
        assert (
            rank["by_op"]["model/sp-grad-allreduce"]["sent"]
            == STEPS * (L * allreduce(4 * H, T) + allreduce(2 * H, T)) * BPE
        )
        assert run["memory"]["ranks"][w]["params"] == P_T * BPE
        assert run["memory"]["ranks"][w]["activations_peak"] == activations_kept(algo)
        assert run["predicted"]["memory"]["ranks"][w]["activations_peak"] == activations_kept(algo)
    assert run["prediction_mismatches"] == []


def test_a_cp_x_tp_x_sp_checkpoint_resumes_serially(tmp_path):
    """Full-shape checkpoints: a cp2 x tp2 --sp run's step-2 checkpoint resumed on one rank gives the
    uninterrupted run's last losses and final weights."""
    args = [*ARGS[: ARGS.index("--steps")], "--steps", "4", *ARGS[ARGS.index("--steps") + 2 :]]
    ckpt = tmp_path / "ckpt"
    every = ["--checkpoint-dir", str(ckpt), "--checkpoint-every", "2"]
    full = train_json(4, [*args, "--cp", str(C), "--tp", str(T), "--sp", *every], tmp_path, "full", 240)
    res = train_json(1, [*args, "--resume", str(ckpt / "step-000002")], tmp_path, "res", 120)
    assert_same_model(res, {"losses": full["losses"][2:], "weights": full["weights"]}, rtol=1e-12)


def test_predict_equals_simulate_with_sp(tmp_path):
    """--clock sim: costmodel/cp_time.py's closed form (sp's Rl = R/T rows outside the tp regions, the
    gather/scatter pairs, the LayerNorm gradients summed over tp in the last micro-step) equals the
    simulated step, on `local` with two micro-steps (the ring: its hops overlap the blocks; Ulysses'
    pricing is sp-independent and test_cp_simclock.py's)."""
    shape = ["--arch", "gpt", "--n-layers", "2", "--hidden", "32", "--heads", "4", "--seq-len", "64"]
    shape += ["--vocab", "16", "--dataset", "copy", "--samples", "32", "--batch", "8", "--steps", "2"]
    layout = ["--cp", str(C), "--tp", str(T), "--sp", "--grad-accum", "2"]
    run = train_json(4, [*shape, *layout, "--clock", "sim", "--hardware", "local"], tmp_path, timeout=240)
    assert run["predicted"]["time"]["step_s"] == pytest.approx(run["time"]["sim"]["step_s"], rel=1e-6)
    assert run["prediction_mismatches"] == []
