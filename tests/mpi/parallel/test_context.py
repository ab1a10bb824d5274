"""Context parallelism (--cp C, --arch gpt) on real ranks: every layout equal to serial in float64, its
K/V traffic and its memory against closed forms written here, checkpoints across layouts, refusals.

Closed forms (parallel/context_attention.py derives them), per step, per rank, for one block, with b
the rank's sequences (its dp share of the batch, all of them), n = s/C its tokens of each, h the width,
summed over the L blocks and booked as `activation`:
    ring    (op cp-kv):       forward 2(C-1) b n h  (K and V, C-1 hops)
                              backward 4(C-1) b n h (K and V again C-1 hops, dK and dV C-1 sends)
    Ulysses (op cp-alltoall): forward 4 (C-1)/C b n h (q, k, v in, o back), backward the same
Gradients: one ring all-reduce of P elements over the dp x C ranks, 2(p-1)/p P per rank (p = dp C).
Activations kept: the serial block's 16 s h + a s^2 + 2 s elements per sequence become, for n tokens,
    ring 16 n h + a n + 2 n (the log-sum-exp instead of P)   Ulysses 16 n h + a s n + 2 n (P of a/C heads)
"""

from __future__ import annotations

import pytest

from tests.conftest import assert_same_model, split_sizes, train_json
from tests.mpiutil import run_mpi

L, H, A, S, V, B, STEPS = 2, 16, 4, 16, 17, 8, 3
SHAPE = ["--arch", "gpt", "--n-layers", str(L), "--hidden", str(H), "--heads", str(A)]
SHAPE += ["--seq-len", str(S), "--vocab", str(V), "--dataset", "copy", "--samples", "64"]
ARGS = [*SHAPE, "--batch", str(B), "--steps", str(STEPS), "--dtype", "float64", "--optimizer", "adam"]
ARGS += ["--lr", "0.01", "--kernels", "numpy"]
P = (V + S) * H + L * (12 * H * H + 13 * H) + 2 * H + H * V
BPE = 8


def ring_allreduce_sent(n: int, p: int, r: int) -> int:
    c = split_sizes(n, p)
    return 2 * n - c[r] - c[(r + 1) % p]


def kv_sent_per_block(b: int, C: int, algo: str) -> int:
    """Elements one rank sends for one block in one step, forward + backward (module docstring)."""
    n = S // C
    if algo == "ring":
        return 2 * (C - 1) * b * n * H + 4 * (C - 1) * b * n * H
    return 2 * 4 * (C - 1) * b * n * H // C


def activations_kept(b: int, C: int, algo: str) -> int:
    n = S // C
    block = 16 * n * H + (A * n if algo == "ring" else A * S * n) + 2 * n
    return b * (8 * n + L * block * BPE + (2 * n * H + n) * BPE)


LAYOUTS = [  # (ranks, dp, C, algo)
    (2, 1, 2, "ring"),
    (4, 1, 4, "ring"),
    (4, 2, 2, "ring"),
    (2, 1, 2, "ulysses"),
    (4, 1, 4, "ulysses"),
    (4, 2, 2, "ulysses"),
]


@pytest.mark.parametrize("ranks,dp,C,algo", LAYOUTS, ids=[f"dp{d}xcp{c}-{a}" for _, d, c, a in LAYOUTS])
def test_cp_equals_serial_with_exact_bytes_and_memory(ranks, dp, C, algo, serial, tmp_path):
    ref = serial(ARGS)
    run = train_json(ranks, [*ARGS, "--dp", str(dp), "--cp", str(C), "--cp-algo", algo], tmp_path)
    assert_same_model(run, ref, rtol=1e-12)
    assert run["mesh"]["cp"] == C and run["mesh"]["dp"] == dp
    op = "activation/cp-kv" if algo == "ring" else "activation/cp-alltoall"
    for r in range(ranks):
        d = r // C  # world rank = d C + c (pp = tp = 1)
        b = split_sizes(B, dp)[d]
        rank = run["comm"]["ranks"][r]
        assert rank["coords"]["cp"] == r % C
        kv = STEPS * L * kv_sent_per_block(b, C, algo) * BPE
        assert rank["sent"]["activation"] == kv == rank["by_op"][op]["sent"], (r, rank["by_op"])
        assert rank["sent"]["model"] == STEPS * ring_allreduce_sent(P, dp * C, r) * BPE
        assert run["memory"]["ranks"][r]["activations_peak"] == activations_kept(b, C, algo)
    assert run["prediction_mismatches"] == []


