"""--zero 2 and 3 with --tp on --arch gpt, on real ranks (parallel/zero_tp.py): dp2 x tp2 (both stages)
and cp2 x tp2 (stage 3) in ONE launch (tests/mpi/scripts/train_each.py): equal to serial in float64,
every rank's ZeRO bytes and model-state memory against closed forms written HERE, predict == simulate
under --clock sim, and a stage-3 checkpoint that stage 2 resumes.

Closed forms (Rajbhandari et al. 2020, sec. 5.2, 5.3 and 7.2, per tp shard). World rank r = g T + j; its
sharding group is the p ranks of its tp index j (dp: p = D; with --cp the dp x cp ranks, p = D C), g its
place there. Its units' tp shares, n_u: embedding
V H/T + S H, block 12 H^2/T + 7 H/T + 6 H (odd for H/T = 5: chunks of 2 ranks differ by one), head
2 H + H V/T. c(n, g) = np.array_split's g-th size of n over p; K = --grad-accum; per step, bpe = 8:
    stage 2  grad-reduce-scatter sum_u n_u - c(n_u, g)      param-all-gather sum_u n_u - c(n_u, g+1)
    stage 3  K x that reduce-scatter                         2K x that all-gather
    (no "grad-allreduce"; over the group: 2(p-1) P_T resp. 3K(p-1) P_T elements, P_T = sum_u n_u)
    memory, S = sum_u c(n_u, g), n_max = max_u n_u: optimizer 2 S (Adam's two moments);
    params P_T (stage 2) or S + n_max (stage 3); grads S + P_T (stage 2, K > 1) or S + n_max (stage 3)
"""

from __future__ import annotations

import json

import numpy as np

from tests.conftest import assert_same_model, split_sizes
from tests.mpiutil import run_script
from tests.paths import MPI_SCRIPTS

L, H, A, S, V, B, STEPS, K, D, T = 2, 10, 2, 8, 16, 8, 2, 2, 2, 2
SHAPE = ["--arch", "gpt", "--n-layers", str(L), "--hidden", str(H), "--heads", str(A)]
SHAPE += ["--seq-len", str(S), "--vocab", str(V), "--dataset", "copy", "--samples", "64"]
ARGS = [*SHAPE, "--batch", str(B), "--steps", str(STEPS), "--dtype", "float64", "--optimizer", "adam"]
ARGS += ["--lr", "0.01", "--kernels", "numpy", "--grad-accum", str(K)]
BPE = 8


def units() -> list[int]:
    return [V * H // T + S * H] + [12 * H * H // T + 7 * H // T + 6 * H] * L + [2 * H + H * V // T]


def c(n: int, p: int, g: int) -> int:
    return split_sizes(n, p)[g % p]


def out_args(tmp_path, name: str) -> list[str]:
    files = ["--metrics-out", str(tmp_path / f"{name}.json"), "--weights-out", str(tmp_path / f"{name}.npz")]
    return ["--quiet", *files]


def load(tmp_path, name: str) -> dict:
    out = json.loads((tmp_path / f"{name}.json").read_text())
    with np.load(tmp_path / f"{name}.npz") as z:
        out["weights"] = [(z[f"W{i}"], z[f"b{i}"]) for i in range(len(z.files) // 2)]
    return out


def check_bytes_and_memory(run: dict, stage: int, steps: int, p: int = D) -> None:
    n_u = units()
    assert any(n % p for n in n_u), "the shape must leave uneven chunks"
    group = {}
    for r in range(p * T):
        g, j = divmod(r, T)
        by_op = run["comm"]["ranks"][r]["by_op"]
        assert "model/grad-allreduce" not in by_op, (r, by_op)
        times = K if stage == 3 else 1
        rs = sum(n - c(n, p, g) for n in n_u) * times * BPE * steps
        ag = sum(n - c(n, p, g + 1) for n in n_u) * times * (2 if stage == 3 else 1) * BPE * steps
        assert by_op["model/grad-reduce-scatter"]["sent"] == rs, r
        assert by_op["model/param-all-gather"]["sent"] == ag, r
        group[j] = group.get(j, 0) + rs + ag
        shard, P_T = sum(c(n, p, g) for n in n_u), sum(n_u)
        want = {
            "params": (P_T if stage == 2 else shard + max(n_u)) * BPE,
            "grads": (shard + (P_T if stage == 2 else max(n_u))) * BPE,
            "optimizer": 2 * shard * BPE,
        }
        mem = run["memory"]["ranks"][r]
        assert {k: mem[k] for k in want} == want, r
    per_step = 2 * (p - 1) * sum(n_u) if stage == 2 else 3 * K * (p - 1) * sum(n_u)
    assert all(sent == per_step * BPE * steps for sent in group.values()), group
    assert run["prediction_mismatches"] == []
    sim, pred = run["time"]["sim"]["step_s"], run["predicted"]["time"]["step_s"]
    assert abs(pred / sim - 1) <= 1e-6, (sim, pred)


def test_zero2_and_zero3_with_tp_equal_serial_with_exact_bytes_and_memory(serial, tmp_path):
    ref = serial(ARGS)
    layout = ["--dp", str(D), "--tp", str(T), "--clock", "sim"]
    ckpt = ["--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "1"]
    three = [*ARGS, *layout, "--zero", "3", "--sp", *ckpt, *out_args(tmp_path, "z3")]
    resume = ["--resume", str(tmp_path / "ckpt" / "step-000001")]
    two = [*ARGS, *layout, "--zero", "2", *resume, *out_args(tmp_path, "z2")]
    cp = [*ARGS, "--cp", "2", "--tp", str(T), "--clock", "sim", "--zero", "3", *out_args(tmp_path, "cp")]
    runs = [*three, "::", *two, "::", *cp]
    res = run_script(D * T, MPI_SCRIPTS / "train_each.py", runs, timeout=240)
    assert res.returncode == 0, f"exit {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    z3, z2 = load(tmp_path, "z3"), load(tmp_path, "z2")
    assert_same_model(z3, ref, rtol=1e-12)
    check_bytes_and_memory(z3, 3, STEPS)
    # stage 2 resumed stage 3's step-1 checkpoint (gathered from chunks, cut again) and ends as serial
    assert_same_model(z2, {"losses": ref["losses"][1:], "weights": ref["weights"]}, rtol=1e-12)
    check_bytes_and_memory(z2, 2, STEPS - 1)
    # cp2 x tp2: the sharding group is the cp pair (dp 1), each cp rank on its tokens
    on_cp = load(tmp_path, "cp")
    assert_same_model(on_cp, ref, rtol=1e-12)
    check_bytes_and_memory(on_cp, 3, STEPS, p=2)
