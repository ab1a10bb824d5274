"""--arch gpt on the simulated clock (--clock sim): predict == simulate.

gpt.py's units (and tensor_gpt.py's, vocab_parallel.py's shares of them, gpt_split.py's B and W halves)
charge the clock for their matmuls and memory passes; the cost model writes the same charges again:
costmodel/gpt_time.py (serial, dp, tp: data parallelism's buckets overlapping the last backward, tensor
parallelism's collectives blocking inside each unit), cp_time.py (context parallelism's ring hops
overlapping their blocks; with tp, tp's all-reduces blocking), gpt_zero_time.py (ZeRO's blocking
rings) and gpt_pipeline_time.py (steptime.py's max-plus recurrences over the schedule's order and the
pipeline's links). Both sides are deterministic, so they agree to rounding (measured ~1e-15) on every
layout the tour runs -- serial, dp, ZeRO 1-3, tp, tp + sp, pp (GPipe, 1F1B), dp x tp, dp x pp, tp x pp
(and + sp), cp2, cp4, dp2 x cp2, cp2 x tp2, cp4-ulysses -- in bfloat16 on nodes of two GPUs (dp and pp
groups then cross nodes) and in float16 on the CPU profile; on every pipeline schedule (float32, on a
GPU node or the CPU profile) with and without recomputation; and on tp x pp with every schedule, the
zero-bubble ones' B and W halves of each tp share included.
ZeRO with chunks that differ by an element (dp 3; h = 10 on dp 4), where the ranks drift apart inside
each ring, agrees as well: the closed form follows every rank through every round.
"""

from __future__ import annotations

import json

import pytest

from simpar.run.launch import run
from tests.mpi.runtime.test_simclock import TWO_PER_NODE
from tests.mpiutil import run_script
from tests.paths import MPI_SCRIPTS

SHAPE = ["--arch", "gpt", "--n-layers", "2", "--hidden", "16", "--heads", "4", "--seq-len", "8"]
SHAPE += ["--vocab", "16", "--dataset", "copy", "--samples", "64", "--batch", "8", "--steps", "2"]
TOUR_LAYOUTS = {"serial", "dp4", "dp4-zero1", "dp4-zero2", "dp4-zero3", "tp4", "tp4-sp", "dp2xtp2"}
TOUR_LAYOUTS |= {"dp2xtp2-sp", "pp4-gpipe", "pp4-1f1b", "dp2xpp2", "cp2", "cp4", "dp2xcp2", "cp4-ulysses"}
TOUR_LAYOUTS |= {"tp2xpp2", "tp2xpp2-sp", "cp2xtp2", "dp2xcp2-zero1", "cp2xpp2"}


def hardware_option(tmp_path, hardware: str) -> str:
    if hardware != "two-per-node":
        return hardware
    (tmp_path / "hw.json").write_text(json.dumps(TWO_PER_NODE))
    return str(tmp_path / "hw.json")


def assert_agrees(m: dict, what) -> None:
    sim, pred = m["time"]["sim"]["step_s"], m["predicted"]["time"]["step_s"]
    assert abs(pred / sim - 1) <= 1e-6, (what, sim, pred)
    assert m["prediction_mismatches"] == [], what


