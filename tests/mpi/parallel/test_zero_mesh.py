"""--zero 1 with --tp and --pp (and --cp) on --arch gpt, on real ranks (parallel/zero_mesh.py): equal to
serial in float64, every rank's ZeRO bytes and model-state memory against closed forms written HERE,
predict == simulate under --clock sim, and checkpoints that reshard to serial and back.

Closed forms (Rajbhandari et al. 2020, sec. 5.1 and 7.2.1, per model shard). World rank
r = ((st D + d) C + c) T + j; its sharding group is the p = D C ranks of its stage and tp index, g =
d C + c its place there. Its stores: one flat vector per model chunk it runs, n = the sum of its tp
shares of the chunk's units -- embedding V H/T + S H, block 12 H^2/T + 7 H/T + 6 H, head 2 H + H V/T.
With c(n, g) = np.array_split's g-th size of n over p, per step, bpe = 8:
    grad-reduce-scatter  sum_stores n - c(n, g)        param-all-gather  sum_stores n - c(n, g+1)
    (over the group: 2(p-1) P_shard exactly, P_shard = sum_stores n; no "grad-allreduce")
    memory: params = grads = P_shard, optimizer 2 sum_stores c(n, g) (Adam's two moments)
"""

from __future__ import annotations

import pytest

from tests.conftest import assert_same_model, split_sizes, train_json

L, H, A, S, V, B, STEPS = 2, 16, 4, 8, 16, 8, 2
SHAPE = ["--arch", "gpt", "--n-layers", str(L), "--hidden", str(H), "--heads", str(A)]
SHAPE += ["--seq-len", str(S), "--vocab", str(V), "--dataset", "copy", "--samples", "64"]
ARGS = [*SHAPE, "--batch", str(B), "--steps", str(STEPS), "--dtype", "float64", "--optimizer", "adam"]
ARGS += ["--lr", "0.01", "--kernels", "numpy"]
BPE = 8