@pytest.mark.parametrize("algo", ["ring", "ulysses"])
def test_mixed_precision_cp_follows_serial_and_books_its_wide_gradient_sums(algo, serial, tmp_path):
    """--precision mixed-bf16 on dp2 x cp2: 2-byte K and V, but the ring's dK, dV partial sums travel in
    float32 (4 bytes: summed over C-1 ranks, not rounded to 16 bits on the way)."""
    args = [*SHAPE, "--batch", str(B), "--steps", "3", "--optimizer", "adam", "--lr", "0.01"]
    args += ["--precision", "mixed-bf16", "--kernels", "numpy"]
    ref = serial(args)
    run = train_json(4, [*args, "--dp", "2", "--cp", "2", "--cp-algo", algo], tmp_path)
    assert max(abs(x - y) / y for x, y in zip(run["losses"], ref["losses"])) < 1e-3
    b, n = B // 2, S // 2
    if algo == "ring":  # K, V forward + backward: 4 (C-1) b n h of 2 bytes; dK, dV 2 (C-1) b n h of 4
        per_block = 4 * b * n * H * 2 + 2 * b * n * H * 4
    else:
        per_block = 8 * b * n * H // 2 * 2
    for r in range(4):
        assert run["comm"]["ranks"][r]["sent"]["activation"] == 3 * L * per_block
    assert run["prediction_mismatches"] == []


def test_checkpoints_move_between_cp_and_serial(tmp_path):
    """A cp2 checkpoint resumes serially and a serial one under cp2: the last steps and final weights
    are those of the uninterrupted run (to float64 rounding: the two layouts add in other orders)."""
    args = [*SHAPE, "--batch", str(B), "--steps", "4", "--dtype", "float64", "--optimizer", "adam"]
    for (n_write, writer), (n_read, reader) in (((2, ["--cp", "2"]), (1, [])), ((1, []), (2, ["--cp", "2"]))):
        ckpt = tmp_path / f"ckpt-{n_write}"
        every = ["--checkpoint-dir", str(ckpt), "--checkpoint-every", "2"]
        full = train_json(n_write, [*args, *writer, *every], tmp_path, f"full{n_write}")
        res = train_json(
            n_read, [*args, *reader, "--resume", str(ckpt / "step-000002")], tmp_path, f"res{n_read}"
        )
        assert_same_model(res, {"losses": full["losses"][2:], "weights": full["weights"]}, rtol=1e-12)


@pytest.mark.parametrize(
    "ranks,extra,message",
    [
        (
            2,
            ["--cp", "2", "--cp-algo", "ulysses", "--heads", "3", "--hidden", "18"],
            "--heads 3 must be divisible by 2",
        ),
        (2, ["--cp", "2", "--seq-len", "6"], "--seq-len 6 must be a multiple of 4"),
        (2, ["--cp", "3"], "world size 2 is not divisible by cp*tp*pp"),
        (4, ["--cp", "2", "--pp", "2", "--zero", "2"], "--zero 2 with --pp: gradient (and parameter)"),
        (1, ["--cp-algo", "ulysses"], "--cp-algo ulysses picks context parallelism's attention: add --cp C"),
    ],
    ids=["ulysses-heads", "seq-chunks", "world", "zero2-pp", "algo-without-cp"],
)
def test_bad_cp_layouts_are_refused_in_one_line(ranks, extra, message):
    res = run_mpi(ranks, ["train", "--arch", "gpt", "--steps", "1", "--quiet", *extra], timeout=60)
    assert res.returncode == 2, res.stderr
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("simpar: error:") and message in lines[0], res.stderr


def test_cp_needs_a_token_sequence():
    res = run_mpi(2, ["train", "--cp", "2", "--steps", "1", "--quiet"], timeout=60)
    assert res.returncode == 2
    assert (
        res.stderr.strip() == "simpar: error: --cp splits a token sequence over ranks: use it with --arch gpt"
    )
