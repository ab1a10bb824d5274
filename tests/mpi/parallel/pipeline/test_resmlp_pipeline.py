"""--arch resmlp under pipeline parallelism on real ranks: every schedule trains the serial model.

The in-process tests (no MPI job): tests/unit/parallel/pipeline/test_resmlp_pipeline.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import assert_same_model, split_sizes, train_json
from tests.mpi.half_precision import assert_same_update, initial_weights
from tests.unit.parallel.pipeline.test_resmlp_pipeline import BATCH, LAYERS, STEPS, unit_params, unit_split

COMMON = [
    "--arch",
    "resmlp",
    "--layers",
    ",".join(map(str, LAYERS)),
    "--steps",
    str(STEPS),
    "--batch",
    str(BATCH),
    "--optimizer",
    "adam",
    "--lr",
    "0.002",
]
F64 = [*COMMON, "--dtype", "float64"]


# -- over MPI --------------------------------------------------------------------------------------


def rows_on(dp_rank: int, dp: int, accum: int) -> int:
    """Rows a data-parallel rank trains per step: each accumulation step's rows, np.array_split dp ways."""
    return sum(split_sizes(k_rows, dp)[dp_rank] for k_rows in split_sizes(BATCH, accum))


def check_run(
    m: dict, *, dp: int = 1, pp: int, V: int = 1, accum: int = 1, steps: int = STEPS, widths=LAYERS
):
    """Bytes to the closed form, memory and time to the cost model, for a run of `steps` steps."""
    d_model = widths[1]
    bpe = 2 if m["config"]["precision"] != "fp32" else 8 if m["config"]["dtype"] == "float64" else 4
    C = pp * V  # model chunks: rank s holds s, s + S, ...; every boundary carries the d-wide stream
    bounds = unit_split(widths, C)
    params = unit_params(widths)
    assert m["params"] == sum(params)
    for r in m["comm"]["ranks"]:
        s, d = r["coords"]["pp"], r["coords"]["dp"]
        chunks = range(s, C, pp)
        rows = rows_on(d, dp, accum)
        ops = r["by_op"]
        act = sum(c < C - 1 for c in chunks) * steps * rows * d_model * bpe
        grad = sum(c > 0 for c in chunks) * steps * rows * d_model * bpe
        assert ops.get("activation/pp-send-act", {}).get("sent", 0) == act
        assert ops.get("activation/pp-send-grad", {}).get("sent", 0) == grad
        # dp = 2: a ring all-reduce of N elements sends N from each rank, per step
        own = sum(sum(params[lo:hi]) for lo, hi in (bounds[c] for c in chunks))
        model = own * bpe * steps if dp == 2 else 0
        assert r["sent"]["model"] == model and r["sent"]["data"] == 0
    got = [r["activations_peak"] for r in m["memory"]["ranks"]]
    assert got == [r["activations_peak"] for r in m["predicted"]["memory"]["ranks"]]
    assert m["prediction_mismatches"] == []
    if "sim" in m["time"]:  # predict == simulate, as for every MLP layout (test_simclock.py)
        sim, pred = m["time"]["sim"]["step_s"], m["predicted"]["time"]["step_s"]
        assert abs(pred / sim - 1) <= 0.05, (sim, pred)


SIM = ["--clock", "sim", "--hardware", "dgx-h100"]
LAYOUTS = [  # (ranks, options, float32?); S = 2 and 4 for each schedule, extras folded in
    (2, ["--pp", "2", "--schedule", "naive"], False),
    (4, ["--pp", "4", "--schedule", "naive", "--microbatches", "3"], True),
    (2, ["--pp", "2", "--schedule", "gpipe", "--grad-accum", "2", "--recompute", "selective"], False),
    (4, ["--pp", "4", "--schedule", "gpipe", "--recompute", "full"], False),
    (4, ["--pp", "4", "--schedule", "1f1b", "--recompute", "full", *SIM], False),
    (
        2,
        ["--pp", "2", "--schedule", "interleaved", "--virtual-stages", "3", "--recompute", "selective", *SIM],
        False,
    ),
    (4, ["--pp", "4", "--schedule", "zb-h1", *SIM], False),
]


@pytest.mark.parametrize("n,layout,f32", LAYOUTS, ids=lambda v: "-".join(v) if isinstance(v, list) else None)
def test_each_schedule_trains_the_serial_model(tmp_path, serial, n, layout, f32):
    args = [*COMMON, "--dtype", "float32"] if f32 else F64
    ref = serial(args)
    m = train_json(n, [*args, *layout], tmp_path)
    assert_same_model(m, ref, 1e-5 if f32 else 1e-12)
    opt = dict(zip(layout[::2], layout[1::2]))
    V = int(opt.get("--virtual-stages", 1))
    check_run(m, pp=int(opt["--pp"]), V=V, accum=int(opt.get("--grad-accum", 1)))
    assert ref["losses"][-1] < ref["losses"][0]


