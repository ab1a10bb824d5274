"""--arch gpt --experts --zero 1|2|3 (parallel/expert_zero.py) on dp4 x ep2, and --zero 1|3 with --cp on
dp2 x cp2 x ep2 (context_expert_zero.py): equal to serial in float64,
every rank's ZeRO bytes and model-state memory against closed forms written HERE, the prediction exact,
and a --zero 3 checkpoint resumed serially; and --precision mixed-fp16 (its loss scaler) on dp4 x ep2
(parallel/expert_gpt.py), with --zero 3, on dp2 x ep2 x tp2 (expert_tensor_gpt.py), on pipeline stages
pp2 x dp2 x ep2 and pp2 x tp2 (pipeline/expert_stage.py; 2 micro-batches = serial's --grad-accum 2), and
with --cp on cp2 x tp2 and pp2 x cp2 (context_expert_tensor.py, pipeline/context_expert_stage.py),
with --sp on dp2 x ep2 x tp2 and cp2 x tp2, with zb-h1 and --recompute full on pp2 x dp2 x ep2 and zb-v
and --recompute selective on pp2 x cp2 --
all cases in one mpiexec launch (scripts/train_layouts.py).

Closed forms (Rajbhandari et al. 2020, sec. 5 and 7.2; DeepSpeed-MoE's expert-data-parallel groups).
Units: embedding (V + S) H, L blocks of 4H^2 + 8H + HE dense elements and E/P experts of 8H^2 + 5H
on this rank, head 2H + HV. Dense parts shard over the D dp ranks (rank d), a rank's experts over its
Q = D/P expert-data-parallel ranks (rank q = d div P). c(n, p, r) = np.array_split's r-th size. Per step:
    grad-reduce-scatter         sum_units n - c(n, D, d)       x R   (expert-: m - c(m, Q, q))
    param-all-gather            sum_units n - c(n, D, d + 1)   x A   (expert-: m - c(m, Q, q + 1))
R = A = 1 for stages 1 and 2, R = G and A = 2G for stage 3 (G micro-steps: gathered for forward and
backward). No all-reduce of gradients is left. Memory, with Sh = sum c(n, D, d) + c(m, Q, q) this rank's
chunks, U = max (n + m), W = sum (n + m), 8 bytes an element, Adam's two moments:
    params W (stage 1, 2) or Sh + U (3);  grads W (1), Sh + W (2, G > 1), Sh + U (3);  optimizer 16 Sh
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import assert_same_model, split_sizes
from tests.mpi.half_precision import assert_same_update, initial_weights
from tests.mpiutil import run_script
from tests.paths import MPI_SCRIPTS

# h = 10, V = 17: the embedding's 290 and the head's 190 elements do not split evenly over 4 ranks
L, H, A, S, V, B, E, K, STEPS, G = 2, 10, 2, 12, 17, 8, 4, 2, 2, 2
D, P = 4, 2
ARGS = ["--arch", "gpt", "--n-layers", str(L), "--hidden", str(H), "--heads", str(A), "--seq-len", str(S)]
ARGS += ["--vocab", str(V), "--dataset", "copy", "--samples", "64", "--batch", str(B), "--steps", str(STEPS)]
ARGS += ["--dtype", "float64", "--optimizer", "adam", "--lr", "0.01", "--kernels", "numpy"]
ARGS += ["--experts", str(E), "--top-k", str(K), "--capacity-factor", "1.0", "--grad-accum", str(G)]
UNITS = [((V + S) * H, 0)] + [(4 * H * H + 8 * H + H * E, E // P * (8 * H * H + 5 * H))] * L
UNITS += [(2 * H + H * V, 0)]
VT = 18  # under --tp 2: embedding 210, block 305 dense elements a tp rank -- odd, chunks one apart


def tp_units(T: int, P: int) -> list:
    """(dense, experts) of a unit on one tp rank (expert_zero_tp.py), vocabulary VT: the embedding's VT/T
    rows and s positions, a block's Wq, Wk, Wv columns and biases and Wo rows (4H^2/T + 3H/T) with the
    LayerNorms, bo and the router whole (5H + HE), the head's VT/T columns and LN_f; the E/P experts
    replicated over tp."""
    block = (4 * H * H // T + 3 * H // T + 5 * H + H * E, E // P * (8 * H * H + 5 * H))
    return [(VT * H // T + S * H, 0)] + [block] * L + [(2 * H + H * VT // T, 0)]


def c(n: int, p: int, r: int) -> int:
    return split_sizes(n, p)[r % p]


def load(tmp_path, name: str) -> dict:
    out = json.loads((tmp_path / f"{name}.json").read_text())
    with np.load(tmp_path / f"{name}.npz") as z:
        out["weights"] = [(z[f"W{i}"], z[f"b{i}"]) for i in range(len(z.files) // 2)]
    return out


def check_zero(m: dict, stage: int, D: int = D, C: int = 1, T: int = 1, P: int = P, sp=False) -> None:
    """World rank r = d C + c: rank r of the D C ranks the dense parts shard over (dp, or dp x cp),
    rank q = (d div P) C + c of the (D/P) C ranks its experts shard over (edp, or edp x cp). With --tp T
    world rank r T + j holds the tp shares of tp_units, sharded over its tp index's groups; --sp adds
    the LayerNorms' sums over tp (4H a block, 2H the head: a ring all-reduce over T), every micro-step
    under stage 3."""
    Dg, Q, bpe = D * C, D // P * C, 8
    R, Ag = (G, 2 * G) if stage == 3 else (1, 1)
    units = UNITS if T == 1 else tp_units(T, P)
    ln = [4 * H] * L + [2 * H] if sp else []
    for w in range(Dg * T):
        r, j = divmod(w, T)
        d, cp = divmod(r, C)
        q = d // P * C + cp
        want = {
            "model/grad-reduce-scatter": sum(n - c(n, Dg, r) for n, _ in units) * R,
            "model/param-all-gather": sum(n - c(n, Dg, r + 1) for n, _ in units) * Ag,
            "model/expert-grad-reduce-scatter": sum(e - c(e, Q, q) for _, e in units) * R,
            "model/expert-param-all-gather": sum(e - c(e, Q, q + 1) for _, e in units) * Ag,
            "model/sp-grad-allreduce": sum(2 * n - c(n, T, j) - c(n, T, j + 1) for n in ln) * R,
        }
        by_op = m["comm"]["ranks"][w]["by_op"]
        got = {op: v["sent"] for op, v in by_op.items() if op.startswith("model/")}
        assert got == {op: v * bpe * STEPS for op, v in want.items() if v}, (stage, w, got)
        Sh = sum(c(n, Dg, r) + c(e, Q, q) for n, e in units)
        U, W = max(n + e for n, e in units), sum(n + e for n, e in units)
        params = W if stage < 3 else Sh + U
        grads = {1: W, 2: Sh + W, 3: Sh + U}[stage]
        mem = m["memory"]["ranks"][w]
        assert (mem["params"], mem["grads"], mem["optimizer"]) == (params * bpe, grads * bpe, 16 * Sh), w
        # activations: the layout's without ZeRO (costmodel/gpt_moe.py, cp_moe.py; their own tests)
        assert mem["activations_peak"] == m["predicted"]["memory"]["ranks"][w]["activations_peak"], w
    assert m["prediction_mismatches"] == []
    for r, p in zip(m["comm"]["ranks"], m["predicted"]["comm"]["ranks"]):  # all-to-alls too, op by op
        assert {k: v["sent"] for k, v in r["by_op"].items() if not k.startswith("control")} == {
            k: v["sent"] for k, v in p["by_op"].items()
        }


FP16 = [a for a in ARGS if a not in ("--dtype", "float64")] + ["--precision", "mixed-fp16"]
FP16_TP = [*FP16, "--vocab", "18"]  # the vocabulary splits over tp (the later --vocab wins)
ARGS_TP = [*ARGS, "--vocab", str(VT)]
SKIP_SCALE = 600000  # float16 gradients overflow at this loss scale on step 1 (from ~450000), not at half
TOL = 16 * 2.0**-11  # 16 units of float16's roundoff: tests/mpi/model/test_mixed.py's tolerance


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every case of this file, trained in one launch: {name: metrics with "weights"}."""
    out = tmp_path_factory.mktemp("moe_zero")
    layout = ["--dp", str(D), "--ep", str(P)]
    ckpt = out / "ckpt"
    every = ["--checkpoint-dir", str(ckpt), "--checkpoint-every", "1"]
    cases = [["serial", 1, ARGS]]
    cases += [[f"zero{z}", D, [*ARGS, *layout, "--zero", str(z)]] for z in (1, 2)]
    cases += [["zero3", D, [*ARGS, *layout, "--zero", "3", *every]]]
    cases += [["resumed", 1, [*ARGS, "--resume", str(ckpt / "step-000001")]]]
    cp = ["--dp", "2", "--cp", "2", "--ep", "2"]  # context_expert_zero.py
    cases += [[f"cp-zero{z}", D, [*ARGS, *cp, "--zero", str(z)]] for z in (1, 3)]
    tp = ["--dp", "2", "--tp", "2"]  # expert_zero_tp.py: with --ep 2 edp has one rank, with 1 two
    tp_ckpt = out / "ckpt-tp"
    cases += [["serial-tp", 1, ARGS_TP], ["tp-zero1", D, [*ARGS_TP, *tp, "--ep", "2", "--zero", "1"]]]
    cases += [["tp-zero2-sp", D, [*ARGS_TP, *tp, "--sp", "--zero", "2"]]]
    cases += [["tp-zero3", D, [*ARGS_TP, *tp, "--ep", "2", "--zero", "3"]]]
    cases[-1][2] += ["--checkpoint-dir", str(tp_ckpt), "--checkpoint-every", "1"]
    cases += [["tp-zero3-edp", D, [*ARGS_TP, *tp, "--zero", "3"]]]
    cases += [["cp-tp-zero3-sp", D, [*ARGS_TP, "--cp", "2", "--tp", "2", "--sp", "--zero", "3"]]]
    cases += [["tp-resumed", 1, [*ARGS_TP, "--resume", str(tp_ckpt / "step-000001")]]]
    cases += [["serial-fp16", 1, FP16], ["fp16", D, [*FP16, *layout]]]
    cases += [["fp16-zero3", D, [*FP16, *layout, "--zero", "3"]]]
    cases += [["serial-fp16-tp", 1, FP16_TP]]
    cases += [["fp16-tp2", D, [*FP16_TP, "--dp", "2", "--ep", "2", "--tp", "2"]]]
    pipe = ["--grad-accum", "1", "--microbatches", "2", "--pp", "2"]  # = serial's --grad-accum 2
    cases += [["fp16-pp2", D, [*FP16, *pipe, "--dp", "2", "--ep", "2"]]]
    cases += [["fp16-pp2-tp2", D, [*FP16_TP, *pipe, "--tp", "2"]]]
    cases += [["fp16-cp2-tp2", D, [*FP16_TP, "--cp", "2", "--tp", "2"]]]  # context_expert_tensor.py
    cases += [["fp16-pp2-cp2", D, [*FP16, *pipe, "--cp", "2"]]]  # pipeline/context_expert_stage.py
    cases += [["fp16-tp2-sp", D, [*FP16_TP, "--dp", "2", "--ep", "2", "--tp", "2", "--sp"]]]
    cases += [["fp16-pp2-zb", D, [*FP16, *pipe, "--dp", "2", "--ep", "2", "--schedule", "zb-h1"]]]
    cases[-1][2] += ["--recompute", "full"]  # expert_stage.py's zero-bubble and recompute, half precision
    cases += [["fp16-cp2-tp2-sp", D, [*FP16_TP, "--cp", "2", "--tp", "2", "--sp"]]]
    cases += [["fp16-pp2-cp2-zb", D, [*FP16, *pipe, "--cp", "2", "--schedule", "zb-v"]]]
    cases[-1][2] += ["--recompute", "selective"]  # context_expert_stage.py's, half precision
    skip = [*FP16_TP, "--loss-scale", str(SKIP_SCALE)]
    cases += [["serial-skip", 1, skip], ["skip-tp2", D, [*skip, "--dp", "2", "--ep", "2", "--tp", "2"]]]
    cases += [["skip-pp2", D, [*skip, *pipe, "--dp", "2", "--ep", "2"]]]
    res = run_script(D, MPI_SCRIPTS / "train_layouts.py", [str(out), json.dumps(cases)], timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return {name: load(out, name) for name, _, _ in cases}


def test_zero_1_2_3_with_experts_equal_serial_with_exact_bytes(runs):
    ref = runs["serial"]
    assert sum(sum(step) for step in ref["moe"]["dropped"]) > 0  # capacity drops tokens here
    for z in (1, 2, 3):
        run = runs[f"zero{z}"]
        assert_same_model(run, ref, rtol=1e-12)
        assert run["moe"]["dropped"] == ref["moe"]["dropped"]
        check_zero(run, z)
    for z in (1, 3):  # dp2 x cp2 x ep2: dense parts over dp x cp (4 ranks), experts over edp x cp (2)
        run = runs[f"cp-zero{z}"]
        assert_same_model(run, ref, rtol=1e-12)
        assert run["moe"]["dropped"] == ref["moe"]["dropped"]
        check_zero(run, z, D=2, C=2)
    # the dp4 x ep2 --zero 3 checkpoint of step 1 (chunks gathered to full shape) resumed serially
    assert_same_model(runs["resumed"], {**ref, "losses": ref["losses"][1:]}, rtol=1e-12)


# (case, stage, --ep, --sp) of expert_zero_tp.py on dp2 x tp2
TP_CASES = [("tp-zero1", 1, 2, False), ("tp-zero2-sp", 2, 1, True), ("tp-zero3", 3, 2, False)]
TP_CASES += [("tp-zero3-edp", 3, 1, False)]


def test_zero_1_2_3_with_experts_and_tp_equal_serial_with_exact_bytes(runs):
    """dp2 x tp2 (expert_zero_tp.py): stage 1 and 3 with --ep 2 (the experts' edp group one rank: no
    expert traffic), stage 2 with --sp and stage 3 with --ep 1 (experts sharded over edp 2); cp2 x tp2
    --sp --zero 3; the --ep 2 --zero 3 checkpoint of step 1 resumed serially."""
    ref = runs["serial-tp"]
    assert sum(sum(step) for step in ref["moe"]["dropped"]) > 0
    for name, stage, ep, sp in TP_CASES:
        run = runs[name]
        assert_same_model(run, ref, rtol=1e-12)
        assert run["moe"]["dropped"] == ref["moe"]["dropped"], name
        check_zero(run, stage, D=2, T=2, P=ep, sp=sp)
    # cp2 x tp2 (ContextExpertZeroTensor): the tp shares and the experts both over the 2 cp ranks
    run = runs["cp-tp-zero3-sp"]
    assert_same_model(run, ref, rtol=1e-12)
    assert run["moe"]["dropped"] == ref["moe"]["dropped"]
    check_zero(run, 3, D=1, C=2, T=2, P=1, sp=True)
    assert_same_model(runs["tp-resumed"], {**ref, "losses": ref["losses"][1:]}, rtol=1e-12)


@pytest.mark.parametrize(
    "name,serial",
    [
        ("fp16", ""),
        ("fp16-zero3", ""),
        ("fp16-tp2", "-tp"),
        ("fp16-pp2", ""),
        ("fp16-pp2-tp2", "-tp"),
        ("fp16-cp2-tp2", "-tp"),
        ("fp16-pp2-cp2", ""),
        ("fp16-tp2-sp", "-tp"),
        ("fp16-pp2-zb", ""),
        ("fp16-cp2-tp2-sp", "-tp"),
        ("fp16-pp2-cp2-zb", ""),
    ],
)
def test_mixed_fp16_trains_the_serial_model(runs, name, serial):
    """float16 with its loss scaler (model/precision.py; the aux loss's gradient scaled too): the losses
    within 16 u of serial's, the update within tests/mpi/half_precision.py's drift of serial's, every
    byte (2 per element) and memory as predicted, no step skipped at the initial scale."""
    ref, run = runs[f"serial-fp16{serial}"], runs[name]
    args = FP16_TP if serial else FP16
    np.testing.assert_allclose(run["losses"], ref["losses"], rtol=TOL, atol=0)
    # measured 0.001-0.010 of serial's update; without the aux loss's gradient scaled 0.20-0.23
    assert_same_update(run["weights"], ref["weights"], initial_weights(args))
    assert run["prediction_mismatches"] == [] and ref["prediction_mismatches"] == []
    for mine, pred in zip(run["memory"]["ranks"], run["predicted"]["memory"]["ranks"]):
        assert mine == pred  # activations_peak too: the router's probabilities in float32
    assert run["precision"]["skipped_steps"] == 0 and run["precision"]["loss_scale"] == 65536.0
    assert run["moe"]["dropped"][0] == ref["moe"]["dropped"][0]  # step 1 routes the same tokens


@pytest.mark.parametrize("name", ["skip-tp2", "skip-pp2"])
def test_an_overflowed_step_is_skipped_alike_everywhere(runs, name):
    """--loss-scale 600000: step 1's float16 gradients overflow, so every rank skips it and halves the
    scale (its ep, tp and pp ranks hold different gradients: the world votes), as serial does; step 2
    trains at the halved scale to serial's loss."""
    ref, run = runs["serial-skip"], runs[name]
    assert ref["precision"]["skipped_at"] == [1] and ref["precision"]["loss_scale"] == SKIP_SCALE / 2
    assert run["precision"] == ref["precision"]
    np.testing.assert_allclose(run["losses"], ref["losses"], rtol=TOL, atol=0)