@pytest.mark.parametrize(
    "hardware, precision",
    # fp32 on a GPU node is every schedule's case below; the tours take the other precisions and placements
    [("two-per-node", "mixed-bf16"), ("local", "mixed-fp16")],
)
def test_predict_equals_simulate_on_every_gpt_tour_layout(tmp_path, hardware, precision):
    out = tmp_path / "tour"
    args = ["tour", *SHAPE, "--clock", "sim", "--hardware", hardware_option(tmp_path, hardware), "--no-plots"]
    res = run(4, [*args, "--precision", precision, "--out", str(out)], timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    names = {p.stem for p in out.glob("*.json")} - {"trace"}
    assert TOUR_LAYOUTS <= names, names
    table = res.stdout[res.stdout.index("time per step, simulated") :]
    assert " MFU" in table.splitlines()[1] and "(MFU: model FLOPs per step" in table, table[:400]
    for name in sorted(names):
        m = json.loads((out / f"{name}.json").read_text())
        if precision == "mixed-fp16":  # the closed form has every step update (none skipped)
            assert m["precision"]["skipped_steps"] == 0, name
        assert_agrees(m, (name, hardware, precision))


# Every schedule gpt's pipeline runs, on pp2 x dp2 (the buckets overlap the last backward or W pass)
# or pp4 alone; interleaved needs 2 x 2 chunks of units (6 blocks); a few with recomputation or
# mixed precision or gradient accumulation on top.
SCHEDULES = [
    ("naive", ["--dp", "2", "--pp", "2"]),
    ("gpipe", ["--pp", "4", "--grad-accum", "2"]),
    ("1f1b", ["--dp", "2", "--pp", "2", "--recompute", "selective"]),
    ("interleaved", ["--pp", "2", "--dp", "2", "--virtual-stages", "2", "--n-layers", "6"]),
    ("zb-h1", ["--dp", "2", "--pp", "2", "--precision", "mixed-bf16"]),
    ("zb-v", ["--pp", "2", "--dp", "2", "--recompute", "full"]),
]


@pytest.mark.parametrize("schedule, extra", SCHEDULES, ids=[s for s, _ in SCHEDULES])
def test_every_gpt_pipeline_schedule_agrees(tmp_path, schedule, extra):
    hardware = "local" if schedule in ("gpipe", "interleaved", "zb-v") else "dgx-h100"  # each profile 3 times
    path = tmp_path / "m.json"
    args = ["train", *SHAPE, "--clock", "sim", "--hardware", hardware, "--schedule", schedule]
    res = run(4, [*args, "--microbatches", "4", *extra, "--quiet", "--metrics-out", str(path)], timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert_agrees(json.loads(path.read_text()), (schedule, hardware))


# tp inside pipeline stages (gpt_tp_pipeline.py, gpt_pipeline_time.py with tp): each unit's tp share and
# its blocking tp collectives in the recurrences, --sp's 1/t boundaries and LayerNorm sums, recomputation;
# the zero-bubble schedules' B and W halves of each tp share (tensor_gpt_split.py), every tp message in B
# but the embedding's --sp all-gather in its W; zb-h1 with --sp, zb-v without; --sp with a non-ring
# all-reduce algorithm.
TP_PP = [
    ("dgx-h100", ["--schedule", "1f1b", "--recompute", "selective"]),
    ("local", ["--schedule", "gpipe", "--sp", "--precision", "mixed-fp16", "--grad-accum", "2"]),
    ("two-per-node", ["--schedule", "interleaved", "--virtual-stages", "2", "--recompute", "full"]),
    ("dgx-h100", ["--schedule", "naive", "--sp", "--precision", "mixed-bf16"]),
    ("local", ["--schedule", "zb-h1", "--sp", "--precision", "mixed-bf16"]),
    ("dgx-h100", ["--schedule", "zb-v", "--recompute", "full"]),
    # --sp's and the loss's all-gathers and reduce-scatters run as NCCL's ring whatever --collectives
    # picks for the all-reduces: priced alpha-beta instead, the step came out 3e-4 short
    ("dgx-h100", ["--schedule", "1f1b", "--sp", "--collectives", "rabenseifner"]),
]


@pytest.mark.parametrize("hardware, extra", TP_PP, ids=[f"{h}-{e[1]}-{e[-1]}" for h, e in TP_PP])
def test_tp_inside_pipeline_stages_agrees(tmp_path, hardware, extra):
    path = tmp_path / "m.json"
    args = ["train", *SHAPE, "--clock", "sim", "--hardware", hardware_option(tmp_path, hardware)]
    res = run(
        4,
        [
            *args,
            "--tp",
            "2",
            "--pp",
            "2",
            "--microbatches",
            "2",
            *extra,
            "--quiet",
            "--metrics-out",
            str(path),
        ],
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert_agrees(json.loads(path.read_text()), (hardware, extra))


def test_grad_accum_and_the_cpu_profile_agree_too(tmp_path):
    """--grad-accum 2 with dp2 x tp2 --sp on the `local` profile (host progress: the buckets wait for
    the rank), float64; and ZeRO-2 with accumulation (its reduce-scatters in the last micro-step only)."""
    for extra in (["--dp", "2", "--tp", "2", "--sp", "--dtype", "float64"], ["--dp", "4", "--zero", "2"]):
        path = tmp_path / "m.json"
        args = ["train", *SHAPE, "--clock", "sim", "--hardware", "local", *extra, "--grad-accum", "2"]
        res = run(4, [*args, "--quiet", "--metrics-out", str(path)])
        assert res.returncode == 0, res.stderr[-3000:]
        m = json.loads(path.read_text())
        assert m["predicted"]["time"]["step_s"] == pytest.approx(m["time"]["sim"]["step_s"], rel=1e-9), extra


H10 = ["--hidden", "10", "--heads", "2"]  # blocks of 1330 parameters: chunks 333, 333, 332, 332 on dp 4
UNEVEN = {  # (ranks, ZeRO stage, options); on nodes of two devices dp 3 leaves rank 2 alone on the
    # second node, with its NIC to itself (runtime/network.py counts the ranks placed there: was -1.6e-2)
    "dgx-h100": [(3, "2", []), (4, "3", H10), (3, "1", [])],
    "local": [(3, "3", []), (4, "2", H10)],
    "two-per-node": [(4, "3", H10), (4, "1", H10), (3, "2", [])],
}


@pytest.mark.parametrize("hardware", sorted(UNEVEN))
def test_zero_with_uneven_chunks_agrees(tmp_path, hardware):
    """ZeRO where dp does not divide the units: the tour's shape on dp 3 (blocks of 3280 parameters:
    chunks 1094, 1093, 1093) and h = 10 on dp 4; on two-per-node the dp group crosses nodes."""
    hw = hardware_option(tmp_path, hardware)
    for n, stage, extra in UNEVEN[hardware]:
        path = tmp_path / "m.json"
        args = ["train", *SHAPE, "--clock", "sim", "--hardware", hw, "--dp", str(n), "--zero", stage, *extra]
        res = run(n, [*args, "--quiet", "--metrics-out", str(path)])
        assert res.returncode == 0, res.stderr[-3000:]
        assert_agrees(json.loads(path.read_text()), (hardware, n, stage))


# dp 3 x pp 2 (6 ranks): each stage's DDP buckets followed on every dp rank (gpt_pipeline_time.py through
# rounds_time.ddp_steps). Before, each rank's own critical path: the tree on dp 3 was +12% on dgx-h100.
# On nodes of three the dp groups fill a node each and the pipeline crosses the network.
DP3_PIPELINES = [
    ("dgx-h100", ["--collectives", "tree"]),
    ("three-per-node", ["--collectives", "ps", "--schedule", "zb-h1"]),
    ("three-per-node", ["--collectives", "tree", "--precision", "mixed-bf16", "--bucket-mb", "0.001"]),
]


def test_dp3_pipeline_buckets_followed_rank_by_rank_agree(tmp_path):
    """One launch of 6 ranks (tests/mpi/scripts/train_layouts.py), three cases."""
    (tmp_path / "hw.json").write_text(json.dumps(TWO_PER_NODE | {"name": "three", "devices_per_node": 3}))
    profiles = {"three-per-node": str(tmp_path / "hw.json")}
    base = [*SHAPE, "--batch", "12", "--dp", "3", "--pp", "2", "--microbatches", "2", "--clock", "sim"]
    cases = [
        [f"case{i}", 6, [*base, "--hardware", profiles.get(hw, hw), *extra]]
        for i, (hw, extra) in enumerate(DP3_PIPELINES)
    ]
    res = run_script(6, MPI_SCRIPTS / "train_layouts.py", [str(tmp_path), json.dumps(cases)], timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    for (name, _, _), case in zip(cases, DP3_PIPELINES):
        assert_agrees(json.loads((tmp_path / f"{name}.json").read_text()), case)
