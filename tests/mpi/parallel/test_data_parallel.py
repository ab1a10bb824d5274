"""Data parallelism on real MPI ranks equals the serial run, and moves exactly the bytes docs/design.md says.

The serial reference is `python -m simpar train` on one process; every parallel run must give the
same losses (every step) and the same final weights: float64 to ~1e-12 relative, float32 to ~1e-5.
"""

import numpy as np
import pytest

from tests.conftest import assert_same_model, layer_sizes, split_sizes, train_json

LAYERS = [64, 128, 128, 128, 10]
P = sum(layer_sizes(LAYERS))
STEPS = 8
BASE = ["--dtype", "float64", "--steps", str(STEPS)]


@pytest.mark.parametrize(
    "dp,extra",
    [
        (1, []),
        (2, []),
        (3, []),
        (4, []),
        (4, ["--no-overlap"]),
        (4, ["--bucket-mb", "0.02"]),  # several buckets in flight at once
        (2, ["--bucket-mb", "0.02", "--collectives", "ring"]),
    ],
)
def test_data_parallel_equals_serial_float64(tmp_path, serial, dp, extra):
    ref = serial(BASE)
    run = train_json(dp, BASE + extra, tmp_path)
    assert run["mesh"] == {"dp": dp, "tp": 1, "pp": 1}
    assert_same_model(run, ref, 1e-12)


@pytest.mark.parametrize("algorithm", ["rabenseifner", "tree", "ps", "mpi", "auto"])
def test_every_allreduce_algorithm_trains_the_serial_model(tmp_path, serial, algorithm):
    ref = serial(BASE)
    run = train_json(3, BASE + ["--collectives", algorithm, "--bucket-mb", "0.05"], tmp_path)
    assert_same_model(run, ref, 1e-12)
    assert run["comm"]["total_sent"]["model"] == 2 * (3 - 1) * P * 8 * STEPS  # all four: 2(p-1)N in total
    # MPI's own Allreduce hides its messages: its bytes are booked from a formula and must say so.
    assert run["comm"]["modeled_ops"] == (["model/grad-allreduce"] if algorithm == "mpi" else [])


@pytest.mark.parametrize(
    "n,layout",
    [
        (2, ["--tp", "2"]),
        (2, ["--pp", "2", "--activation", "gelu"]),
        (4, ["--dp", "2", "--tp", "2", "--collectives", "tree"]),
    ],
)
def test_model_parallel_layouts_with_numba_kernels(tmp_path, serial, n, layout):
    """The fused Numba kernels on the sharded paths (a row-parallel layer has no bias in its kernel)."""
    extra = ["--activation", "gelu"] if "gelu" in layout else []
    ref = serial(BASE + extra)
    run = train_json(n, BASE + layout + ["--kernels", "numba"], tmp_path)
    assert run["kernels"] == "numba"
    assert_same_model(run, ref, 1e-12)


def test_gradient_accumulation_equals_serial(tmp_path, serial):
    args = BASE + ["--batch", "60", "--optimizer", "adam", "--lr", "0.01"]
    ref = serial(args)
    run = train_json(3, args + ["--grad-accum", "4", "--bucket-mb", "0.05"], tmp_path)
    assert_same_model(run, ref, 1e-12)
    # accumulation communicates once per step, not once per micro-step
    assert run["comm"]["total_sent"]["model"] == 2 * (3 - 1) * P * 8 * STEPS


def test_uneven_batch_equals_serial(tmp_path, serial):
    args = BASE + ["--batch", "50"]  # 13, 13, 12, 12 rows
    ref = serial(args)
    assert_same_model(train_json(4, args, tmp_path), ref, 1e-12)


def test_float32_equals_serial(tmp_path, serial):
    args = ["--dtype", "float32", "--steps", str(STEPS)]
    ref = serial(args)
    run = train_json(2, args, tmp_path)
    assert_same_model(run, ref, 1e-5)
    assert run["weights"][0][0].dtype == np.float32


@pytest.mark.parametrize("p,dtype,bpe", [(2, "float64", 8), (4, "float32", 4), (3, "float64", 8)])
def test_ledger_ring_allreduce_bytes_are_exact(tmp_path, p, dtype, bpe):
    run = train_json(p, ["--dtype", dtype, "--steps", "5", "--bucket-mb", "0.05"], tmp_path)
    ranks = run["comm"]["ranks"]
    # all ranks together: exactly 2(p-1) * P * bpe per synchronised step
    assert run["comm"]["total_sent"]["model"] == 2 * (p - 1) * P * bpe * 5
    assert sum(r["received"]["model"] for r in ranks) == 2 * (p - 1) * P * bpe * 5
    # buckets of >= 0.05 MiB, filled from the last layer backwards (parallel/data.py)
    sizes, n_buckets, acc = layer_sizes(LAYERS), 0, 0
    for n in reversed(sizes):
        acc += n * bpe
        if acc >= 0.05 * 2**20:
            n_buckets, acc = n_buckets + 1, 0
    n_buckets += acc > 0
    assert n_buckets > 1
    for r in ranks:
        per_step = r["sent"]["model"] / 5
        # each rank: 2(p-1)/p * P elements, up to one element per chunk per bucket from uneven splits
        assert abs(per_step - 2 * (p - 1) / p * P * bpe) <= 2 * (p - 1) * n_buckets * bpe
        # a ring all-reduce is 2(p-1) messages per rank, once per bucket per step
        assert r["messages"]["model"] == 2 * (p - 1) * n_buckets * 5
        assert r["sent"]["data"] == 0 and r["sent"]["activation"] == 0


def test_data_source_root_scatters_exactly_the_rows(tmp_path, serial):
    args = BASE + ["--batch", "62"]
    run = train_json(4, args + ["--data-source", "root"], tmp_path)
    ref = serial(args)
    assert_same_model(run, ref, 1e-12)
    ranks = run["comm"]["ranks"]
    rows = split_sizes(62, 4)  # 16, 16, 15, 15
    per_row = 64 * 8 + 8  # inputs (float64) + int64 label
    assert ranks[0]["sent"]["data"] == sum(rows[1:]) * per_row * STEPS
    for r, n in zip(ranks[1:], rows[1:]):
        assert r["received"]["data"] == n * per_row * STEPS
        assert r["sent"]["data"] == 0


def test_local_data_source_moves_no_data(tmp_path):
    run = train_json(2, ["--steps", "3"], tmp_path)
    assert run["comm"]["total_sent"]["data"] == 0


def test_metrics_json_has_the_documented_keys(tmp_path):
    m = train_json(2, ["--steps", "3"], tmp_path)
    for key in (
        "config",
        "world_size",
        "mesh",
        "params",
        "losses",
        "final_loss",
        "accuracy",
        "comm",
        "memory",
        "time",
    ):
        assert key in m
    assert m["params"] == P and len(m["losses"]) == 3 and m["world_size"] == 2
    assert set(m["comm"]["ranks"][1]["sent"]) == {"data", "model", "activation"}
    assert set(m["comm"]["total_sent"]) == {"data", "model", "activation"}
    assert set(m["memory"]["ranks"][0]) == {"params", "grads", "optimizer", "activations_peak"}
    assert m["memory"]["ranks"][0]["params"] == P * 4
    assert m["time"]["total_s"] > 0 and m["time"]["samples_per_s"] > 0
