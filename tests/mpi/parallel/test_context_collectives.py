"""--cp (dense --arch gpt) with every --collectives: the dp x cp gradient all-reduce (parallel/context.py's
GradientBuckets over the mesh's `dpcp` group) runs the chosen algorithm, as --dp does. Equal to serial in
float64 (1e-12, the tolerance test_data_parallel.py holds every algorithm to: the non-ring sums only add
in another order), every rank's gradient bytes against the closed forms below, the prediction's bytes
exact, and --clock sim predict == simulate (1e-6) on cp2 and dp2 x cp2 on a GPU node (dgx-h100, where
--collectives ring and auto are priced as NCCL runs them and the others alpha-beta: costmodel/cp_time.py)
-- all cases in one mpiexec launch (scripts/train_layouts.py). With them, layouts whose other groups take the
algorithm: cp x tp, cp x pp, dp 4 with ps, and tp 4 --sp with tree, dp2 x tp2 with ps, tp2 x pp2 with
either (tp's blocking collectives followed rank by rank: costmodel/tp_group_time.py, and in pipeline
stages gpt_tp_group_pipeline.py).

Closed forms: one bucket of N = P elements (P = (V + S) H + L (12 H^2 + 13 H) + 2 H + H V) summed over
the p = dp C ranks of the dpcp group, rank r = d C + c (the world rank here), elements sent per step
(dp2 x cp2 with ps runs several buckets; their sums add up to the same):
    ring, auto, mpi (MPI hides its messages; the ledger books the ring's)   2 (p-1)/p N
    rabenseifner (recursive halving, then doubling; p a power of 2)        2 (p-1)/p N
    tree  N to the parent (r != 0) + N to each child, #{k : 2^k > r, r + 2^k < p}: p = 4 -> 2N 2N N N
    ps    the server (rank 0) (p-1) N, every worker N
All of them 2 (p-1) N over the group.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import assert_same_model
from tests.mpiutil import run_script
from tests.paths import MPI_SCRIPTS

L, H, A, S, V, B, STEPS = 2, 16, 4, 8, 16, 8, 2
ARGS = ["--arch", "gpt", "--n-layers", str(L), "--hidden", str(H), "--heads", str(A), "--seq-len", str(S)]
ARGS += ["--vocab", str(V), "--dataset", "copy", "--samples", "64", "--batch", str(B), "--steps", str(STEPS)]
ARGS += ["--dtype", "float64", "--optimizer", "adam", "--lr", "0.01", "--kernels", "numpy"]
P = (V + S) * H + L * (12 * H * H + 13 * H) + 2 * H + H * V
BPE = 8
ALGORITHMS = ["rabenseifner", "tree", "ps", "mpi", "auto"]
SIM = ["--clock", "sim", "--hardware", "dgx-h100"]


def grad_sent(algo: str, p: int, r: int) -> int:
    """Elements rank r of p sends in one all-reduce of N = P (module docstring; p | P here)."""
    if algo == "tree":
        children = sum(1 for k in range(3) if 2**k > r and r + 2**k < p)
        return ((1 if r else 0) + children) * P
    if algo == "ps":
        return (p - 1) * P if r == 0 else P
    return 2 * (p - 1) * P // p  # ring, auto, mpi (booked as the ring), rabenseifner


def cases() -> list:
    out = [["serial", 1, ARGS]]
    for algo in ALGORITHMS:
        coll = ["--collectives", algo]
        out.append([f"cp2-{algo}", 2, [*ARGS, "--cp", "2", *coll, *SIM]])
        # ps: several buckets, each queueing at the server behind the last (costmodel/ps_time.py)
        buckets = ["--bucket-mb", "0.01"] if algo == "ps" else []
        out.append([f"dp2xcp2-{algo}", 4, [*ARGS, "--dp", "2", "--cp", "2", *coll, *buckets, *SIM]])
    # the layouts that share the path: tp's all-reduces take the algorithm too; a pipeline stage's chunks
    rab, tree = ["--collectives", "rabenseifner", *SIM], ["--collectives", "tree", *SIM]
    out.append(["cp2xtp2-rabenseifner", 4, [*ARGS, "--cp", "2", "--tp", "2", *rab]])
    out.append(["cp2xpp2-tree", 4, [*ARGS, "--cp", "2", "--pp", "2", *tree]])
    # tp's blocking tree / ps all-reduces leave the group's ranks apart, the next collective starts from
    # there (costmodel/tp_group_time.py): --sp's rings between them, dp's ps buckets after them
    ps = ["--collectives", "ps", *SIM]
    out.append(["tp4-sp-tree", 4, [*ARGS, "--tp", "4", "--sp", *tree]])
    out.append(["dp2xtp2-ps", 4, [*ARGS, "--dp", "2", "--tp", "2", "--bucket-mb", "0.01", *ps]])
    # ... and inside pipeline stages, each tp rank also waiting for its own neighbour's message
    # (costmodel/gpt_tp_group_pipeline.py): the zero-bubble W passes, --sp with recomputation
    out.append(["tp2xpp2-tree-zbv", 4, [*ARGS, "--tp", "2", "--pp", "2", "--schedule", "zb-v", *tree]])
    sp_full = ["--sp", "--recompute", "full", "--microbatches", "2"]
    out.append(["tp2xpp2-sp-ps", 4, [*ARGS, "--tp", "2", "--pp", "2", *sp_full, *ps]])
    # --dp alone times its ps buckets the same way (gpt_time.py with ps_time.py)
    out.append(["dp4-ps", 4, [*ARGS, "--dp", "4", "--collectives", "ps", "--bucket-mb", "0.01", *SIM]])
    return out


def load(out, name: str) -> dict:
    run = json.loads((out / f"{name}.json").read_text())
    with np.load(out / f"{name}.npz") as z:
        run["weights"] = [(z[f"W{i}"], z[f"b{i}"]) for i in range(len(z.files) // 2)]
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("cp-collectives")
    todo = cases()
    res = run_script(4, MPI_SCRIPTS / "train_layouts.py", [str(out), json.dumps(todo)], timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return {name: load(out, name) for name, _, _ in todo}


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_every_allreduce_algorithm_trains_the_serial_model_with_exact_bytes(runs, algo):
    ref = runs["serial"]
    for dp in (1, 2):
        name = f"cp2-{algo}" if dp == 1 else f"dp2xcp2-{algo}"
        run, p = runs[name], 2 * dp
        assert run["mesh"]["cp"] == 2 and run["mesh"]["dp"] == dp, name
        assert run["config"]["collectives"] == algo, name
        assert_same_model(run, ref, rtol=1e-12)
        for r, rank in enumerate(run["comm"]["ranks"]):
            sent = rank["by_op"]["model/grad-allreduce"]["sent"]
            assert sent == STEPS * grad_sent(algo, p, r) * BPE == rank["sent"]["model"], (name, r)
        assert run["comm"]["total_sent"]["model"] == STEPS * 2 * (p - 1) * P * BPE, name
        assert run["comm"]["modeled_ops"] == (["model/grad-allreduce"] if algo == "mpi" else []), name
        assert run["prediction_mismatches"] == [], name  # costmodel/cp.py books the same, rank by rank


def test_layouts_sharing_the_path_train_the_serial_model(runs):
    shared = ("cp2xtp2-rabenseifner", "cp2xpp2-tree", "dp4-ps", "tp4-sp-tree", "dp2xtp2-ps", "tp2xpp2-sp-ps")
    for name in (*shared, "tp2xpp2-tree-zbv"):
        assert_same_model(runs[name], runs["serial"], rtol=1e-12)
        assert runs[name]["prediction_mismatches"] == [], name


def test_predict_equals_simulate_with_each_algorithm(runs):
    timed = [n for n in runs if n != "serial"]
    for name in timed:
        m = runs[name]
        sim, pred = m["time"]["sim"]["step_s"], m["predicted"]["time"]["step_s"]
        assert abs(pred / sim - 1) <= 1e-6, (name, sim, pred)
    # the algorithms are priced apart: tree's and the parameter server's two full-size rounds are not
    # Rabenseifner's halves, nor NCCL's ring
    steps = {a: runs[f"dp2xcp2-{a}"]["time"]["sim"]["step_s"] for a in ("rabenseifner", "tree", "auto")}
    assert len(set(steps.values())) == 3, steps