def units(T: int) -> list[int]:
    return [V * H // T + S * H] + [12 * H * H // T + 7 * H // T + 6 * H] * L + [2 * H + H * V // T]


def c(n: int, p: int, g: int) -> int:
    return split_sizes(n, p)[g % p]


# ranks, (pp, dp, cp, tp), the chunks' unit ranges per stage (--stage-layers), extra options
LAYOUTS = {
    "dp2xtp2-sp-accum2": (4, (1, 2, 1, 2), [[(0, 4)]], ["--sp", "--grad-accum", "2"]),
    "dp2xpp2-interleaved": (
        4,
        (2, 2, 1, 1),
        [[(0, 1), (2, 3)], [(1, 2), (3, 4)]],  # chunk k on stage k mod 2, one unit each
        [
            "--schedule",
            "interleaved",
            "--virtual-stages",
            "2",
            "--microbatches",
            "2",
            "--stage-layers",
            "1,1,1,1",
        ],
    ),
    "cp2xtp2xpp2": (8, (2, 1, 2, 2), [[(0, 2)], [(2, 4)]], ["--stage-layers", "2,2"]),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_zero1_in_a_model_parallel_mesh_equals_serial_with_exact_bytes(name, serial, tmp_path):
    ranks, (Sp, D, C, T), chunks, extra = LAYOUTS[name]
    ref = serial(ARGS)
    layout = ["--pp", str(Sp), "--dp", str(D), "--cp", str(C), "--tp", str(T), "--zero", "1", *extra]
    ckpt = ["--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "1"]
    run = train_json(ranks, [*ARGS, *layout, *ckpt, "--clock", "sim"], tmp_path, "run", timeout=240)
    assert_same_model(run, ref, rtol=1e-12)
    p, local = D * C, units(T)
    group_sent = {}
    for r in range(ranks):
        rest, j = divmod(r, T)
        rest, cp = divmod(rest, C)
        st, d = divmod(rest, D)
        g = d * C + cp
        stores = [sum(local[lo:hi]) for lo, hi in chunks[st]]
        by_op = run["comm"]["ranks"][r]["by_op"]
        assert "model/grad-allreduce" not in by_op, (r, by_op)
        rs = sum(n - c(n, p, g) for n in stores) * BPE * STEPS
        ag = sum(n - c(n, p, g + 1) for n in stores) * BPE * STEPS
        assert by_op["model/grad-reduce-scatter"]["sent"] == rs, r
        assert by_op["model/param-all-gather"]["sent"] == ag, r
        group_sent[(st, j)] = group_sent.get((st, j), 0) + rs + ag
        mem = run["memory"]["ranks"][r]
        P_shard = sum(stores)
        want = {
            "params": P_shard * BPE,
            "grads": P_shard * BPE,
            "optimizer": 2 * sum(c(n, p, g) for n in stores) * BPE,
        }
        assert {k: mem[k] for k in want} == want, r
    for (st, _), sent in group_sent.items():  # the ring's total: 2(p-1) P_shard elements per step
        assert sent == 2 * (p - 1) * sum(sum(local[lo:hi]) for lo, hi in chunks[st]) * BPE * STEPS
    assert run["prediction_mismatches"] == []
    sim, pred = run["time"]["sim"]["step_s"], run["predicted"]["time"]["step_s"]
    assert abs(pred / sim - 1) <= 1e-6, (sim, pred)
    # the step-1 checkpoint resumes serially and ends where this run ended
    res = train_json(1, [*ARGS, "--resume", str(tmp_path / "ckpt" / "step-000001")], tmp_path, "res")
    assert_same_model(res, {"losses": run["losses"][1:], "weights": run["weights"]}, rtol=1e-12)


def test_a_serial_checkpoint_resumes_in_zero1_x_tp_and_x_pp(tmp_path):
    """Serial writes step 1; dp2 x tp2 --zero 1 resumes from it and ends where serial ends."""
    ckpt = ["--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "1"]
    ref = train_json(1, [*ARGS, *ckpt], tmp_path, "serial")
    resume = ["--resume", str(tmp_path / "ckpt" / "step-000001")]
    for layout in (["--dp", "2", "--tp", "2"], ["--dp", "2", "--pp", "2"]):
        run = train_json(4, [*ARGS, *layout, "--zero", "1", *resume], tmp_path, "run", timeout=240)
        assert_same_model(run, {"losses": ref["losses"][1:], "weights": ref["weights"]}, rtol=1e-12)


# --arch mlp: tensor.py's shards, column then row on each stage (a column layer's rank holds in x out/T
# and out/T of b, a row layer's in/T x out and the whole b); stage 1's 199 elements split 100/99 over dp.
MLP = [64, 24, 16, 14, 10]
MLP_ARGS = ["--layers", ",".join(map(str, MLP)), "--batch", "16", "--samples", "128", "--steps", str(STEPS)]
MLP_ARGS += ["--dtype", "float64", "--optimizer", "adam", "--lr", "0.01", "--kernels", "numpy"]


def mlp_stage_store(stage: int, T: int) -> int:
    (a, b), (_, c) = zip(MLP[2 * stage : 2 * stage + 2], MLP[2 * stage + 1 : 2 * stage + 3])
    return (a * b // T + b // T) + (b * c // T + c)  # the stage's column layer, then its row layer


def test_mlp_zero1_with_tp_and_pp_equals_serial_with_exact_bytes(serial, tmp_path):
    D, T, Sp = 2, 2, 2
    ref = serial(MLP_ARGS)
    layout = ["--dp", str(D), "--tp", str(T), "--pp", str(Sp), "--zero", "1", "--stage-layers", "2,2"]
    ckpt = ["--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "1"]
    run = train_json(8, [*MLP_ARGS, *layout, *ckpt, "--clock", "sim"], tmp_path, "run", timeout=240)
    assert_same_model(run, ref, rtol=1e-12)
    assert mlp_stage_store(1, T) % D, "stage 1 must split unevenly"
    for r in range(8):
        st, d = r // (D * T), (r // T) % D
        n = mlp_stage_store(st, T)
        by_op = run["comm"]["ranks"][r]["by_op"]
        assert "model/grad-allreduce" not in by_op
        assert by_op["model/grad-reduce-scatter"]["sent"] == (n - c(n, D, d)) * BPE * STEPS, r
        assert by_op["model/param-all-gather"]["sent"] == (n - c(n, D, d + 1)) * BPE * STEPS, r
        mem = run["memory"]["ranks"][r]
        assert (mem["params"], mem["grads"], mem["optimizer"]) == (n * BPE, n * BPE, 2 * c(n, D, d) * BPE)
    assert run["prediction_mismatches"] == []
    sim, pred = run["time"]["sim"]["step_s"], run["predicted"]["time"]["step_s"]
    assert abs(pred / sim - 1) <= 1e-6, (sim, pred)
    res = train_json(1, [*MLP_ARGS, "--resume", str(tmp_path / "ckpt" / "step-000001")], tmp_path, "res")
    assert_same_model(res, {"losses": run["losses"][1:], "weights": run["weights"]}, rtol=1e-12)


def test_resmlp_zero1_with_tp_sp_equals_serial_and_shards_what_it_holds(serial, tmp_path):
    """resmlp's blocks under --tp --sp (tensor_resmlp.py): each rank's ZeRO bytes and optimizer state
    follow from the shard it measurably holds (params / bpe = P_shard, one store), as the closed form says."""
    args = [*MLP_ARGS, "--arch", "resmlp", "--layers", "64,32,32,32,10", "--clock", "sim"]
    ref = serial([a for a in args if a not in ("--clock", "sim")])
    run = train_json(4, [*args, "--dp", "2", "--tp", "2", "--sp", "--zero", "1"], tmp_path, timeout=240)
    assert_same_model(run, ref, rtol=1e-12)
    for r in range(4):
        d, n = r // 2, run["memory"]["ranks"][r]["params"] // BPE
        by_op = run["comm"]["ranks"][r]["by_op"]
        assert by_op["model/grad-reduce-scatter"]["sent"] == (n - c(n, 2, d)) * BPE * STEPS
        assert by_op["model/param-all-gather"]["sent"] == (n - c(n, 2, d + 1)) * BPE * STEPS
        assert run["memory"]["ranks"][r]["optimizer"] == 2 * c(n, 2, d) * BPE
    assert run["prediction_mismatches"] == []
    assert abs(run["predicted"]["time"]["step_s"] / run["time"]["sim"]["step_s"] - 1) <= 1e-6
