"""The MoE transformer (--arch gpt --experts E: dp x ep, with --cp, --tp, both, or --pp [--tp]) on
the simulated clock: predict == simulate.

model/moe_charges.py charges each block's attention half, router, experts (on the rows they received)
and routing passes; the all-to-alls block on the ep group's stream, the gradient all-reduces on dp's
and edp's. costmodel/gpt_moe_time.py writes the same step from the run's routing histograms, every
rank followed through every all-to-all round (and with --cp every ring hop, cp_hop_time.py), so the
two agree to rounding (measured ~1e-15); under --tp each rank's attention share and tp's blocking
collectives are added. One tour launch runs every MoE layout 4 ranks offer under sim (serial, dp4,
dp4 x ep2, dp4 x ep4, tp4, dp2 x tp2, dp2 x ep2 x tp2, tp4 and dp2 x tp2 with --sp, cp2, cp4, dp2 x
cp2, dp2 x cp2 x ep2, cp2 x tp2, cp4-ulysses) with pairwise all-to-alls on nodes of two devices (dp,
ep and edp groups cross nodes); two trains route unevenly (top-1 drops, --grad-accum 2): Bruck's
all-to-all over ep 4 in bfloat16 on the CPU profile (its gradients by Rabenseifner's all-reduce,
reached apart: allreduce_ends.py), Ulysses with dp2 x cp2 x ep2 on a GPU node, and cp2 x tp2 --sp; six
pipelines (every rank of a stage on its own clock through the schedule: gpt_moe_pipeline_time.py;
zb-h1 and zb-v's halves: moe_split_time.py; --recompute full and selective, on cp stages too; tp's
tree and ps all-reduces followed group by group, moe_tp_rounds.py, and mpi's for the gradients);
ZeRO with experts (gpt_moe_zero_time.py: each unit's blocking rings over dp (x cp) and edp (x cp) where
expert_zero.py runs them, every rank round by round): dp4 x ep2 --zero 1 in bfloat16 on nodes of two (dp
and edp cross nodes), dp2 x cp2 x ep2 --zero 3 with --grad-accum 2, top-1 drops and h = 10 (chunks one
element apart) on a GPU node, and dp2 x tp2 --sp --zero 3 (expert_zero_tp.py) on nodes of two; and
cp's row shards on pipeline stages, cp2 x tp2 --sp x pp2 (8 ranks, one launch: ring with zb-h1 on
nodes of two, Ulysses with --recompute full in bfloat16 on a GPU node).
"""

from __future__ import annotations

import json

import pytest

from simpar.run.launch import run
from tests.mpi.runtime.test_gpt_simclock import SHAPE, assert_agrees, hardware_option
from tests.mpiutil import run_script
from tests.paths import MPI_SCRIPTS

MOE_LAYOUTS = {
    "serial",
    "dp4",
    "dp4xep2",
    "dp4xep4",
    "tp4",
    "dp2xtp2",
    "dp2xep2xtp2",
    "cp2",
    "cp4",
    "dp2xcp2",
}
MOE_LAYOUTS |= {"dp2xcp2xep2", "cp2xtp2", "cp4-ulysses", "tp4-sp", "dp2xtp2-sp"}


