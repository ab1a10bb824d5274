"""The simulated clock (--clock sim): the real run on a simulated cluster's time.

* The numerics are the real run's: same losses, same bytes as --clock wall.
* Simulated time is deterministic (--compute model), and each rank's step splits exactly into
  compute + exposed communication + idle.
* Predict == simulate: the cost model's step time (closed-form recurrences, never calling the code it
  predicts) agrees with the simulated clock to 1e-6 (measured: rounding) on every layout the tour runs,
  on every preset hardware profile and on a test profile of nodes of 2 devices (so groups cross an
  inter-node link), at two model sizes. Both sides are deterministic, so this is a check of the closed form.
"""

from __future__ import annotations

import json

import pytest

from simpar.run.launch import launch, run
from tests.mpiutil import run_script
from tests.paths import MPI_SCRIPTS

# Two devices per node: on 4 ranks the dp and pp groups leave the node, the tp group of 2 does not.
TWO_PER_NODE = {
    "name": "two-per-node",
    "description": "test profile: nodes of 2 devices, 10 us and 5 GB/s between nodes",
    "flops": {"fp64": 20e12, "fp32": 40e12, "mixed": 80e12},
    "gamma": 3 / 1e12,
    "intra_alpha": 2e-6,
    "intra_bw": 100e9,
    "devices_per_node": 2,
    "inter_alpha": 10e-6,
    "nic_bw": 5e9,
    "nics_per_node": 1,
}


def test_same_losses_and_bytes_as_the_wall_clock_and_a_trace_in_simulated_time(tmp_path):
    common = dict(dp=2, pp=2, dtype="float64", steps=3, batch=32)
    wall = launch(4, **common)
    sim = launch(4, clock="sim", hardware="dgx-h100", trace=True, **common)
    assert sim["losses"] == wall["losses"]
    for a, b in zip(sim["comm"]["ranks"], wall["comm"]["ranks"]):
        assert a["sent"] == b["sent"] and a["received"] == b["received"]
    t = sim["time"]["sim"]
    assert t["hardware"] == "dgx-h100" and "simulated" in t["unit"]
    assert t["samples_per_s"] == pytest.approx(32 / t["step_s"])
    # The trace's timestamps are simulated microseconds since the start: 3 steps of a few tens of us.
    compute = [e for e in sim["trace"] if e["args"]["kind"] in ("forward", "backward")]
    assert compute and max(e["ts"] + e["dur"] for e in compute) <= 3 * t["step_s"] * 1e6 * 1.0001
    assert min(e["ts"] for e in compute) >= 0


def test_simulated_time_is_deterministic_and_adds_up():
    runs = [
        launch(4, tp=2, pp=2, schedule="1f1b", steps=3, clock="sim", hardware="dgx-h100") for _ in range(2)
    ]
    assert runs[0]["time"]["sim"] == runs[1]["time"]["sim"]
    for r in runs[0]["time"]["sim"]["per_rank"]:
        assert r["compute_s"] + r["comm_exposed_s"] + r["idle_s"] == pytest.approx(r["step_s"], rel=1e-9)
        assert r["compute_s"] > 0 and r["comm_exposed_s"] > 0
    # a 2-stage pipeline leaves stages idle: the bubble shows up as idle time
    assert max(r["idle_s"] for r in runs[0]["time"]["sim"]["per_rank"]) > 0


