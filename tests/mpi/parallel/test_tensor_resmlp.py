"""--arch resmlp under tensor parallelism (--tp) and sequence parallelism (--sp): the same model as the
serial run (float64 1e-12, float32 1e-5), the ledger against closed forms written here, activation
memory measured == formula == cost model, checkpoints across tp / sp / serial, and bad input.

The formulas (README "Residual blocks under --tp and --sp"): t tp ranks, rows r of a micro-step on
one dp rank, d the residual width, N = r*d; tp rank k, chunk sizes c = np.array_split sizes of N.
  --tp       per block per micro-step: g all-reduce N forward + f all-reduce N backward:
             2 * (2N - c_k - c_(k+1)) elements
  --tp --sp  per block per micro-step: 2 ring all-gathers (N - c_(k+1)) + 2 ring reduce-scatters
             (N - c_k): the same elements; plus once per step an all-reduce over tp of each block's
             gamma, beta (2d) and each projection's parameters
  kept for backward per row: --tp  input projection d_in; block 3d + 1 + 2d/t; output projection d
                             --sp  (d_in + blocks (2d + 1) + d) on r/t rows; blocks d + 2d/t on r rows
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import assert_same_model, split_sizes, train_json
from tests.mpi.parallel.test_tensor_parallel import ring_allreduce_sent
from tests.mpiutil import run_mpi

D_IN, D, CLASSES, BLOCKS = 64, 96, 10, 2
LAYERS = [D_IN] + [D] * (BLOCKS + 1) + [CLASSES]
BATCH, STEPS = 64, 4
COMMON = [
    "--arch", "resmlp", "--layers", ",".join(map(str, LAYERS)), "--batch", str(BATCH),
    "--steps", str(STEPS), "--optimizer", "adam", "--lr", "0.005",
]  # fmt: skip
F64 = [*COMMON, "--dtype", "float64"]


def local_params(t: int) -> int:
    """Parameters on one tp rank: projections whole; a block's gamma, beta, b2 whole, W1's columns,
    b1's columns and W2's rows of this rank."""
    dl = D // t
    return (D_IN * D + D) + BLOCKS * (3 * D + 2 * D * dl + dl) + (D * CLASSES + CLASSES)


def activation_elems(t: int, rows: int, sp: bool) -> int:
    """Elements kept for backward at the peak (one micro-step: everything is held until backward)."""
    shard = rows // t if sp else rows
    return shard * (D_IN + D) + BLOCKS * (shard * (2 * D + 1) + rows * (D + 2 * (D // t)))


def ring_reduce_scatter_sent(n: int, p: int, k: int) -> int:
    return n - split_sizes(n, p)[k]


def ring_allgather_sent(n: int, p: int, k: int) -> int:
    return n - split_sizes(n, p)[(k + 1) % p]


def assert_ledger(run: dict, t: int, dp: int, accum: int, sp: bool, bpe: int) -> None:
    rows = BATCH // dp // accum
    n = rows * D
    for r in run["comm"]["ranks"]:
        k, ops, times = r["coords"]["tp"], r["by_op"], STEPS * accum * BLOCKS
        got = lambda op: ops.get(op, {"sent": 0})["sent"]
        allreduce = times * ring_allreduce_sent(n, t, k) * bpe  # one of g, f
        if sp:
            assert got("activation/sp-gather") == 2 * times * ring_allgather_sent(n, t, k) * bpe
            assert got("activation/sp-scatter") == 2 * times * ring_reduce_scatter_sent(n, t, k) * bpe
            sizes = [D_IN * D + D] + [2 * D] * BLOCKS + [D * CLASSES + CLASSES]
            sp_grads = STEPS * sum(ring_allreduce_sent(s, t, k) for s in sizes) * bpe
            assert got("model/sp-grad-allreduce") == sp_grads
        else:
            assert got("activation/tp-g-allreduce") == got("activation/tp-f-allreduce") == allreduce
            sp_grads = 0
        # the paper's point: reduce-scatter + all-gather send exactly what the all-reduces send
        assert r["sent"]["activation"] == 2 * allreduce
        # data parallelism over 2 ranks: a ring all-reduce of N sends 2N - c_0 - c_1 = N of each bucket
        assert r["sent"]["model"] == sp_grads + (STEPS * local_params(t) * bpe if dp == 2 else 0)
        mem = run["memory"]["ranks"][r["rank"]]
        assert mem["params"] == mem["grads"] == local_params(t) * bpe
        assert mem["activations_peak"] == activation_elems(t, rows, sp) * bpe
    assert run["prediction_mismatches"] == []
    assert [m["activations_peak"] for m in run["memory"]["ranks"]] == [
        m["activations_peak"] for m in run["predicted"]["memory"]["ranks"]
    ]


def test_tp_and_sp_match_serial_and_the_formulas_and_checkpoints_cross_layouts(serial, tmp_path):
    """dp2 x tp2 and dp2 x tp2 --sp (with --grad-accum 2, saving a checkpoint at step 2) against the
    serial run in float64; the sp checkpoint resumed on tp2 without sp and on one rank."""
    ref = serial(F64)
    assert ref["losses"][-1] < ref["losses"][0]
    tp = train_json(4, [*F64, "--dp", "2", "--tp", "2"], tmp_path, "tp")
    assert_same_model(tp, ref, 1e-12)
    assert_ledger(tp, t=2, dp=2, accum=1, sp=False, bpe=8)

    ckpt = tmp_path / "ckpt"
    sp_args = ["--dp", "2", "--tp", "2", "--sp", "--grad-accum", "2", "--checkpoint-every", "2"]
    sim = ["--clock", "sim", "--hardware", "dgx-h100"]  # changes no number, only adds the simulated step
    sp = train_json(4, [*F64, *sp_args, *sim, "--checkpoint-dir", str(ckpt)], tmp_path, "sp")
    assert_same_model(sp, ref, 1e-12)
    assert_ledger(sp, t=2, dp=2, accum=2, sp=True, bpe=8)
    # the cost model's step time (costmodel/resblocks.py) against the simulated clock, as every layout
    assert abs(sp["predicted"]["time"]["step_s"] / sp["time"]["sim"]["step_s"] - 1) <= 0.05

    for n, layout in ((2, ["--tp", "2"]), (1, [])):
        resumed = train_json(n, [*F64, *layout, "--resume", str(ckpt / "step-000002")], tmp_path, f"r{n}")
        assert resumed["checkpoint"]["start_step"] == 2
        np.testing.assert_allclose(resumed["losses"], ref["losses"][2:], rtol=1e-12)
        for (W, b), (Wr, br) in zip(resumed["weights"], ref["weights"]):
            assert np.abs(W - Wr).max() <= 1e-12 * np.abs(Wr).max() and b.shape == br.shape
        assert resumed["prediction_mismatches"] == []


def test_sp_over_four_ranks_matches_serial_in_float32(serial, tmp_path):
    ref = serial([*COMMON, "--dtype", "float32"])
    run = train_json(4, [*COMMON, "--dtype", "float32", "--tp", "4", "--sp"], tmp_path, "sp4")
    assert_same_model(run, ref, 1e-5)
    assert_ledger(run, t=4, dp=1, accum=1, sp=True, bpe=4)


@pytest.mark.parametrize(
    "args,message",
    [
        (["--tp", "2", "--sp"], "--sp splits the rows of the residual stream over the tp group"),
        (
            ["--arch", "resmlp", "--tp", "2", "--sp", "--batch", "63"],
            "must be a multiple of dp*grad-accum*tp",
        ),
    ],
)
def test_sp_misuse_is_one_line(args, message):
    res = run_mpi(2, ["train", "--steps", "1", *args], timeout=60)
    assert res.returncode == 2 and res.stderr.count("simpar: error:") == 1, res.stderr[-2000:]
    assert message in res.stderr and "Traceback" not in res.stderr
