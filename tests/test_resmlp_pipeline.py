"""--arch resmlp under pipeline parallelism: units cut into stages, the residual stream between them.

In-process: a unit's backward split into its B half (dL/dx) and W half (the weight gradients) adds up
to the fused backward, and the stages are the parameter-balanced split of the UNITS, found here by
trying every split. Over MPI, each schedule (naive, gpipe, 1f1b, interleaved, zb-h1) at S = 2 and 4
(interleaved at S = 4 on a model of 8 units), and --dp 2 --pp 2, trains the serial model
(float64 1e-12, one float32 run 1e-5); every boundary moves rows x d x bpe forward and back per
micro-batch; each rank's activation peak is the cost model's (also under --recompute full and
selective); on the simulated clock the cost model's step time agrees. Checkpoints cross layouts: saved
by dp2 x pp2, resumed on dp2, whose own checkpoint is resumed on pp2 with zb-h1.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import kernels
from simpar import costmodel as cm
from simpar.config import RunConfig
from simpar.model.mlp import deferred_weight_grads
from simpar.model.precision import HalfKernels
from simpar.model.resmlp import BlockUnit, LinearUnit
from simpar.parallel.base import HeldBytes, NonFiniteWatch
from simpar.parallel.pipeline import recompute
from simpar.parallel.pipeline.partition import partition_layers
from simpar.parallel.resmlp_stack import UnitStack
from simpar.runtime.context import Runtime
from tests.conftest import assert_same_model, split_sizes, train_json

D = 96
LAYERS = [64, D, D, D, D, D, 10]  # 6 units: input projection, 4 blocks, output projection
STEPS, BATCH = 6, 60
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


def unit_params(widths: list[int]) -> list[int]:
    """Parameters per unit: projections fan_in * fan_out + fan_out, a block of width d 2d^2 + 4d
    (LayerNorm's gamma and beta, W1 and b1, W2 and b2)."""
    sizes = [a * b + b for a, b in zip(widths[:-1], widths[1:])]
    return [sizes[0], *(2 * d * d + 4 * d for d in widths[1:-2]), sizes[-1]]


def unit_split(widths: list[int], parts: int) -> list[tuple[int, int]]:
    """The README's rule by brute force: contiguous non-empty runs of units, the largest run's
    parameter count as small as possible; among equally good splits the later runs longest."""
    sizes = unit_params(widths)
    n, best = len(sizes), None
    for cuts in itertools.combinations(range(1, n), parts - 1):
        edges = [0, *cuts, n]
        counts = [b - a for a, b in zip(edges, edges[1:])]
        key = (max(sum(sizes[a:b]) for a, b in zip(edges, edges[1:])), [-c for c in reversed(counts)])
        best = min(best, (key, edges)) if best else (key, edges)
    return list(zip(best[1], best[1][1:]))


# -- in-process ------------------------------------------------------------------------------------


@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_backward_halves_add_up_to_the_fused_backward(act):
    rng = np.random.default_rng(0)
    block, proj = BlockUnit(1, 7, act), LinearUnit(0, 5, 7, "none")
    for unit, width, need_dx in ((block, 7, True), (proj, 5, False), (proj, 5, True)):
        flat = unit.init(3, np.float64) + 0.1 * rng.standard_normal(unit.size)
        x, dy = rng.standard_normal((4, width)), rng.standard_normal((4, 7))
        _, ctx = unit.forward(flat, x)
        fused, split = np.zeros(unit.size), np.zeros(unit.size)
        dx = unit.backward(flat, fused, ctx, dy, need_dx)
        dx_b, weight_pass = unit.backward_input(flat, split, ctx, dy, need_dx)
        assert not split.any()  # B touches no weight gradient ...
        weight_pass()  # ... W adds them all
        np.testing.assert_allclose(split, fused, rtol=1e-12, atol=1e-14)
        if need_dx:
            np.testing.assert_allclose(dx_b, dx, rtol=1e-12, atol=1e-14)
        else:
            assert dx is None and dx_b is None
    # Half precision: B and W round where the fused backward's HalfKernels do: the same numbers.
    saved, block.rt = block.rt, Runtime(kernels=HalfKernels(kernels.load("numpy"), np.float16))
    try:
        flat = block.init(3, np.float16)
        x, dy = (rng.standard_normal((4, 7)).astype(np.float16) for _ in range(2))
        _, ctx = block.forward(flat, x)
        fused, split = np.zeros(block.size, np.float16), np.zeros(block.size, np.float16)
        dx = block.backward(flat, fused, ctx, dy)
        dx_b, weight_pass = block.backward_input(flat, split, ctx, dy)
        weight_pass()
        np.testing.assert_array_equal(dx_b, dx)
        np.testing.assert_array_equal(split, fused)
    finally:
        block.rt = saved
    # What the zb-h1 pipeline does: backward inside deferred_weight_grads queues one W pass per unit.
    flat = block.init(3, np.float64)
    _, ctx = block.forward(flat, x := rng.standard_normal((4, 7)))
    grads = np.zeros(block.size)
    with deferred_weight_grads() as pending:
        block.backward(flat, grads, ctx, np.ones((4, 7)))
    assert len(pending) == 1 and not grads.any()


def test_selective_recompute_rebuilds_what_the_forward_kept():
    """A chunk [projection, block, block] keeps its input x (64 per row), the projection's output and
    block 1's (96 each: the next units' inputs) and both blocks' z1 (96 each); the backward's rebuilt
    Contexts equal the forward's array for array."""
    stack = UnitStack(RunConfig(layers=LAYERS, arch="resmlp", dtype="float64"), [0, 1, 2])
    x = np.random.default_rng(2).standard_normal((5, 64))
    _, contexts = stack.forward(x, HeldBytes(), NonFiniteWatch())
    saved = recompute.save("selective", x, contexts)
    assert saved.held == 5 * (64 + 4 * D) * 8
    rebuilt = recompute.restore("selective", saved, stack)
    assert recompute.context_bytes(rebuilt) == recompute.context_bytes(contexts)
    for old, new in zip(contexts, rebuilt):
        old = old.arrays if hasattr(old, "arrays") else (old.x, old.z, old.y)
        new = new.arrays if hasattr(new, "arrays") else (new.x, new.z, new.y)
        for a, b in zip(old, new):
            np.testing.assert_array_equal(a, b)


def test_stages_are_runs_of_units_balanced_by_parameters():
    for widths in (LAYERS, [64, 32, 32, 32, 10], [8, 64, 64, 64, 64, 64, 64, 100], [784, 16, 16, 16, 10]):
        for parts in range(1, len(widths)):
            want = unit_split(widths, parts)
            assert partition_layers(widths, parts, arch="resmlp") == want, (widths, parts)
            spec = cm.Spec(widths=widths, batch=8, pp=parts, arch="resmlp")
            assert cm.stage_bounds(spec) == want, (widths, parts)
    assert unit_split(LAYERS, 4) == [(0, 2), (2, 3), (3, 4), (4, 6)]  # blocks weigh ~3x a projection


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


# 16 units of roundoff of the half format: layouts add the same half gradients in other orders
# (tests/test_mixed.py explains the tolerance). SGD: Adam would turn the roundoff in a tiny
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
    assert_same_model(m, ref, TOL[precision])
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