def test_every_moe_tour_layout_agrees(tmp_path):
    out = tmp_path / "tour"
    args = ["tour", *SHAPE, "--experts", "4", "--clock", "sim", "--out", str(out), "--no-plots"]
    res = run(4, [*args, "--hardware", hardware_option(tmp_path, "two-per-node")], timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    names = {p.stem for p in out.glob("*.json")} - {"trace"}
    assert MOE_LAYOUTS <= names, names
    for name in sorted(names):
        assert_agrees(json.loads((out / f"{name}.json").read_text()), name)


UNEVEN = {  # top-1 with capacity 1 drops tokens, --grad-accum 2 routes each micro-step apart
    "bruck": [
        "--dp",
        "4",
        "--ep",
        "4",
        "--alltoall",
        "bruck",
        "--hardware",
        "local",
        "--precision",
        "mixed-bf16",
        "--collectives",  # the dense gradients' halving and doubling, 4 ranks reaching them apart
        "rabenseifner",
    ],
    "ulysses": ["--dp", "2", "--cp", "2", "--ep", "2", "--cp-algo", "ulysses", "--hardware", "dgx-h100"],
    # cp's row shards (--sp): each tp rank's s/(C T) rows between units, the MoE input gathered
    "cp-tp-sp": ["--cp", "2", "--tp", "2", "--sp", "--hardware", "dgx-h100"],
}


@pytest.mark.parametrize("name", sorted(UNEVEN))
def test_uneven_routing_agrees(tmp_path, name):
    """The ranks' experts receive different rows, so their clocks drift apart and each all-to-all round
    (and each cp hop) waits on the slower peer: the closed form follows every rank."""
    path = tmp_path / "m.json"
    args = ["train", *SHAPE, "--experts", "4", *UNEVEN[name], "--grad-accum", "2", "--top-k", "1"]
    args += ["--capacity-factor", "1.0", "--clock", "sim", "--quiet", "--metrics-out", str(path)]
    res = run(4, args)
    assert res.returncode == 0, res.stderr[-3000:]
    m = json.loads(path.read_text())
    assert sum(sum(step) for step in m["moe"]["dropped"]) > 0
    computes = [r["compute_s"] for r in m["time"]["sim"]["per_rank"]]
    assert max(computes) > min(computes), computes  # imbalanced experts: the waits matter
    assert_agrees(m, name)


# MoE blocks on pipeline stages (gpt_moe_pipeline_time.py): interleaved pp2 x dp2 x ep2 on nodes of two
# with top-1 drops (the ranks of a stage apart) in bfloat16 and --recompute selective (each block's
# softmax rebuilt), pp2 x tp2 --sp with gpipe and accumulation on `local` in float16 (the closed form
# has every step update: none skipped; --sp: boundaries of the rank's rows, the LayerNorm sums over tp)
# and --recompute full (each chunk's forward, its all-to-alls and tp collectives, again before its
# backward), its tp all-reduces the parameter server's (the server's rank ends apart from the other:
# the ring halves after it followed, moe_tp_rounds.py), and
# pp2 x cp2 (context_expert_stage.py: each chunk's hops between its all-to-alls) with 1f1b, Ulysses and
# --recompute selective (its a/(C T) heads' q k^T again), and zb-h1 on pp2 x cp2 with the ring and
# --recompute selective (each block's ring forward again, its hops re-sent, before the chunk's B, which
# keeps the core's backward hops: gpt_moe_pipeline_time.ring_again, moe_split_time.backward_input);
# the zero-bubble halves (moe_split_time.py): zb-h1 on pp2 x dp2 x ep2 with top-1 drops on nodes of two
# (--collectives mpi: each rank's own closed form), zb-v (two chunks a stage) on pp2 x tp2
# (expert_tensor_split.py) with --recompute full before each B and tp's binomial-tree all-reduces.
PIPELINES = {
    "interleaved": ["--n-layers", "6", "--dp", "2", "--ep", "2", "--virtual-stages", "2", "--top-k", "1"]
    + ["--precision", "mixed-bf16", "--recompute", "selective"],
    "gpipe": ["--tp", "2", "--sp", "--grad-accum", "2", "--hardware", "local", "--precision", "mixed-fp16"]
    + ["--recompute", "full", "--collectives", "ps"],
    "1f1b": ["--cp", "2", "--cp-algo", "ulysses", "--recompute", "selective", "--hardware", "dgx-h100"],
    "zb-h1-cp": ["--cp", "2", "--cp-algo", "ring", "--recompute", "selective", "--hardware", "dgx-h100"],
    "zb-h1": ["--dp", "2", "--ep", "2", "--top-k", "1", "--collectives", "mpi"],
    "zb-v": ["--tp", "2", "--recompute", "full", "--hardware", "dgx-h100", "--collectives", "tree"],
}


@pytest.mark.parametrize("schedule", sorted(PIPELINES))
def test_moe_pipeline_stages_agree(tmp_path, schedule):
    path = tmp_path / "m.json"
    extra = PIPELINES[schedule]
    hw = [] if "--hardware" in extra else ["--hardware", hardware_option(tmp_path, "two-per-node")]
    args = ["train", *SHAPE, "--experts", "4", "--pp", "2", "--schedule", schedule.removesuffix("-cp")]
    args += ["--microbatches", "4"]
    args += [*extra, *hw, "--capacity-factor", "1.0", "--clock", "sim", "--quiet", "--metrics-out", str(path)]
    res = run(4, args)
    assert res.returncode == 0, res.stderr[-3000:]
    m = json.loads(path.read_text())
    assert m.get("precision", {}).get("skipped_steps", 0) == 0, schedule
    assert_agrees(m, schedule)
    if "--recompute" in extra and "--cp" in extra:  # s = 8: Ulysses' rebuilt q k^T moves the step ~4e-7
        sim, pred = m["time"]["sim"]["step_s"], m["predicted"]["time"]["step_s"]
        assert abs(pred / sim - 1) <= 1e-9, (schedule, sim, pred)  # measured ~1e-14


ZERO = {  # parallel/expert_zero.py and context_expert_zero.py under sim
    "zero1": ["--dp", "4", "--ep", "2", "--zero", "1", "--precision", "mixed-bf16"],
    "zero3": ["--dp", "2", "--cp", "2", "--ep", "2", "--zero", "3", "--grad-accum", "2", "--top-k", "1"]
    + ["--capacity-factor", "1.0", "--hidden", "10", "--heads", "2", "--hardware", "dgx-h100"],
    # expert_zero_tp.py: tp shares over dp, experts over edp (2 ranks), the LayerNorms' sums before
    # each unit's reduce-scatter on every micro-step
    "zero3-tp-sp": ["--dp", "2", "--tp", "2", "--sp", "--zero", "3", "--grad-accum", "2"],
}


@pytest.mark.parametrize("name", sorted(ZERO))
def test_moe_zero_agrees(tmp_path, name):
    path = tmp_path / "m.json"
    extra = ZERO[name]
    hw = [] if "--hardware" in extra else ["--hardware", hardware_option(tmp_path, "two-per-node")]
    args = [
        "train",
        *SHAPE,
        "--experts",
        "4",
        *extra,
        *hw,
        "--clock",
        "sim",
        "--quiet",
        "--metrics-out",
        str(path),
    ]
    res = run(4, args)
    assert res.returncode == 0, res.stderr[-3000:]
    m = json.loads(path.read_text())
    by_op = m["comm"]["ranks"][0]["by_op"]
    assert "model/expert-grad-reduce-scatter" in by_op and "model/grad-allreduce" not in by_op, by_op
    assert_agrees(m, name)


# cp's row shards (--sp) on pipeline stages: 8 ranks, refused under sim until measured (2e-15 to 1e-14
# by hand over every schedule, recomputation, bfloat16, rabenseifner, auto and mpi)
SP_CP_PP = [
    ("two-per-node", ["--schedule", "zb-h1"]),
    ("dgx-h100", ["--cp-algo", "ulysses", "--recompute", "full", "--precision", "mixed-bf16"]),
]


def test_moe_cp_tp_sp_pipeline_agrees(tmp_path):
    base = ["--arch", "gpt", "--n-layers", "2", "--hidden", "16", "--heads", "4", "--seq-len", "8"]
    base += ["--vocab", "16", "--dataset", "copy", "--samples", "64", "--batch", "8", "--steps", "2"]
    base += ["--experts", "4", "--cp", "2", "--tp", "2", "--sp", "--pp", "2", "--clock", "sim"]
    cases = [
        [f"case{i}", 8, [*base, "--hardware", hardware_option(tmp_path, hw), *extra]]
        for i, (hw, extra) in enumerate(SP_CP_PP)
    ]
    res = run_script(8, MPI_SCRIPTS / "train_layouts.py", [str(tmp_path), json.dumps(cases)], timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    for (name, _, _), case in zip(cases, SP_CP_PP):
        assert_agrees(json.loads((tmp_path / f"{name}.json").read_text()), case)