@pytest.mark.parametrize(
    "hardware, layers",
    [
        # every preset once (and nodes of two devices, where dp and pp groups cross nodes): the closed
        # form and the clock agree on every profile; a wider model on two of them
        ("dgx-h100", "64,256,256,256,10"),
        ("two-per-node", "64,128,128,128,10"),
        ("local", "64,128,128,128,10"),
        ("h200", "64,128,128,128,10"),
        ("dgx-a100", "64,128,128,128,10"),
        ("ib-cluster", "64,128,128,128,10"),
        ("ethernet-100g", "64,128,128,128,10"),
    ],
)
def test_predict_equals_simulate_on_every_tour_layout(tmp_path, hardware, layers):
    if hardware == "two-per-node":
        (tmp_path / "hw.json").write_text(json.dumps(TWO_PER_NODE))
        hardware = str(tmp_path / "hw.json")
    out = tmp_path / "tour"
    res = run(
        4,
        [
            "tour",
            "--clock",
            "sim",
            "--hardware",
            hardware,
            "--layers",
            layers,
            "--steps",
            "2",
            "--out",
            str(out),
            "--no-plots",
        ],
        timeout=240,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    layouts = sorted(out.glob("*.json"))
    names = {p.stem for p in layouts}
    assert {"serial", "dp4", "dp4-zero3", "pp4-1f1b", "dp2xtp2", "tp2xpp2"} <= names
    for path in layouts:
        if path.stem == "trace":
            continue
        m = json.loads(path.read_text())
        sim, pred = m["time"]["sim"]["step_s"], m["predicted"]["time"]["step_s"]
        # 1e-6 on every layout, ZeRO's included: the last layer's 1,290 parameters split 323/323/322/322
        # over 4 ranks, so at each blocking ring round the clock waits for the bigger chunk; the closed
        # form follows all 4 ranks round by round (costmodel/zero_time.py). Measured: ~1e-15.
        assert abs(pred / sim - 1) <= 1e-6, (path.stem, hardware, sim, pred)
    assert "speedup" in res.stdout and "time per step, simulated on" in res.stdout


@pytest.mark.parametrize("zero", [2, 3])
def test_zero_with_uneven_rows_and_accumulation_equals_the_closed_form(tmp_path, zero):
    """ZeRO with --grad-accum 2 and a batch of 30 (micro-steps of 15 rows: 4/4/4/3 over the ranks, so
    the ranks' compute differs too) on nodes of two: the ring rounds wait on uneven chunks AND uneven
    rows; the closed form (costmodel/zero_time.py) follows every rank."""
    (tmp_path / "hw.json").write_text(json.dumps(TWO_PER_NODE))
    m = launch(
        4, dp=4, zero=zero, grad_accum=2, batch=30, steps=2, layers="64,128,128,10",
        clock="sim", hardware=str(tmp_path / "hw.json"),
    )  # fmt: skip
    assert m["prediction_mismatches"] == []
    assert m["predicted"]["time"]["step_s"] == pytest.approx(m["time"]["sim"]["step_s"], rel=1e-9)


GPT = "--arch gpt --n-layers 2 --hidden 16 --heads 4 --seq-len 8 --vocab 16 --dataset copy --batch 8".split()
DDP_RANK_BY_RANK = [  # (ranks, profile, --collectives, options); pred/sim - 1 before the closed form
    # followed every dp rank through every bucket's rounds (costmodel/rounds_time.py)
    (3, "dgx-h100", "ring", []),  # +1.3e-6: chunks of 3 that differ by an element
    (3, "local", "rabenseifner", []),  # +1.4e-2: folding rank 1 waits on rank 0's halving
    (3, "two-per-node", "tree", []),  # +57%: rank 0 takes in both children at once; 3 ranks on nodes of 2
    (4, "two-per-node", "ps", []),  # +17%: a bucket's pushes leave early workers before the last reply
    (3, "dgx-h100", "tree", GPT),  # +19%: gpt_time's buckets, the same rounds
    # -7.2e-2: a resmlp block's gradients reach the buckets after its f all-reduce (steptime.bucket_starts)
    (2, "dgx-h100", "ring", ["--arch", "resmlp", "--tp", "2"]),
]


def test_ddp_buckets_followed_rank_by_rank_equal_the_simulated_clock(tmp_path):
    """Data parallelism over several gradient buckets (--bucket-mb 0.01) with each --collectives
    algorithm where its ranks end apart: dp 3 (uneven chunks and rows, a part-filled node on nodes of
    two), and the parameter server on dp 4. One launch (tests/mpi/scripts/train_layouts.py)."""
    (tmp_path / "hw.json").write_text(json.dumps(TWO_PER_NODE))
    profiles = {"two-per-node": str(tmp_path / "hw.json")}
    cases = []
    for i, (n, hardware, algorithm, extra) in enumerate(DDP_RANK_BY_RANK):
        args = ["--dp", str(n), "--collectives", algorithm, "--bucket-mb", "0.01", "--steps", "2", *extra]
        ranks = n * (int(extra[extra.index("--tp") + 1]) if "--tp" in extra else 1)
        cases.append(
            [f"case{i}", ranks, [*args, "--clock", "sim", "--hardware", profiles.get(hardware, hardware)]]
        )
    res = run_script(4, MPI_SCRIPTS / "train_layouts.py", [str(tmp_path), json.dumps(cases)], timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    for (name, _, _), case in zip(cases, DDP_RANK_BY_RANK):
        m = json.loads((tmp_path / f"{name}.json").read_text())
        assert m["predicted"]["time"]["step_s"] == pytest.approx(m["time"]["sim"]["step_s"], rel=1e-9), case


def test_native_mpi_allreduce_gets_closed_form_time_and_is_marked_modeled():
    m = launch(4, dp=4, steps=2, clock="sim", hardware="dgx-h100", collectives="mpi")
    assert m["comm"]["modeled_ops"] == ["model/grad-allreduce"]
    assert m["time"]["sim"]["step_s"] == pytest.approx(m["predicted"]["time"]["step_s"], rel=1e-9)


def test_bad_clock_options_are_one_line(tmp_path):
    res = run(0, ["train", "--clock", "sim", "--hardware", "no-such-cluster", "--steps", "1"], timeout=60)
    assert res.returncode == 2 and res.stderr.count("simpar: error:") == 1 and "no-such-cluster" in res.stderr
    assert "Traceback" not in res.stderr
    # tp 2 on nodes of 3 devices: tp group [0, 1] inside node 0, [2, 3] across nodes 0 and 1 -- no one
    # link for the closed form to price tp's collectives on (run/setup.check_placement)
    (tmp_path / "hw.json").write_text(json.dumps({**TWO_PER_NODE, "devices_per_node": 3}))
    args = ["train", "--dp", "2", "--tp", "2", "--steps", "1", "--clock", "sim", "--hardware"]
    res = run(4, [*args, str(tmp_path / "hw.json")], timeout=60)
    assert res.returncode == 2 and res.stderr.count("simpar: error:") == 1, res.stderr[-2000:]
    assert "tp groups' members unevenly on nodes" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize(
    "n, layout",
    [
        (4, dict(pp=4, schedule="zb-h1", microbatches=8)),
        (4, dict(dp=2, pp=2, schedule="interleaved", virtual_stages=2, microbatches=4, recompute="full")),
        (4, dict(tp=2, pp=2, schedule="zb-h1", microbatches=4, recompute="selective")),
        (4, dict(dp=2, pp=2, schedule="zb-v", microbatches=4, recompute="full")),
    ],
)
def test_predict_equals_simulate_on_the_new_schedules(n, layout):
    """ZB-H1's W passes, interleaved chunks, ZB-V's V (its turn handed over in memory) and
    recomputation: the cost model's recurrence (its own
    orders, costmodel/order.py) against the simulated clock, which charges what actually runs: equal
    to rounding, since the B pass really leaves every layer's dW, db to the W pass (model.py)."""
    m = launch(n, clock="sim", hardware="dgx-h100", layers="64,128,128,128,10", steps=2, batch=64, **layout)
    assert m["prediction_mismatches"] == []
    assert m["time"]["sim"]["step_s"] == pytest.approx(m["predicted"]["time"]["step_s"], rel=1e-9)
    measured = [r["activations_peak"] for r in m["memory"]["ranks"]]
    assert measured == [r["activations_peak"] for r in m["predicted"]["memory"]["ranks"]]


# One node of CPU cores, as the local profile describes this machine: MPI moves bytes only while a rank
# is inside it, so a DDP bucket started during backward runs when the rank waits for it.
CPU_NODE = {
    "name": "cpu-node",
    "description": "test profile: 8 CPU ranks on one node, MPI progressed by the ranks themselves",
    "flops": {"fp64": 20e9, "fp32": 40e9, "mixed": 40e9},
    "gamma": 1 / 10e9,
    "intra_alpha": 20e-6,
    "intra_bw": 5e9,
    "devices_per_node": 8,
    "layer_overhead": 10e-6,
    "host_progress": True,
}


def test_host_progress_buckets_overlap_nothing_and_the_model_agrees(tmp_path):
    """With host_progress the overlapped buckets cost exactly what --no-overlap costs (every bucket runs
    after backward, on the rank's time); without it, the same buckets hide behind backward. Every bucket
    is one layer here (--bucket-mb 0.001), so there are three to overlap."""
    steps = {}
    for host in (True, False):
        path = tmp_path / f"host-{host}.json"
        path.write_text(json.dumps({**CPU_NODE, "host_progress": host}))
        for overlap in (True, False):
            m = launch(
                2, dp=2, layers="64,256,256,10", batch=64, steps=2, dtype="float64", bucket_mb=0.001,
                no_overlap=not overlap, clock="sim", hardware=str(path),
            )  # fmt: skip
            sim = m["time"]["sim"]
            assert m["predicted"]["time"]["step_s"] == pytest.approx(sim["step_s"], rel=1e-9), (host, overlap)
            steps[host, overlap] = sim["step_s"]
            if host:
                assert all(r["comm_overlapped_s"] == 0 for r in sim["per_rank"])
    assert steps[True, True] == pytest.approx(steps[True, False], rel=1e-12)
    assert steps[False, False] == pytest.approx(steps[True, False], rel=1e-12)
    assert steps[False, True] < steps[False, False]  # on a GPU-like profile the overlap pays


# tp's tree and ps all-reduces leave the group's ranks apart (the root / server is done early), and the
# next collective starts from there: the closed form follows every tp rank (costmodel/chunk_tp_group.py,
# steptime.py's per-rank clock). Before it: mlp tp4 ps +1.2e-3 on dgx-h100, +8.4e-2 on nodes of two,
# resmlp tp4 --sp tree +9.9e-3. One launch (tests/mpi/scripts/train_layouts.py), seven cases.
TP_TREE_PS = [
    ("mlp-tp4-ps", ["--tp", "4", "--collectives", "ps"]),
    ("resmlp-tp4-sp-tree", ["--arch", "resmlp", "--tp", "4", "--sp", "--collectives", "tree"]),
    ("resmlp-tp2xpp2-sp-ps", ["--arch", "resmlp", "--tp", "2", "--pp", "2", "--sp", "--collectives", "ps"]),
    ("mlp-tp2xpp2-tree-zbh1", ["--tp", "2", "--pp", "2", "--schedule", "zb-h1", "--collectives", "tree"]),
]


def test_tp_tree_and_ps_all_reduces_agree(tmp_path):
    (tmp_path / "hw.json").write_text(json.dumps(TWO_PER_NODE))
    common = ["--layers", "64,128,128,128,128,10", "--batch", "32", "--steps", "2", "--microbatches", "2"]
    common += ["--clock", "sim", "--hardware"]
    cases = [[name, 4, [*common, str(tmp_path / "hw.json"), *args]] for name, args in TP_TREE_PS]
    cases += [[f"{name}-dgx", 4, [*common, "dgx-h100", *args]] for name, args in TP_TREE_PS[:2]]
    # dp's buckets start from each tp rank's own clock, and tp index j's dp group is the ranks (d, j):
    # rounds_time.ddp_steps follows each group (a resmlp block's buckets after its f tree)
    buckets = ["--arch", "resmlp", "--dp", "2", "--tp", "2", "--bucket-mb", "0.01", "--collectives", "tree"]
    cases.append(["resmlp-dp2xtp2-tree-buckets", 4, [*common, str(tmp_path / "hw.json"), *buckets]])
    res = run_script(4, MPI_SCRIPTS / "train_layouts.py", [str(tmp_path), json.dumps(cases)], timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    for name, _, _ in cases:
        m = json.loads((tmp_path / f"{name}.json").read_text())
        sim, pred = m["time"]["sim"]["step_s"], m["predicted"]["time"]["step_s"]
        assert abs(pred / sim - 1) <= 1e-6, (name, sim, pred)
        assert m["prediction_mismatches"] == [], name