def test_interleaved_on_four_stages(tmp_path, serial):
    """S = 4, V = 2: eight chunks, one unit each (a model of 6 blocks), micro-batches in groups of 4."""
    widths = [64, 48, 48, 48, 48, 48, 48, 48, 10]
    args = [*F64]
    args[args.index("--layers") + 1] = ",".join(map(str, widths))
    m = train_json(4, [*args, "--pp", "4", "--schedule", "interleaved", "--virtual-stages", "2"], tmp_path)
    assert_same_model(m, serial(args), 1e-12)
    check_run(m, pp=4, V=2, widths=widths)


# The losses to 16 units of roundoff of the half format: layouts add the same half gradients in other orders
# (tests/mpi/model/test_mixed.py explains the tolerance). SGD: Adam would turn the roundoff in a tiny
# gradient into a full step of lr.
TOL = {"mixed-fp16": 16 * 2.0**-11, "mixed-bf16": 16 * 2.0**-8}
HALF = [*COMMON[:-4], "--lr", "0.05"]


@pytest.mark.parametrize(
    "precision,n,layout",
    [
        ("mixed-fp16", 4, ["--pp", "4", "--schedule", "zb-h1"]),
        (
            "mixed-bf16",
            4,
            ["--dp", "2", "--pp", "2", "--schedule", "interleaved", "--virtual-stages", "3"]
            + ["--recompute", "selective"],
        ),
    ],
)
def test_residual_blocks_in_half_precision(tmp_path, serial, precision, n, layout):
    """LayerNorm and the B/W halves compute in float32 from half inputs and round once, as the
    matmuls do (precision.HalfKernels): 2-byte boundaries, 2 + 2 + K bytes per parameter, the same
    model as serial at the same precision."""
    ref = serial([*HALF, "--precision", precision])
    m = train_json(n, [*HALF, "--precision", precision, *layout], tmp_path)
    np.testing.assert_allclose(m["losses"], ref["losses"], rtol=TOL[precision])
    # the weights by their update since step 0, as serial's (tests/mpi/half_precision.py)
    assert_same_update(m["weights"], ref["weights"], initial_weights([*HALF, "--precision", precision]))
    assert ref["prediction_mismatches"] == [] and m["precision"]["skipped_steps"] == 0
    opt = dict(zip(layout[::2], layout[1::2]))
    dp, V = int(opt.get("--dp", 1)), int(opt.get("--virtual-stages", 1))
    check_run(m, dp=dp, pp=int(opt["--pp"]), V=V)
    for r in m["memory"]["ranks"]:
        assert r["optimizer"] == 4 * r["params"]  # SGD with momentum: float32 master + velocity, K = 8


def test_checkpoints_cross_layouts(tmp_path, serial):
    """dp2 x pp2 (1f1b) saves; dp2 resumes at step 2 and saves; pp2 (zb-h1) resumes at step 4. Each
    continues the serial run (float64 1e-12) and moves exactly the predicted bytes."""
    ref = serial(F64)
    save = ["--checkpoint-every", "2", "--checkpoint-dir"]
    first = train_json(4, [*F64, "--dp", "2", "--pp", "2", *save, str(tmp_path / "a")], tmp_path, "a")
    assert_same_model(first, ref, 1e-12)
    check_run(first, dp=2, pp=2)
    resume = ["--resume", str(tmp_path / "a" / "step-000002")]
    second = train_json(2, [*F64, "--dp", "2", *resume, *save, str(tmp_path / "b")], tmp_path, "b")
    resume = ["--resume", str(tmp_path / "b" / "step-000004")]
    third = train_json(2, [*F64, "--pp", "2", "--schedule", "zb-h1", *resume], tmp_path, "c")
    for run, start in ((second, 2), (third, 4)):
        assert run["checkpoint"]["start_step"] == start
        np.testing.assert_allclose(run["losses"], ref["losses"][start:], rtol=1e-12)
        for (W, b), (Wr, br) in zip(run["weights"], ref["weights"]):
            assert W.shape == Wr.shape and np.abs(W - Wr).max() <= 1e-12 * np.abs(Wr).max()
            assert b.shape == br.shape
        assert run["prediction_mismatches"] == []
    check_run(third, pp=2, steps=STEPS - 4)
