"""Context parallelism with tensor parallelism (--arch gpt --cp C --tp T) on real ranks: equal to serial in
float64, every byte and the activation memory against closed forms written HERE, checkpoints across
layouts, and the refusals.

A rank (cp index c, tp index j) holds n = s/C tokens of each of its b sequences (R = b n rows) and a/T
heads (parallel/context_tensor.py). Per step, per rank, elements, ring collectives (an all-reduce of N
over t ranks sends 2(t-1)/t N, an all-gather of N sends (t-1)/t N):
  cp-kv (ring)        per block: forward 2(C-1) b n h/T + backward 4(C-1) b n h/T (K, V of a/T heads)
  cp-alltoall         per block: 8 (C-1)/C b n h/T (4 all-to-alls forward, 4 backward)
  tp's f and g        per block 2 g + 2 f all-reduces of R h; the vocabulary embedding's forward and the
                      head's backward all-reduce of R h: (4L + 2) 2(T-1)/T R h
  the loss            row maxima all-gathered ((T-1) R) and [sum exp, label logit] all-reduced (2R)
  gradients (model)   this rank's P_T parameters all-reduced over the dp x cp ranks of its tp index:
                      2(p-1)/p P_T with p = dp C (ring chunks of P_T / p, as split_sizes cuts them)
  P_T = V h/T + s h + L (12 h^2/T + 7h/T + 6h) + 2h + V h/T.
Activations kept for b sequences, bytes: 8 n b token ids; per block (4 n h + 12 n h/T + 2 n) b elements
and the scores -- ring: the log-sum-exp a n b/T, Ulysses: P of a/(T C) heads over s x s, a s n b/T;
the head (2 n h + n) b.
"""

from __future__ import annotations

import pytest

from tests.conftest import assert_same_model, split_sizes, train_json
from tests.mpiutil import run_mpi

L, H, A, S, V, B, STEPS = 2, 16, 4, 16, 18, 8, 3
C, T = 2, 2
SHAPE = ["--arch", "gpt", "--n-layers", str(L), "--hidden", str(H), "--heads", str(A)]
SHAPE += ["--seq-len", str(S), "--vocab", str(V), "--dataset", "copy", "--samples", "64"]
ARGS = [*SHAPE, "--batch", str(B), "--steps", str(STEPS), "--dtype", "float64", "--optimizer", "adam"]
ARGS += ["--lr", "0.01", "--kernels", "numpy"]
BPE = 8
P_T = V * H // T + S * H + L * (12 * H * H // T + 7 * H // T + 6 * H) + 2 * H + V * H // T


def allreduce(n: int, t: int) -> int:
    assert n % t == 0  # the shapes here divide: every ring chunk is n/t
    return 2 * (t - 1) * n // t


def cp_per_block(b: int, algo: str) -> int:
    n = S // C
    if algo == "ring":
        return 2 * (C - 1) * b * n * H // T + 4 * (C - 1) * b * n * H // T
    return 8 * (C - 1) * b * n * H // (T * C)


def tp_per_step(b: int) -> int:
    R = b * S // C
    return (4 * L + 2) * allreduce(R * H, T) + (T - 1) * R + allreduce(2 * R, T)


def activations_kept(b: int, algo: str) -> int:
    n = S // C
    scores = A * n * b // T if algo == "ring" else A * S * n * b // T
    block = (4 * n * H + 12 * n * H // T + 2 * n) * b + scores
    return 8 * n * b + (L * block + (2 * n * H + n) * b) * BPE


def grad_sent(g: int, p: int) -> int:
    """A ring all-reduce of P_T elements (one bucket: P_T is far below --bucket-mb) by place g of p."""
    c = split_sizes(P_T, p)
    return 2 * P_T - c[g] - c[(g + 1) % p]


LAYOUTS = [(1, "ring"), (1, "ulysses"), (2, "ring")]  # (dp, algo): 4 or 8 ranks


@pytest.mark.parametrize("dp,algo", LAYOUTS, ids=[f"dp{d}xcp2xtp2-{a}" for d, a in LAYOUTS])
def test_cp_x_tp_equals_serial_with_exact_bytes_and_memory(dp, algo, serial, tmp_path):
    ref = serial(ARGS)
    layout = ["--dp", str(dp), "--cp", str(C), "--tp", str(T), "--cp-algo", algo]
    run = train_json(dp * C * T, [*ARGS, *layout], tmp_path, timeout=240)
    assert_same_model(run, ref, rtol=1e-12)
    assert run["mesh"]["cp"] == C and run["mesh"]["tp"] == T and run["mesh"]["dp"] == dp
    op = "activation/cp-kv" if algo == "ring" else "activation/cp-alltoall"
    b = B // dp
    for w in range(dp * C * T):
        rank = run["comm"]["ranks"][w]
        g, j = divmod(w, T)  # world rank (d C + c) T + j: tp fastest (mesh.py)
        assert rank["coords"]["cp"] == g % C and rank["coords"]["tp"] == j and rank["coords"]["dp"] == g // C
        kv = STEPS * L * cp_per_block(b, algo) * BPE
        assert rank["by_op"][op]["sent"] == kv, (w, rank["by_op"])
        assert rank["sent"]["activation"] == kv + STEPS * tp_per_step(b) * BPE, (w, rank["by_op"])
        assert rank["sent"]["model"] == STEPS * grad_sent(g, dp * C) * BPE
        assert run["memory"]["ranks"][w]["params"] == P_T * BPE
        assert run["memory"]["ranks"][w]["activations_peak"] == activations_kept(b, algo)
    assert run["prediction_mismatches"] == []


def test_checkpoints_move_between_cp_x_tp_and_serial(tmp_path):
    """A cp2 x tp2 checkpoint (full-shape) resumes serially and a serial one under cp2 x tp2: the last steps
    and final weights are those of the uninterrupted run."""
    args = [*SHAPE, "--batch", str(B), "--steps", "4", "--dtype", "float64", "--optimizer", "adam"]
    cptp = ["--cp", str(C), "--tp", str(T)]
    for (n_write, writer), (n_read, reader) in (((4, cptp), (1, [])), ((1, []), (4, cptp))):
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


def test_ulysses_heads_per_tp_rank_are_refused_in_one_line():
    """--heads 2 --tp 2 leaves one head per tp rank: Ulysses cannot give each of 2 cp ranks whole heads."""
    extra = ["--cp", "2", "--tp", "2", "--cp-algo", "ulysses", "--heads", "2", "--vocab", "18"]
    res = run_mpi(4, ["train", "--arch", "gpt", "--steps", "1", "--quiet", *extra], timeout=60)
    assert res.returncode == 2, res.stderr
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("simpar: error: --cp-algo ulysses with --tp 2"), res.stderr
