"""The cost model against real runs: prediction == ledger, a mutated executor caught, calibrate's profile.

The in-process tests (no MPI job): tests/unit/costmodel/test_costmodel.py.
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import pytest

from simpar import costmodel as cm
from simpar.config import RunConfig
from simpar.costmodel import hardware
from tests.conftest import DIGITS, layer_sizes, train_json
from tests.mpiutil import run_script
from tests.paths import MPI_SCRIPTS
from tests.unit.costmodel.test_costmodel import run_plan

MUTATE = MPI_SCRIPTS / "mutate_executor.py"


# -- prediction == measurement, on real MPI runs --------------------------------------------------------

LAYOUTS = {  # name: (ranks, extra train arguments)
    "dp4": (4, ["--dp", "4", "--bucket-mb", "0.05"]),
    "dp2-root-accum": (2, ["--dp", "2", "--data-source", "root", "--grad-accum", "3", "--batch", "50"]),
    "zero1": (2, ["--dp", "2", "--zero", "1", "--optimizer", "adam"]),
    "zero2-accum": (3, ["--dp", "3", "--zero", "2", "--grad-accum", "2"]),
    "zero3": (3, ["--dp", "3", "--zero", "3", "--dtype", "float64"]),
    "tp2": (2, ["--tp", "2", "--data-source", "root"]),
    "pp2-gpipe": (2, ["--pp", "2", "--schedule", "gpipe", "--microbatches", "3", "--data-source", "root"]),
    "pp3-1f1b": (3, ["--pp", "3", "--schedule", "1f1b", "--microbatches", "5", "--batch", "62"]),
    "dp2xtp2": (4, ["--dp", "2", "--tp", "2", "--data-source", "root", "--bucket-mb", "0.02"]),
    "dp2xpp2": (4, ["--dp", "2", "--pp", "2", "--grad-accum", "2", "--optimizer", "adam"]),
    "dp3-rabenseifner": (3, ["--dp", "3", "--collectives", "rabenseifner", "--bucket-mb", "0.05"]),
    "dp4-tree": (4, ["--dp", "4", "--collectives", "tree"]),
    "dp2xtp2-ps": (4, ["--dp", "2", "--tp", "2", "--collectives", "ps"]),
    "dp3-mpi": (3, ["--dp", "3", "--collectives", "mpi"]),
}


def predicted_for(n: int, metrics: dict) -> dict:
    cfg = RunConfig(**{k: v for k, v in metrics["config"].items() if k in RunConfig.__dataclass_fields__})
    return cm.predict_from_config(cfg, n, steps=metrics["steps"], hw=hardware.LOCAL_DEFAULTS)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_prediction_equals_ledger(name, tmp_path):
    n, args = LAYOUTS[name]
    m = train_json(n, ["--steps", "2", "--kernels", "numpy", *args], tmp_path, timeout=120)
    pred = predicted_for(n, m)
    assert len(m["comm"]["ranks"]) == len(pred["comm"]["ranks"]) == len(m["memory"]["ranks"]) == n
    for measured, predicted in zip(m["comm"]["ranks"], pred["comm"]["ranks"]):
        assert measured["sent"] == predicted["sent"], (name, measured["rank"])
        assert measured["messages"] == predicted["messages"], (name, measured["rank"])
        ops = {
            k: v["sent"] for k, v in measured["by_op"].items() if not k.startswith("control/") and v["sent"]
        }
        assert ops == {k: v["sent"] for k, v in predicted["by_op"].items() if v["sent"]}, (
            name,
            measured["rank"],
        )
    assert cm.mismatches(m, pred) == []
    for r, (measured, predicted) in enumerate(zip(m["memory"]["ranks"], pred["memory"]["ranks"])):
        for kind in ("params", "grads", "optimizer", "activations_peak"):
            assert measured[kind] == predicted[kind], (name, r, kind)


# -- the witness is independent: change the executor's rules and the prediction disagrees -------------

MUTATIONS = {  # mutation: (ranks, train arguments, the category the changed rule moves bytes in)
    # Balanced, 64,16,128,128,10 splits [2, 2] (boundary width 128); the mutant cuts [1, 3], so the
    # boundary is 16 wide and stage 0 holds one layer's parameters instead of two.
    "stages": (2, ["--pp", "2", "--layers", "64,16,128,128,10"], "activation"),
    # One bucket of P = 42,634 elements over 4 ranks: P % 4 == 2, so chunks of 10659, 10659, 10658,
    # 10658 become 10660, 10658, 10658, 10658 and rank 1 sends one element less in the ring.
    "chunks": (4, ["--dp", "4", "--bucket-mb", "1"], "model"),
}


def mutated_run(mutation: str, n: int, args: list, tmp_path) -> dict:
    out = tmp_path / f"{mutation}.json"
    argv = [mutation, "--steps", "2", "--kernels", "numpy", "--quiet", "--metrics-out", str(out), *args]
    res = run_script(n, MUTATE, argv, timeout=120)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_mutated_executor_is_caught(mutation, tmp_path):
    """The same launch both ways: unpatched, the ledger equals the prediction; with the executor's
    stage split or chunk rule changed (tests/mpi/scripts/mutate_executor.py), `prediction_mismatches`
    says so."""
    n, args, category = MUTATIONS[mutation]
    assert sum(layer_sizes(DIGITS)) % 4 == 2  # with 0 or 1 left over both rules cut the same chunks
    assert mutated_run("none", n, args, tmp_path)["prediction_mismatches"] == []
    bad = mutated_run(mutation, n, args, tmp_path)["prediction_mismatches"]
    assert any(f" {category}: measured" in line for line in bad), bad


def test_calibrate_writes_a_usable_profile(tmp_path):
    """`bench --calibrate` measures GEMM, numpy.add and an MPI ping-pong (< 30 s), and `plan` reads it."""
    from simpar.cli.bench import bench_main

    path = tmp_path / "hw.json"
    with redirect_stdout(io.StringIO()):
        assert bench_main(["--calibrate", "-o", str(path)]) == 0
    hw = hardware.load(str(path))
    assert hw.flops["fp64"] > 1e8 and 0 < hw.intra_alpha < 1e-2 and hw.intra_bw > 1e7
    assert "hardware local" in run_plan("--dp", "2", "--hardware", str(path))
