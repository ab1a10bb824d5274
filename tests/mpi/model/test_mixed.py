"""Mixed precision (--precision mixed-fp16|mixed-bf16): the pieces (half kernels, scaled loss, the loss
scaler and its skipped steps), the same model as the serial run at the same precision, the ledger's
2-byte messages, and the ZeRO paper's memory table measured (Rajbhandari et al. 2020, sec. 3.1, Table 1).

Tolerance: the losses to TOL = 16 u, u the half format's unit roundoff (2**-11 float16, 2**-8 bfloat16).
A sharded layout sums the same half gradients in another order -- the ring adds p half-precision
partial sums chunk by chunk, while the serial run's gradient comes out of one float32 matmul rounded
once -- so each gradient element differs by up to about (p-1) roundings, and every step moves the
weights by slightly different amounts; after a few SGD steps the losses and weights agree to a few
units of u of their size, not to float64's 1e-12. (Measured on these 6 steps: at most ~3e-3 of the
largest weight for float16, ~6e-3 for bfloat16; losses ~1e-3 relative.) The weights: that bound
is more than a 6-step run's whole update, so they are held by what training did, the update w_T - w_0,
against serial's (tests/mpi/half_precision.py: within a tenth of its size; a 0.75 x learning rate or
no update at all fails, test_the_update_check_fails_a_wrong_learning_rate_and_no_training).
"""

from __future__ import annotations

import numpy as np
import pytest

from simpar.collectives import chunk_bounds
from tests.conftest import train_json
from tests.mpi.half_precision import assert_same_update, initial_weights, update_drift
from tests.mpiutil import run_mpi

LAYERS = [64, 128, 128, 128, 10]
SIZES = [a * b + b for a, b in zip(LAYERS[:-1], LAYERS[1:])]
P = sum(SIZES)
STEPS = 6
BASE = ["--steps", str(STEPS), "--batch", "64"]
TOL = {"mixed-fp16": 16 * 2.0**-11, "mixed-bf16": 16 * 2.0**-8}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    cache: dict = {}

    def run(n: int, *args: str) -> dict:
        if (n, args) not in cache:
            cache[(n, args)] = train_json(n, [*BASE, *args], tmp_path_factory.mktemp("mixed"), timeout=180)
            cache[(n, args)]["args"] = [*BASE, *args]  # what initial_weights needs to rebuild w_0
        return cache[(n, args)]

    return run


def chunk(n: int, p: int, r: int) -> int:
    b = chunk_bounds(n, p)
    return int(b[r + 1] - b[r])


def flat(weights) -> np.ndarray:
    return np.concatenate([np.concatenate((W.ravel(), b)) for W, b in weights])


def assert_same_model(got: dict, ref: dict, tol: float) -> None:
    """The losses to tol; the weights moved as serial's did (the update w_T - w_0, half_precision.py)."""
    np.testing.assert_allclose(got["losses"], ref["losses"], rtol=tol)
    assert_same_update(got["weights"], ref["weights"], initial_weights(ref["args"]))


# -- whole runs ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "precision,n,zero",
    [
        ("mixed-fp16", 4, 0),
        ("mixed-fp16", 3, 1),
        ("mixed-fp16", 4, 2),
        ("mixed-fp16", 3, 3),
        ("mixed-bf16", 3, 0),
        ("mixed-bf16", 4, 3),
    ],
)
def test_same_model_as_serial_at_the_same_precision(runs, precision, n, zero):
    ref = runs(1, "--precision", precision)
    m = runs(n, "--precision", precision, "--zero", str(zero))
    assert_same_model(m, ref, TOL[precision])
    assert m["prediction_mismatches"] == [] and ref["prediction_mismatches"] == []
    # Messages are half precision: data parallel 2(p-1)/p * P * 2 bytes per step over all ranks ...
    factor = 3 if zero == 3 else 2
    assert m["comm"]["total_sent"]["model"] == STEPS * factor * (n - 1) * P * 2
    assert m["precision"] == {
        "name": precision,
        "loss_scale": m["precision"]["loss_scale"],
        "skipped_steps": 0,
        "skipped_at": [],
    }
    assert m["accuracy"] > 0.2  # learning (chance is 0.1) after 6 steps


