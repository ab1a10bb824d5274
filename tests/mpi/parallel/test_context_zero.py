"""ZeRO over dp x cp (--cp C --zero 1|2|3, --arch gpt) on real ranks: equal to serial in float64, every
rank's bytes and model-state memory against closed forms written here, a checkpoint resuming serially.

Closed forms, per rank g of the p = dp C ranks of the dpcp group (g = world rank = d C + c), per step,
bpe = 8, c(n, g) = np.array_split's g-th size of n over p, units n_l: the embedding (V + S) H, L blocks
of 12 H^2 + 13 H, the head 2 H + H V; P = sum n_l (Rajbhandari et al. 2020, sec. 7):
    stage 1  model: reduce-scatter P - c(P, g) + all-gather P - c(P, g+1)
             memory: params P, grads P, optimizer 2 c(P, g) (Adam: two moments)
    stage 2  model: per unit, reduce-scatter n_l - c(n_l, g) + all-gather n_l - c(n_l, g+1)
             memory: params P, grads S_g + max n_l (S_g = sum c(n_l, g)), optimizer 2 S_g
    stage 3  model: per unit, reduce-scatter n_l - c(n_l, g) + TWO all-gathers n_l - c(n_l, g+1)
             memory: params S_g + max n_l, grads S_g + max n_l, optimizer 2 S_g
    cp-kv (ring, activation), per block: 2(C-1) b n H forward + 4(C-1) b n H backward, n = S/C;
    cp-alltoall (Ulysses), per block: 8 (C-1)/C b n H.
"""

from __future__ import annotations

import pytest

from tests.conftest import assert_same_model, split_sizes, train_json

L, H, A, S, V, B, STEPS = 2, 16, 4, 16, 17, 8, 3
SHAPE = ["--arch", "gpt", "--n-layers", str(L), "--hidden", str(H), "--heads", str(A)]
SHAPE += ["--seq-len", str(S), "--vocab", str(V), "--dataset", "copy", "--samples", "64"]
ARGS = [*SHAPE, "--batch", str(B), "--steps", str(STEPS), "--dtype", "float64", "--optimizer", "adam"]
ARGS += ["--lr", "0.01", "--kernels", "numpy"]
UNITS = [(V + S) * H] + [12 * H * H + 13 * H] * L + [2 * H + H * V]
P = sum(UNITS)
BPE = 8


def c(n: int, p: int, g: int) -> int:
    return split_sizes(n, p)[g % p]


def model_sent(stage: int, p: int, g: int) -> int:
    """Elements rank g sends over dp x cp in one step (module docstring)."""
    if stage == 1:
        return (P - c(P, p, g)) + (P - c(P, p, g + 1))
    gathers = 1 if stage == 2 else 2
    return sum((n - c(n, p, g)) + gathers * (n - c(n, p, g + 1)) for n in UNITS)


def model_memory(stage: int, p: int, g: int) -> dict:
    S_g = sum(c(n, p, g) for n in UNITS)
    if stage == 1:
        return {"params": P * BPE, "grads": P * BPE, "optimizer": 2 * c(P, p, g) * BPE}
    return {
        "params": (P if stage == 2 else S_g + max(UNITS)) * BPE,
        "grads": (S_g + max(UNITS)) * BPE,
        "optimizer": 2 * S_g * BPE,
    }


LAYOUTS = [  # ranks, dp, C, stage, algo
    (2, 1, 2, 1, "ring"),
    (2, 1, 2, 3, "ring"),
    (4, 2, 2, 1, "ring"),
    (4, 2, 2, 2, "ring"),
    (4, 2, 2, 3, "ring"),
    (4, 2, 2, 2, "ulysses"),
]


@pytest.mark.parametrize(
    "ranks,dp,C,stage,algo", LAYOUTS, ids=[f"dp{d}xcp{k}-zero{z}-{a}" for _, d, k, z, a in LAYOUTS]
)
def test_cp_zero_equals_serial_with_exact_bytes_and_memory(ranks, dp, C, stage, algo, serial, tmp_path):
    ref = serial(ARGS)
    layout = ["--dp", str(dp), "--cp", str(C), "--zero", str(stage), "--cp-algo", algo]
    run = train_json(ranks, [*ARGS, *layout], tmp_path)
    assert_same_model(run, ref, rtol=1e-12)
    p, n = dp * C, S // C
    for g in range(ranks):
        b = split_sizes(B, dp)[g // C]
        rank = run["comm"]["ranks"][g]
        assert rank["sent"]["model"] == STEPS * model_sent(stage, p, g) * BPE, (g, rank["by_op"])
        assert "model/grad-allreduce" not in rank["by_op"]
        per_block = 6 * (C - 1) * b * n * H if algo == "ring" else 8 * (C - 1) * b * n * H // C
        op = "activation/cp-kv" if algo == "ring" else "activation/cp-alltoall"
        assert rank["sent"]["activation"] == STEPS * L * per_block * BPE == rank["by_op"][op]["sent"]
        mem = run["memory"]["ranks"][g]
        assert {k: mem[k] for k in ("params", "grads", "optimizer")} == model_memory(stage, p, g), g
    assert run["prediction_mismatches"] == []


@pytest.mark.parametrize("stage", [1, 3])
def test_a_cp_zero_checkpoint_resumes_serially(stage, tmp_path):
    """dp2 x cp2 --zero writes at step 2; a serial run resumes from it and ends where the uninterrupted
    cp --zero run ends (to float64 rounding)."""
    args = [*SHAPE, "--batch", str(B), "--steps", "4", "--dtype", "float64", "--optimizer", "adam"]
    ckpt = tmp_path / "ckpt"
    every = ["--checkpoint-dir", str(ckpt), "--checkpoint-every", "2"]
    full = train_json(4, [*args, "--dp", "2", "--cp", "2", "--zero", str(stage), *every], tmp_path, "full")
    res = train_json(1, [*args, "--resume", str(ckpt / "step-000002")], tmp_path, "res")
    assert_same_model(res, {"losses": full["losses"][2:], "weights": full["weights"]}, rtol=1e-12)
