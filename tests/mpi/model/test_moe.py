"""Mixture of experts (simpar/moe.py): the layer's backward against finite differences, capacity and
the aux loss against the formulas written here; and (MPI) expert parallelism against the serial run."""

from __future__ import annotations

import math

import numpy as np

from simpar.model import moe
from tests.paths import MPI_SCRIPTS
from tests.unit.model.test_moe import D_IN, B, E, K

# -- expert parallelism on real ranks, against the serial MoE run ---------------------------------------

MOE = ["--dtype", "float64", "--steps", "4", "--experts", "4", "--top-k", "2", "--capacity-factor", "1.0"]


def kept_from_routed(H, cap):
    """Kept assignments per (dp rank, expert): an expert fills its cap slots in global row order, so
    rank d keeps min(H[d][e], cap - (assignments to e on ranks before d)), never below 0."""
    H = np.array(H)
    before = np.vstack([np.zeros((1, H.shape[1]), int), np.cumsum(H, axis=0)[:-1]])
    return np.minimum(H, np.maximum(cap - before, 0))


def expected_alltoall_bytes(moe_metrics, D, P, d, rows=B):
    """Bytes rank d sends in each all-to-all over the run, from the routing histograms and the rule
    of the README: rows of kept assignments to experts on other ranks of its ep group go out (ep-dispatch,
    ep-combine-grad), rows its own experts kept for the other ranks go back (ep-combine, ep-dispatch-grad).
    rows: the global rows routed together (the batch, or a --grad-accum micro-step's), for the capacity."""
    per, j, base = E // P, d % P, d - d % P
    mine = set(range(j * per, (j + 1) * per))
    cap = math.ceil(1.0 * K * rows / E)
    out = back = 0
    for step in moe_metrics["routed_by_rank"]:
        for H in step:
            kept = kept_from_routed(H, cap)
            out += sum(kept[d][e] for e in range(E) if e not in mine)
            back += sum(kept[s][e] for s in range(base, base + P) if s != d for e in mine)
    return {"ep-dispatch": out, "ep-combine-grad": out, "ep-combine": back, "ep-dispatch-grad": back}


def expected_activation_peak(
    moe_metrics, D, P, d, rows=B, bpe=8, router_bpe=8, widths=(64, 128, 128, 128, 10)
):
    """Bytes rank d keeps for backward at the end of a step's forward, the most of any step: every
    layer's input; z of every layer but the linear last; per MoE layer also the router's probabilities
    (E per row, router_bpe bytes each: float32 under mixed precision), the expert outputs returned for
    its own kept assignments, and the input and z of each expert it owns for every row the group's
    ranks sent it (bpe bytes each)."""
    per, j, base = E // P, d % P, d - d % P
    n = rows // D
    cap = math.ceil(1.0 * K * rows / E)
    dense = n * (widths[0] + widths[1]) + n * widths[3]  # layer 0 (x, z) and the last layer (x)
    peaks = []
    for step in moe_metrics["routed_by_rank"]:
        total = dense
        for H in step:  # MoE layers 1 and 2: 128 -> 128
            kept = kept_from_routed(H, cap)
            total += n * D_IN + kept[d].sum() * D_IN
            total += (
                sum(kept[s][e] for s in range(base, base + P) for e in range(j * per, (j + 1) * per))
                * 2
                * D_IN
            )
        peaks.append(total * bpe + 2 * n * E * router_bpe)  # two MoE layers' router probabilities
    return max(peaks)


def first_step_histograms(D):
    """The routing of layer 1 at step 1, reproduced here in NumPy: the first global batch, the initial
    weights, relu(x W0 + b0) @ Wr, each row's top K, counted per dp rank's contiguous share of rows."""
    from simpar.config import RunConfig
    from simpar.model.mlp import init_layer
    from simpar.run.data import global_batches, load_dataset

    cfg = RunConfig(dtype="float64")
    data = load_dataset(cfg)
    _, rows = next(global_batches(len(data.x_train), B, 0, 1))
    W0, b0 = init_layer(0, 0, 64, 128, np.float64)
    Wr, _ = moe.init_moe(0, 1, 128, 128, E, np.float64)
    logits = np.maximum(data.x_train[rows] @ W0 + b0, 0) @ Wr  # softmax keeps the order: top-k of logits
    top = np.argsort(-logits, axis=1, kind="stable")[:, :K]
    return [np.bincount(part.reshape(-1), minlength=E).tolist() for part in np.array_split(top, D)]