def test_zero_papers_memory_table_measured(runs):
    """Table 1 of the ZeRO paper, per rank, mixed precision with Adam (K = 12), N_d = 4:
         DP      2P + 2P + 12P                       = 16P
         P_os    2P + 2P + 12 P/N_d
         P_os+g  2P + (2 + 12) P/N_d
         P_os+g+p (2 + 2 + 12) P/N_d
    measured exactly, where P/N_d is this rank's chunk (uneven: P = 42,634 is not a multiple of 4),
    and stages 2/3 also hold the one full layer (n_max) they work on at a time (zero.py)."""
    p, adam = 4, ("--precision", "mixed-fp16", "--optimizer", "adam", "--lr", "0.005")
    ref = runs(1, *adam)
    n_max = max(SIZES)
    rows = {}
    for stage in (0, 1, 2, 3):
        m = runs(p, *adam, "--zero", str(stage))
        assert m["prediction_mismatches"] == []
        np.testing.assert_allclose(m["losses"], ref["losses"], rtol=TOL["mixed-fp16"])
        for r, mem in enumerate(m["memory"]["ranks"]):
            S = sum(chunk(n, p, r) for n in SIZES)  # stages 2/3: my chunk of every layer
            want = {
                0: (2 * P, 2 * P, 12 * P),
                1: (2 * P, 2 * P, 12 * chunk(P, p, r)),
                2: (2 * P, 2 * (S + n_max), 12 * S),
                3: (2 * (S + n_max), 2 * (S + n_max), 12 * S),
            }[stage]
            assert (mem["params"], mem["grads"], mem["optimizer"]) == want, (stage, r)
        rows[stage] = max(sum(r[k] for k in ("params", "grads", "optimizer")) for r in m["memory"]["ranks"])
    assert rows[0] == 16 * P and rows[0] > rows[1] > rows[2] > rows[3]
    assert rows[1] < 4 * P + 12 * P / p + 12  # 2P + 2P + K P/N_d, up to the uneven chunk


def test_overflowing_steps_are_skipped_alike_everywhere(runs):
    """A loss scale of 2**21 overflows float16 (max 65504) in backward: the first steps are skipped and
    the scale halves until the gradients fit (2**18 here). Serial, dp, ZeRO-3 (whose ranks each
    see a shard and vote) and dp2 x tp2 (tp shards: the world votes) skip the same steps and then
    train the same model."""
    args = ("--precision", "mixed-fp16", "--loss-scale", str(2.0**21))
    ref = runs(1, *args)
    skipped = ref["precision"]["skipped_at"]
    assert skipped[:2] == [1, 2] and len(skipped) < STEPS  # later ones as the gradients grow
    assert ref["precision"]["loss_scale"] == 2.0**21 / 2 ** len(skipped)
    for n, layout in ((2, ("--zero", "0")), (3, ("--zero", "3")), (4, ("--dp", "2", "--tp", "2"))):
        m = runs(n, *args, *layout)
        assert m["precision"]["skipped_at"] == skipped
        assert_same_model(m, ref, TOL["mixed-fp16"])
        assert m["prediction_mismatches"] == []


