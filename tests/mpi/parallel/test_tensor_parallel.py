"""Megatron tensor parallelism (simpar/parallel/tensor.py) against the serial model, and its traffic.

Every layout must train the same model as one process (losses and final weights), and the ledger
must show exactly the bytes the design sends: per pair per micro-step one g all-reduce of
B_local x (pair output width) in forward and one f all-reduce of B_local x (pair input width) in
backward, except f for a pair that starts at the model's first layer; no "model" bytes inside a tp
group; with dp > 1, 2(dp-1)/dp x (local shard parameters) x bpe of "model" bytes per rank.
"""

from __future__ import annotations

import pytest

from tests.conftest import assert_same_model, split_sizes, train_json
from tests.mpiutil import run_script

STEPS = 5
BATCH = 64
DEFAULT = [64, 128, 128, 128, 10]
BASE = ["--dtype", "float64", "--steps", str(STEPS), "--batch", str(BATCH), "--kernels", "numpy"]
RELU_SGD = BASE
ODD_GELU_ADAM = BASE + [
    "--layers",
    "64,32,32,10",
    "--activation",
    "gelu",
    "--optimizer",
    "adam",
    "--lr",
    "0.01",
]
F32 = ["--dtype", "float32", "--steps", str(STEPS), "--batch", str(BATCH), "--kernels", "numpy"]


# -- the traffic the design promises, derived independently of the implementation ---------------


def ring_allreduce_sent(n: int, p: int, r: int) -> int:
    """Elements rank r sends in a ring all-reduce of n: all chunks but its own in the reduce-scatter,
    all but chunk r+1 in the all-gather (2(p-1)/p * n up to rounding; 2(p-1)*n over the ring)."""
    if p == 1:
        return 0
    c = split_sizes(n, p)
    return 2 * n - c[r] - c[(r + 1) % p]


def local_rows(batch, dp, grad_accum, dp_index) -> list[int]:
    """Rows of each micro-step on data-parallel rank dp_index: the batch split into grad_accum
    micro-steps, each split over dp ranks (both by np.array_split's rule)."""
    return [split_sizes(rows, dp)[dp_index] for rows in split_sizes(batch, grad_accum)]


def expected_activation(layers, tp, dp, grad_accum, dp_index, tp_index, bpe) -> dict:
    """Bytes sent per step by one rank, split into the g (forward) and f (backward) all-reduces."""
    g = f = 0
    for rows in local_rows(BATCH, dp, grad_accum, dp_index):
        for c in range(0, len(layers) - 2, 2):  # pairs (c, c+1); an odd last layer has no traffic
            g += ring_allreduce_sent(rows * layers[c + 2], tp, tp_index)
            if c > 0:  # nobody wants dL/d(model input)
                f += ring_allreduce_sent(rows * layers[c], tp, tp_index)
    return {"g": g * bpe, "f": f * bpe}


def local_params(layers, tp) -> int:
    """Parameters one tp rank holds: column shards, row shards (+ replicated bias), odd last layer whole."""
    n, total = len(layers) - 1, 0
    for i in range(n):
        fan_in, fan_out = layers[i], layers[i + 1]
        if n % 2 and i == n - 1:
            total += fan_in * fan_out + fan_out
        elif i % 2 == 0:
            total += fan_in * fan_out // tp + fan_out // tp
        else:
            total += fan_in // tp * fan_out + fan_out
    return total


def assert_traffic(run, layers, tp, dp, grad_accum, bpe):
    total = {"g": 0, "f": 0}
    for r in run["comm"]["ranks"]:
        want = expected_activation(layers, tp, dp, grad_accum, r["coords"]["dp"], r["coords"]["tp"], bpe)
        ops = r["by_op"]
        got_g = ops.get("activation/tp-g-allreduce", {"sent": 0})["sent"]
        got_f = ops.get("activation/tp-f-allreduce", {"sent": 0})["sent"]
        assert got_g == STEPS * want["g"], (r["rank"], got_g, STEPS * want["g"])
        assert got_f == STEPS * want["f"], (r["rank"], got_f, STEPS * want["f"])
        assert r["sent"]["activation"] == got_g + got_f, "activation traffic outside f and g"
        assert r["sent"]["activation"] == r["received"]["activation"]
        total["g"] += got_g
        total["f"] += got_f
        model = STEPS * 2 * (dp - 1) // dp * local_params(layers, tp) * bpe  # exact for dp in (1, 2)
        assert r["sent"]["model"] == model, (r["rank"], r["sent"]["model"], model)
        assert run["memory"]["ranks"][r["rank"]]["params"] == local_params(layers, tp) * bpe
    # Over a whole tp group a ring all-reduce of N elements sends exactly 2(t-1)N: no rounding left.
    rows = BATCH // grad_accum // dp
    pairs = range(0, len(layers) - 2, 2)
    n_g = sum(rows * layers[c + 2] for c in pairs)
    n_f = sum(rows * layers[c] for c in pairs if c > 0)
    groups = dp * grad_accum * STEPS
    assert total["g"] == groups * 2 * (tp - 1) * n_g * bpe
    assert total["f"] == groups * 2 * (tp - 1) * n_f * bpe


# -- equivalence with serial, and the ledger ----------------------------------------------------


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_matches_serial_and_formula(tp, serial, tmp_path):
    run = train_json(tp, RELU_SGD + ["--tp", str(tp)], tmp_path)
    assert run["mesh"] == {"dp": 1, "tp": tp, "pp": 1}
    assert_same_model(run, serial(RELU_SGD), 1e-12)
    assert_traffic(run, DEFAULT, tp, 1, 1, 8)
    assert run["comm"]["total_sent"]["model"] == 0 and run["comm"]["total_sent"]["data"] == 0