def test_expert_parallel_equals_serial_and_bytes_follow_the_histogram(serial, tmp_path):
    from tests.conftest import assert_same_model, train_json

    ref = serial(MOE)
    dense = 64 * 128 + 128 + 128 * 10 + 10 + 2 * 128 * E  # first and last layer, two routers
    expert = 128 * 128 + 128  # one expert of layer 1 or 2
    assert ref["params"] == dense + 2 * E * expert
    sim = ["--clock", "sim", "--hardware", "dgx-h100"]  # same job, simulated time beside it
    for n, layout in ((2, ["--dp", "2", "--ep", "2"]), (4, ["--dp", "4", "--ep", "2", *sim])):
        run = train_json(n, MOE + layout, tmp_path, name=f"ep{n}")
        D, P = n, 2
        assert_same_model(run, ref, rtol=1e-12)
        moe_run, moe_ref = run["moe"], ref["moe"]
        assert moe_run["routed_by_rank"][0][0] == first_step_histograms(D)  # the metrics' counts are real
        # Same tokens routed, kept and dropped as the serial run, step by step and layer by layer.
        assert moe_run["tokens_per_expert"] == moe_ref["tokens_per_expert"]
        assert moe_run["dropped"] == moe_ref["dropped"] and sum(map(sum, moe_ref["dropped"])) > 0
        assert [[list(np.sum(H, axis=0)) for H in s] for s in moe_run["routed_by_rank"]] == moe_ref[
            "routed_per_expert"
        ]
        for d, rank in enumerate(run["comm"]["ranks"]):
            rows = expected_alltoall_bytes(moe_run, D, P, d)
            for op, r in rows.items():
                entry = rank["by_op"][f"activation/{op}"]
                assert entry["sent"] == r * D_IN * 8, (n, d, op)
                assert entry["messages"] == (P - 1) * 2 * 4  # 2 MoE layers x 4 steps
            assert rank["sent"]["activation"] == sum(rows.values()) * D_IN * 8  # the four ops, nothing else
            assert run["memory"]["ranks"][d]["params"] == (dense + 2 * (E // P) * expert) * 8
            assert run["memory"]["ranks"][d]["optimizer"] == (dense + 2 * (E // P) * expert) * 8  # momentum
            peak = expected_activation_peak(moe_run, D, P, d)
            assert run["memory"]["ranks"][d]["activations_peak"] == peak, (n, d)
            assert run["predicted"]["memory"]["ranks"][d]["activations_peak"] == peak, (n, d)
            # histogram exchange: a ring all-gather of D x E int64 counts, (D-1) E x 8 B per layer
            assert rank["by_op"]["control/ep-histogram"]["sent"] == (D - 1) * E * 8 * 2 * 4
        assert run["prediction_mismatches"] == []
        if n == 4:  # the cost model's step within 10% of the simulated clock's
            simulated, predicted = run["time"]["sim"]["step_s"], run["predicted"]["time"]["step_s"]
            assert abs(predicted - simulated) <= 0.1 * simulated, (predicted, simulated)


def test_bad_moe_options_are_one_line_each():
    import pytest

    from simpar.config import RunConfig, SimparError, validate

    cases = [
        (dict(ep=2), 2, "--ep 2 shards experts: add --experts E"),
        (dict(experts=1), 1, "--experts must be at least 2"),
        (dict(experts=4, top_k=5), 1, "--top-k must be between 1 and --experts 4"),
        (dict(experts=4, capacity_factor=0.0), 1, "--capacity-factor must be a positive number"),
        (dict(experts=4, aux_loss_coef=-1.0), 1, "--aux-loss-coef must be a number >= 0"),
        (dict(experts=4, layers=[64, 128, 10]), 1, "has none"),
        (dict(experts=4, ep=3, dp=4), 4, "--ep 3 must divide --dp 4"),
        (dict(experts=6, ep=4, dp=4), 4, "--experts 6 must be divisible by --ep 4"),
        (dict(experts=4, tp=2), 2, "not with --tp"),
        (dict(experts=4, zero=1), 2, "not with --zero"),
        (dict(experts=4, arch="resmlp"), 1, "not with --arch resmlp"),
        (dict(experts=4, precision="mixed-fp16"), 1, "not with --precision mixed-fp16"),
    ]
    for fields, world, message in cases:
        with pytest.raises(SimparError, match=message):
            validate(RunConfig(**fields), world)
    # On the command line: one line, exit status 2, every rank ends, no traceback.
    from tests.mpiutil import run_mpi

    res = run_mpi(
        2, ["train", "--experts", "4", "--ep", "2", "--pp", "2", "--steps", "1", "--quiet"], timeout=60
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert lines == ["simpar: error: --ep 2 must divide --dp 1 (EP inside DP)"], res.stderr


def test_cost_model_decides_capacity_itself(tmp_path):
    """With the executor's capacity cut by one slot (tests/mpi/scripts/mutate_executor.py), the cost
    model -- which applies its own ceil(C K N / E) to the run's routing histograms -- no longer agrees
    with the ledger."""
    import json

    from tests.mpiutil import run_script

    out = tmp_path / "capacity.json"
    argv = ["capacity", *MOE, "--dp", "2", "--ep", "2", "--quiet", "--metrics-out", str(out)]
    res = run_script(2, MPI_SCRIPTS / "mutate_executor.py", argv, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    bad = json.loads(out.read_text())["prediction_mismatches"]
    assert any(" activation: measured" in line for line in bad), bad


# -- checkpoints: saved on dp4 x ep2, resumed on other --ep layouts -------------------------------------
