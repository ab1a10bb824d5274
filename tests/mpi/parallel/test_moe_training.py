"""Mixture of experts beyond one plain step (helpers and the MOE run from test_moe.py): checkpoints
saved on one expert-parallel layout and resumed on others, --grad-accum (each micro-step routes its own
rows), and --precision mixed-bf16 -- each against the serial run."""

from __future__ import annotations

import math

import numpy as np

from simpar.model import moe
from tests.mpi.half_precision import assert_same_update, initial_weights
from tests.mpi.model.test_moe import D_IN, MOE, B, E, K, expected_activation_peak, expected_alltoall_bytes


def test_checkpoint_of_dp4_ep2_resumes_on_serial_dp2_ep2_and_dp4_ep4(tmp_path):
    """The saving run is the uninterrupted reference (saving changes no number); each resumed run must
    continue its losses and reach its final weights (float64, 1e-12). Adam: the params and both moments
    m, v travel in full shape -- every expert of an MoE layer in its flat W_i -- and are sliced again."""
    from tests.conftest import assert_same_model, train_json
    from tests.mpi.test_errors import assert_one_line_error
    from tests.mpiutil import run_mpi

    adam = [*MOE[:3], "8", *MOE[4:], "--optimizer", "adam", "--lr", "0.01"]  # 8 steps
    ckpt = tmp_path / "ckpt"
    ref = train_json(
        4,
        [*adam, "--dp", "4", "--ep", "2", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "4"],
        tmp_path,
        "ref",
    )
    assert ref["checkpoint"]["saved"] == [str(ckpt / "step-000004"), str(ckpt / "step-000008")]
    assert ref["prediction_mismatches"] == []  # saving moves control bytes only: training bytes as predicted
    # Each save gathers params, m and v; ep rank 1 of the first ep group (world rank 1) sends its E/P
    # experts of both MoE layers to rank 0 in one message each; the other ep group sends nothing.
    expert = 128 * 128 + 128
    ranks = ref["comm"]["ranks"]
    assert ranks[1]["by_op"]["control/checkpoint-gather"] == {
        "sent": 2 * 3 * (E // 2) * 2 * expert * 8,
        "received": 0,
        "messages": 2 * 3,
    }
    assert ranks[0]["by_op"]["control/checkpoint-gather"]["received"] == 2 * 3 * (E // 2) * 2 * expert * 8
    assert all("control/checkpoint-gather" not in r["by_op"] for r in ranks[2:])
    with np.load(ckpt / "step-000004" / "params.npz") as z:  # router, then all E experts, b empty
        assert z["W1"].shape == (128 * E + E * expert,) and z["b1"].shape == (0,)
    step4 = ["--resume", str(ckpt / "step-000004")]
    for n, layout in ((1, []), (2, ["--dp", "2", "--ep", "2"]), (4, ["--dp", "4", "--ep", "4"])):
        run = train_json(n, [*adam, *layout, *step4], tmp_path, f"resumed{n}")
        assert run["checkpoint"]["start_step"] == 4 and run["steps"] == 4
        assert_same_model(run, {"losses": ref["losses"][4:], "weights": ref["weights"]}, rtol=1e-12)
        assert run["prediction_mismatches"] == []  # the resumed steps move exactly the predicted bytes
    # A checkpoint of another model is one line: different --experts, or a dense run.
    for other, fragment in (
        (["--experts", "8"], "was trained with --experts 4; this run has --experts 8"),
        ([], "was trained with --experts 4; this run has --experts 0"),
    ):
        args = ["train", "--dtype", "float64", "--steps", "8", *other, *step4, "--optimizer", "adam"]
        res = run_mpi(1, args, timeout=30)
        assert_one_line_error(res, fragment)


def test_grad_accum_routes_each_micro_step_and_all_reduces_once(serial, tmp_path):
    """--grad-accum 2 on dp4 x ep2 against the serial run with --grad-accum 2: micro-step k routes the
    k-th half of the batch with its own capacity ceil(C K (B/2) / E) and its own all-to-alls; the
    gradients are all-reduced once per step."""
    from tests.conftest import assert_same_model, train_json

    G, D, P, steps = 2, 4, 2, 4
    accum = [*MOE, "--grad-accum", str(G)]
    ref = serial(accum)
    run = train_json(D, [*accum, "--dp", str(D), "--ep", str(P)], tmp_path, "accum")
    assert_same_model(run, ref, rtol=1e-12)
    moe_run, moe_ref = run["moe"], ref["moe"]
    rows = B // G  # global rows of one micro-step
    assert moe_run["capacity"] == math.ceil(1.0 * K * rows / E) == 16 and moe_run["grad_accum"] == G
    assert len(moe_run["routed_by_rank"]) == steps * G  # one routing per micro-step
    assert moe_run["tokens_per_expert"] == moe_ref["tokens_per_expert"]
    assert max(max(map(max, micro)) for micro in moe_run["tokens_per_expert"]) <= 16
    assert moe_run["dropped"] == moe_ref["dropped"] and sum(map(sum, moe_ref["dropped"])) > 0
    for d, rank in enumerate(run["comm"]["ranks"]):
        for op, r in expected_alltoall_bytes(moe_run, D, P, d, rows).items():
            entry = rank["by_op"][f"activation/{op}"]
            assert entry["sent"] == r * D_IN * 8, (d, op)
            assert entry["messages"] == (P - 1) * 2 * steps * G  # 2 MoE layers, per micro-step
        assert rank["by_op"]["control/ep-histogram"]["sent"] == (D - 1) * E * 8 * 2 * steps * G
        # once per step: a ring all-reduce sends 2(p-1) messages, over dp (4) and expert-dp (2) ranks
        assert rank["by_op"]["model/grad-allreduce"]["messages"] == 2 * (D - 1) * steps
        assert rank["by_op"]["model/expert-grad-allreduce"]["messages"] == 2 * (D // P - 1) * steps
        peak = expected_activation_peak(moe_run, D, P, d, rows)  # the fullest micro-step
        assert run["memory"]["ranks"][d]["activations_peak"] == peak, d
        assert run["predicted"]["memory"]["ranks"][d]["activations_peak"] == peak, d
    assert run["prediction_mismatches"] == []
    # The first step's loss, recomputed here: per micro-step k (rows N_k), the mean cross-entropy share
    # and each MoE layer's aux loss (moe.serial_forward over the micro-step alone), both weighted N_k/B.
    assert abs(ref["losses"][0] - first_step_loss_with_accumulation(G)) < 1e-12


def first_step_loss_with_accumulation(G):
    from simpar.config import RunConfig
    from simpar.model.mlp import init_layer
    from simpar.run.data import global_batches, load_dataset, micro_steps

    data = load_dataset(RunConfig(dtype="float64"))
    _, rows = next(global_batches(len(data.x_train), B, 0, 1))
    W0, b0 = init_layer(0, 0, 64, 128, np.float64)
    W3, b3 = init_layer(0, 3, 128, 10, np.float64)
    layers = [moe.init_moe(0, i, 128, 128, E, np.float64) for i in (1, 2)]
    loss = 0.0
    for part in micro_steps(rows, G):
        x, weight = np.maximum(data.x_train[part] @ W0 + b0, 0), len(part) / B
        for Wr, experts in layers:
            x, aux, _ = moe.serial_forward(x, Wr, experts, K, 1.0, 0.01, "relu")  # N = these rows
            loss += weight * aux
        logits = x @ W3 + b3
        logits -= logits.max(axis=1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        loss += -logp[np.arange(len(part)), data.y_train[part]].sum() / B
    return loss


def test_mixed_bf16_equals_serial_moves_two_byte_rows_and_checkpoints_the_masters(serial, tmp_path):
    """--precision mixed-bf16 on dp4 x ep2 against the serial mixed-bf16 run, to TOL = 16 u (u = 2**-8,
    tests/mpi/model/test_mixed.py says why: another layout sums the half gradients in another order); the
    all-to-alls move 2-byte rows, the router keeps float32 probabilities (Switch's selective precision);
    a checkpoint at step 3 (half params, float32 masters and velocity) resumes on dp2 x ep2."""
    from tests.conftest import train_json

    tol, D, P = 16 * 2.0**-8, 4, 2
    bf16 = ["--steps", "6", *MOE[4:], "--precision", "mixed-bf16"]  # float32 masters, bfloat16 model
    ref = serial(bf16)
    ckpt = tmp_path / "ckpt"
    run = train_json(
        D,
        [*bf16, "--dp", "4", "--ep", "2", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "3"],
        tmp_path,
        "bf16",
    )
    w0 = initial_weights(bf16)
    assert_close_at_half_precision(run["losses"], run["weights"], ref, tol, w0)
    assert run["precision"]["skipped_steps"] == 0
    dense = 64 * 128 + 128 + 128 * 10 + 10 + 2 * 128 * E
    expert = 128 * 128 + 128
    for d, rank in enumerate(run["comm"]["ranks"]):
        for op, r in expected_alltoall_bytes(run["moe"], D, P, d).items():
            assert rank["by_op"][f"activation/{op}"]["sent"] == r * D_IN * 2, (d, op)
        mem = run["memory"]["ranks"][d]
        count = dense + 2 * (E // P) * expert
        assert (mem["params"], mem["grads"], mem["optimizer"]) == (count * 2, count * 2, count * 8)
        assert mem["activations_peak"] == expected_activation_peak(run["moe"], D, P, d, bpe=2, router_bpe=4)
    assert run["prediction_mismatches"] == []
    resumed = train_json(
        2, [*bf16, "--dp", "2", "--ep", "2", "--resume", str(ckpt / "step-000003")], tmp_path, "r"
    )
    assert resumed["checkpoint"]["start_step"] == 3
    assert_close_at_half_precision(
        resumed["losses"], resumed["weights"], {**run, "losses": run["losses"][3:]}, tol, w0
    )
    assert resumed["prediction_mismatches"] == []


def assert_close_at_half_precision(losses, weights, ref, tol, w0):
    """Losses within tol relative; the weights moved from w0 as the reference's did (the update
    w_T - w_0 within a tenth of its size: tests/mpi/half_precision.py)."""
    np.testing.assert_allclose(losses, ref["losses"], rtol=tol)
    assert [W.shape for W, _ in weights] == [W.shape for W, _ in ref["weights"]]
    assert [b.shape for _, b in weights] == [b.shape for _, b in ref["weights"]]
    assert_same_update(weights, ref["weights"], w0)