def test_hybrid_dp2_tp2_with_grad_accum(serial, tmp_path):
    run = train_json(4, RELU_SGD + ["--dp", "2", "--tp", "2", "--grad-accum", "2"], tmp_path)
    assert run["mesh"] == {"dp": 2, "tp": 2, "pp": 1}
    assert_same_model(run, serial(RELU_SGD), 1e-12)
    assert_traffic(run, DEFAULT, 2, 2, 2, 8)


def test_odd_layers_gelu_adam_root_data(serial, tmp_path):
    """3 layers: pair (0, 1) + a replicated last layer; rank 0 sends each tp rank its rows."""
    run = train_json(2, ODD_GELU_ADAM + ["--tp", "2", "--data-source", "root"], tmp_path)
    assert_same_model(run, serial(ODD_GELU_ADAM), 1e-12)
    assert_traffic(run, [64, 32, 32, 10], 2, 1, 1, 8)
    per_step = BATCH * 64 * 8 + BATCH * 8  # inputs (float64) + labels (int64)
    assert [r["sent"]["data"] for r in run["comm"]["ranks"]] == [STEPS * per_step, 0]


def test_float32(serial, tmp_path):
    run = train_json(2, F32 + ["--tp", "2"], tmp_path)
    assert_same_model(run, serial(F32), 1e-5)
    assert_traffic(run, DEFAULT, 2, 1, 1, 4)


# -- the stack alone, as a pipeline stage would use it -------------------------------------------

STAGE_SCRIPT = r"""
import numpy as np
from simpar.runtime.comm import Communicator, Ledger
from simpar.config import RunConfig
from simpar.runtime.mesh import Mesh
from simpar.parallel.base import HeldBytes, NonFiniteWatch, SerialStack
from simpar.parallel.tensor import TensorParallelStack
from mpi4py import MPI

world = Communicator(MPI.COMM_WORLD, Ledger())
cfg = RunConfig(layers=[8, 6, 4, 6, 3], activation="tanh", dtype="float64", tp=2, dp=1)
mesh = Mesh.build(world, 1, 2, 1)
rng = np.random.default_rng(5)
for indices in ([1, 2], [1, 2, 3], [0, 1, 2], [2], [0, 1, 2, 3]):
    x = rng.standard_normal((5, cfg.layers[indices[0]]))
    dy = rng.standard_normal((5, cfg.layers[indices[-1] + 1]))
    ref, tp = SerialStack(cfg.model, indices), TensorParallelStack(cfg.model, cfg.layout, mesh, indices)
    y_ref, c_ref = ref.forward(x, HeldBytes(), NonFiniteWatch())
    before = world.ledger.by_op[("activation", "tp-f-allreduce")][0]
    meter, done = HeldBytes(), []
    y, ctx = tp.forward(x.copy(), meter, NonFiniteWatch())
    assert np.allclose(y, y_ref, rtol=1e-13, atol=1e-13), indices
    dx_ref = ref.backward(c_ref, dy.copy(), HeldBytes())
    dx = tp.backward(ctx, dy.copy(), meter, done.append)
    assert meter.live == 0 and sorted(done) == sorted(indices), (meter.live, done)
    if indices[0] == 0:
        assert dx is None
    else:
        assert np.allclose(dx, dx_ref, rtol=1e-13, atol=1e-13), indices
    pieces = tp.full_pieces()
    if mesh.tp_index == 0:
        for (i, W, b), L in zip(pieces, ref.store.layers):
            assert i == L.index and np.array_equal(W, L.W) and np.array_equal(b, L.b)
    # gradients: reassemble this rank's shards against the serial full gradients
    kinds = ["column", "row"] * (len(indices) // 2) + ["replicated"] * (len(indices) % 2)
    k = mesh.tp_index
    for kind, L, R in zip(kinds, tp.store.layers, ref.store.layers):
        if kind == "column":
            h = R.dW.shape[1] // 2
            dW, db = R.dW[:, k * h:(k + 1) * h], R.db[k * h:(k + 1) * h]
        elif kind == "row":
            h = R.dW.shape[0] // 2
            dW, db = R.dW[k * h:(k + 1) * h], R.db
        else:
            dW, db = R.dW, R.db
        assert np.allclose(L.dW, dW, rtol=1e-13, atol=1e-13) and np.allclose(L.db, db, rtol=1e-13, atol=1e-13)
    # f is sent only when someone upstream wants dx: exactly when the stack does not start at 0.
    sent_f = world.ledger.by_op[("activation", "tp-f-allreduce")][0] - before
    want_f = sum(5 * cfg.layers[i] * 8 for i, kind in zip(indices, kinds) if kind == "column" and i > 0)
    assert sent_f == want_f, (indices, sent_f, want_f)
if world.rank == 0:
    print("STAGES OK")
"""


def test_stack_as_pipeline_stage(tmp_path):
    """Stacks that start mid-model, end at the logits, or hold an odd count: same numbers as serial."""
    script = tmp_path / "stage.py"
    script.write_text(STAGE_SCRIPT)
    res = run_script(2, script, timeout=60)
    assert res.returncode == 0 and "STAGES OK" in res.stdout, res.stdout[-2000:] + res.stderr[-3000:]