@pytest.mark.parametrize(
    "precision,n,layout",
    [  # float16 with an overflowing scale: the stages vote, so all skip the same steps
        ("mixed-fp16", 4, ("--pp", "4", "--schedule", "zb-h1", "--loss-scale", str(2.0**21))),
        ("mixed-bf16", 4, ("--dp", "2", "--pp", "2", "--schedule", "interleaved", "--virtual-stages", "2")),
    ],
)
def test_pipeline_at_half_precision(runs, precision, n, layout):
    """Pipeline stages in half precision: 2-byte activations and gradients between them (rows x 128
    x 2 bytes per boundary each way), the loss scale applied on the last stage, and the overflow vote
    over the pp group; the same model as serial at the same precision (TOL).

    The M = 4 micro-batches add their half gradients (+=), as serial --grad-accum 4 does over the
    same 16-row parts; the plain serial gradient is one float32 matmul rounded once. Near float16's
    limit that decides which steps overflow (serial skips steps 1, 2, 4 of this scale, --grad-accum 4
    steps 1, 2, 3), so the overflow case is held to --grad-accum 4."""
    scale = list(layout[layout.index("--loss-scale") :]) if "--loss-scale" in layout else []
    ref = runs(1, "--precision", precision, *(["--grad-accum", "4", *scale] if scale else []))
    m = runs(n, "--precision", precision, *layout)
    assert m["precision"]["skipped_at"] == ref["precision"]["skipped_at"]
    assert_same_model(m, ref, TOL[precision])
    assert m["prediction_mismatches"] == []
    opt = dict(zip(layout[::2], layout[1::2]))
    S, dp, V = int(opt["--pp"]), int(opt.get("--dp", 1)), int(opt.get("--virtual-stages", 1))
    C = S * V  # one layer per chunk here: every boundary is a hidden width, 128
    for r in m["comm"]["ranks"]:
        mine = range(r["coords"]["pp"], C, S)
        per_boundary = STEPS * (64 // dp) * 128 * 2
        assert r["by_op"].get("activation/pp-send-act", {}).get("sent", 0) == per_boundary * sum(
            c < C - 1 for c in mine
        )
        assert r["by_op"].get("activation/pp-send-grad", {}).get("sent", 0) == per_boundary * sum(
            c > 0 for c in mine
        )
    got = [r["activations_peak"] for r in m["memory"]["ranks"]]
    assert got == [r["activations_peak"] for r in m["predicted"]["memory"]["ranks"]]


@pytest.mark.parametrize(
    "precision,layout",
    [
        ("mixed-fp16", ("--dp", "2", "--tp", "2", "--optimizer", "adam", "--lr", "0.005")),
        ("mixed-bf16", ("--tp", "2", "--pp", "2")),
    ],
)
def test_tensor_parallel_at_half_precision(runs, precision, layout):
    """Megatron's f and g all-reduce half activations and gradients (2-byte elements), each rank keeps
    2 + 2 + K bytes per parameter of its own shard (K = 12 Adam, 8 SGD with momentum: the float32
    master and moments of the shard), and the same model as serial at the same precision (TOL).

    LAYERS has 4 layers: pairs (0, 1) and (2, 3), column then row, also as two pipeline stages. Per
    micro-step a pair (c, c+1) all-reduces rows x LAYERS[c+2] in g and, unless c = 0, rows x LAYERS[c]
    in f; a ring over t = 2 ranks sends 2(t-1)/t N = N elements from each rank."""
    opt = dict(zip(layout[::2], layout[1::2]))
    ref = runs(
        1, "--precision", precision, *layout[layout.index("--optimizer") :] if "--optimizer" in opt else ()
    )
    m = runs(4, "--precision", precision, *layout)
    if "--optimizer" in opt:
        # Adam scales each element's step to about lr whatever its gradient: an element whose gradient
        # is near 0 may step either way under another summation order (dp4 alone differs 0.02 here).
        # So the losses to TOL, as in the ZeRO table, and the weights to 2 lr per step.
        np.testing.assert_allclose(m["losses"], ref["losses"], rtol=TOL[precision])
        assert np.abs(flat(m["weights"]) - flat(ref["weights"])).max() <= 2 * 0.005 * STEPS
        # and the update to 0.15 of serial's, not DRIFT's 0.1: those sign flips measured 0.096 here
        # (a 0.75 x learning rate still scales Adam's whole update by 0.75: 0.25 off)
        assert_same_update(m["weights"], ref["weights"], initial_weights(ref["args"]), drift=0.15)
    else:
        assert_same_model(m, ref, TOL[precision])
    assert m["prediction_mismatches"] == [] and m["precision"]["skipped_at"] == []
    t, dp, S = int(opt["--tp"]), int(opt.get("--dp", 1)), int(opt.get("--pp", 1))
    K = 12 if opt.get("--optimizer") == "adam" else 8
    rows = STEPS * 64 // dp  # every tp rank of a replica sees the replica's rows
    stage_layers = {0: [0, 1, 2, 3]} if S == 1 else {0: [0, 1], 1: [2, 3]}
    column = lambda a, b: a * b // t + b // t  # noqa: E731  W[:, cols], b[cols]
    row = lambda a, b: a // t * b + b  # noqa: E731  W[rows, :], the whole b
    for r, mem in zip(m["comm"]["ranks"], m["memory"]["ranks"]):
        mine = stage_layers[r["coords"]["pp"]]
        pairs = mine[::2]
        g = sum(rows * LAYERS[c + 2] for c in pairs)
        f = sum(rows * LAYERS[c] for c in pairs if c > 0)
        assert r["by_op"]["activation/tp-g-allreduce"]["sent"] == 2 * (t - 1) // t * g * 2
        assert r["by_op"].get("activation/tp-f-allreduce", {}).get("sent", 0) == 2 * (t - 1) // t * f * 2
        shard = sum(column(*LAYERS[c : c + 2]) + row(*LAYERS[c + 1 : c + 3]) for c in pairs)
        assert (mem["params"], mem["grads"], mem["optimizer"]) == (2 * shard, 2 * shard, K * shard)
        # dp replicas all-reduce only their shard's half gradients: 2(dp-1)/dp * shard * 2 bytes
        assert (
            r["by_op"].get("model/grad-allreduce", {}).get("sent", 0)
            == STEPS * 2 * (dp - 1) * shard * 2 // dp
        )


@pytest.mark.parametrize(
    "precision,layout",
    [("mixed-fp16", ("--tp", "2", "--pp", "2")), ("mixed-bf16", ("--dp", "2", "--tp", "2", "--sp"))],
)
def test_residual_mlp_tensor_parallel_at_half_precision(runs, precision, layout):
    """--arch resmlp's blocks split over tp (restensor.py) at half precision, also sequence parallel
    (--sp: LayerNorm's rows gathered and scattered in half precision): the same model as serial, and the
    ledger's 2-byte messages as the cost model predicts them (prediction_mismatches checks every op)."""
    ref = runs(1, "--arch", "resmlp", "--precision", precision)
    m = runs(4, "--arch", "resmlp", "--precision", precision, *layout)
    assert_same_model(m, ref, TOL[precision])
    assert m["prediction_mismatches"] == [] and m["comm"]["total_sent"]["activation"] > 0


def test_bfloat16_batches_scattered_from_root(runs):
    local = runs(3, "--precision", "mixed-bf16", "--zero", "0")
    root = runs(3, "--precision", "mixed-bf16", "--zero", "0", "--data-source", "root")
    assert root["losses"] == local["losses"] and root["prediction_mismatches"] == []
    assert root["comm"]["total_sent"]["data"] > 0  # 2-byte rows, as the cost model predicts


def test_simulated_clock_charges_two_bytes(runs):
    """Under --clock sim the kernels are charged by their real itemsize: the mixed run's step time
    equals the cost model's 'mixed' prediction within 5%, as the tests hold fp32 layouts to."""
    m = runs(2, "--precision", "mixed-fp16", "--clock", "sim", "--hardware", "dgx-h100")
    sim, pred = m["time"]["sim"]["step_s"], m["predicted"]["time"]["step_s"]
    assert abs(pred / sim - 1) <= 0.05, (sim, pred)


@pytest.mark.parametrize(
    "args,message",
    [
        (["--precision", "mixed-bf16", "--dtype", "float64"], "float32 master"),
        (["--precision", "mixed-bf16", "--collectives", "mpi"], "cannot sum bfloat16"),
        (["--precision", "fp8"], "invalid choice"),
    ],
)
def test_unsupported_combinations_are_one_line(args, message):
    res = run_mpi(2, ["train", "--steps", "1", *args], timeout=60)
    assert res.returncode == 2 and res.stderr.count("simpar: error:") == 1, res.stderr[-2000:]
    assert message in res.stderr and "Traceback" not in res.stderr


def test_checkpoints_keep_masters_moments_and_the_loss_scale(tmp_path):
    """A mixed-precision checkpoint holds the float32 masters and Adam's moments as slots and the
    scaler's state as scalars: resuming on the same sum order (any dp/ZeRO layout) continues bit for
    bit, skipped steps included; on one rank, within TOL (another summation order, module docstring)."""
    ckpt = tmp_path / "ckpt"
    common = ["--batch", "64", "--steps", "8", "--optimizer", "adam", "--lr", "0.005"]
    common += ["--precision", "mixed-fp16", "--loss-scale", str(2.0**20)]  # overflows at first: skips
    ref = train_json(
        2, [*common, "--zero", "3", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "4"], tmp_path, "ref"
    )
    assert ref["precision"]["skipped_at"][:2] == [1, 2]
    step4 = str(ckpt / "step-000004")
    for n, layout, tol in ((2, ["--zero", "1"], 0.0), (1, [], TOL["mixed-fp16"])):
        got = train_json(n, [*common, *layout, "--resume", step4], tmp_path, f"r{n}")
        np.testing.assert_allclose(got["losses"], ref["losses"][4:], rtol=tol, atol=0)
        assert got["precision"]["skipped_at"] == ref["precision"]["skipped_at"]
        assert got["precision"]["loss_scale"] == ref["precision"]["loss_scale"]
        if tol == 0:
            assert all(np.array_equal(a, b) for a, b in zip(flat(got["weights"]), flat(ref["weights"])))
        else:  # another summation order: the update since step 0 as the reference's (half_precision.py)
            assert_same_update(got["weights"], ref["weights"], initial_weights(common))
    bad = run_mpi(1, ["train", *common[:-4], "--resume", step4], timeout=60)  # fp32 from a mixed one
    assert bad.returncode == 2 and "--precision" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.parametrize("precision", ["mixed-fp16", "mixed-bf16"])
def test_the_update_check_fails_a_wrong_learning_rate_and_no_training(runs, precision):
    """The weights check must tell a wrong run from a right one: the dp4 layout stepping with 0.75 x
    the learning rate (0.24 of serial's update off, measured), and a run that never updated (its
    weights are w_0: 1.0 off). The old check, 16 u of the largest weight, let both bfloat16 ones pass."""
    ref = runs(1, "--precision", precision)
    w0 = initial_weights(ref["args"])
    slow = runs(4, "--precision", precision, "--zero", "0", "--lr", str(0.75 * 0.05))  # default --lr 0.05
    assert update_drift(w0, ref["weights"], w0) == 1.0
    for wrong in (slow["weights"], w0):
        with pytest.raises(AssertionError, match="differs from the reference's"):
            assert_same_update(wrong, ref["weights"], w0)
    right = runs(4, "--precision", precision, "--zero", "0" if precision == "mixed-fp16" else "3")
    assert_same_update(right["weights"], ref["weights"], w0)  # and a right one passes
