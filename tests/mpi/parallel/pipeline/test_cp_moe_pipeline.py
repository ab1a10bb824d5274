"""--arch gpt --experts --pp with --cp (parallel/pipeline/context_expert_stage.py): MoE pipeline stages on
cp ranks' tokens, pp2 x cp2 on 4 ranks, the four schedules MoE stages run (naive, gpipe, 1f1b,
interleaved) and both --cp-algo, trained in ONE launch (tests/mpi/scripts/train_each.py): each equal to
the serial run with --grad-accum G M in float64 with the SAME tokens dropped by capacity (capacity is
planned per sequence segment over the stage's dp x cp ranks), every rank's ledger op by op against closed
forms written here and against costmodel/cp_moe_pipeline.py, and gpipe's step-1 checkpoint resumed serially.

test_gpt_moe.py's model (L = 2 blocks, so stage 0 holds the embedding and block 1, stage 1 block 2 and the
head; D = P = 1), --grad-accum 2 x 2 micro-batches over B = 8 sequences: micro-step i of G M = 4 holds
b_i = chunk(B, 4, i) sequences and cp rank c n = s/C tokens of each. World rank r = st C + c:
    pp-send-act (stage 0), pp-send-grad (stage 1)   b_i n h x 8 B per micro-step, one message
    cp-kv (ring)        6 (C-1) b_i n h x 8 B per micro-step (the stage's one block), 3 (C-1) messages
    cp-alltoall (Ulysses)  8 (C-1) (b_i n h / C) x 8 B, 8 (C-1) messages
    grad-allreduce      the stage's dense parameters, ring over the stage's D C = 2 dp x cp ranks
    expert-grad-allreduce  the stage's block's E experts, ring over its D/P x C = 2 ranks
"""

from __future__ import annotations

import json

import numpy as np

from tests.conftest import assert_same_model, split_sizes, train_json
from tests.mpi.parallel.pipeline.test_gpt_moe_pipeline import STAGE_DENSE
from tests.mpi.parallel.test_context_expert_tensor import ARGS as MESH_ARGS
from tests.mpi.parallel.test_gpt_moe import ARGS, EXPERT, B, E, H, S, ring_allreduce
from tests.mpiutil import run_script
from tests.paths import MPI_SCRIPTS

STEPS, G, M, C = 2, 2, 2, 2
CASES = {  # name: (schedule options, --cp-algo)
    "gpipe": (["--schedule", "gpipe"], "ring"),
    "1f1b": (["--schedule", "1f1b"], "ulysses"),
    "naive": (["--schedule", "naive"], "ulysses"),
    "interleaved": (["--schedule", "interleaved", "--virtual-stages", "2"], "ring"),
}


def closed_form(algo: str, st: int, c: int) -> dict:
    """Rank (st, c)'s bytes sent per op over the run (module docstring), pp x cp with one block a stage."""
    n, want = S // C, {}
    for i in range(STEPS * G * M):
        b = split_sizes(B, G * M)[i % (G * M)]
        boundary = "pp-send-act" if st == 0 else "pp-send-grad"
        kv = (
            ("cp-kv", 6 * (C - 1) * b * n * H)
            if algo == "ring"
            else ("cp-alltoall", 8 * (C - 1) * (b * n * H // C))
        )
        for op, elems in ((boundary, b * n * H), kv):
            want[f"activation/{op}"] = want.get(f"activation/{op}", 0) + elems * 8
    want["model/grad-allreduce"] = ring_allreduce(STAGE_DENSE[st], C, c) * 8 * STEPS
    want["model/expert-grad-allreduce"] = ring_allreduce(E * EXPERT, C, c) * 8 * STEPS
    return want


def sent(rank: dict) -> dict:
    return {k: v["sent"] for k, v in rank["by_op"].items() if not k.startswith("control") and v["sent"]}


def train_cases(n: int, cases: list, tmp_path, ref: dict) -> dict:
    """Train `cases` ([name, options]) in one launch of n ranks (tests/mpi/scripts/train_each.py); check
    each equals `ref` at 1e-12 with its drops, and its bytes and peaks the prediction. {name: metrics}."""
    argv = []
    for name, args in cases:
        out = ["--quiet", "--metrics-out", str(tmp_path / f"{name}.json"), "--weights-out"]
        argv += [*(["::"] if argv else []), *args, *out, str(tmp_path / f"{name}.npz")]
    res = run_script(n, MPI_SCRIPTS / "train_each.py", argv, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    runs = {}
    for name, _ in cases:
        run = runs[name] = json.loads((tmp_path / f"{name}.json").read_text())
        with np.load(tmp_path / f"{name}.npz") as z:
            run["weights"] = [(z[f"W{i}"], z[f"b{i}"]) for i in range(len(z.files) // 2)]
        assert_same_model(run, ref, rtol=1e-12)
        for key in ("dropped", "routed_per_expert", "tokens_per_expert"):
            assert run["moe"][key] == ref["moe"][key], (name, key)
        assert run["prediction_mismatches"] == [], name
        for r, (rank, pred) in enumerate(zip(run["comm"]["ranks"], run["predicted"]["comm"]["ranks"])):
            assert sent(rank) == {k: v["sent"] for k, v in pred["by_op"].items()}, (name, r)
        peaks = [r["activations_peak"] for r in run["memory"]["ranks"]]
        assert peaks == [r["activations_peak"] for r in run["predicted"]["memory"]["ranks"]], name
    return runs


def test_pp2_cp2_every_schedule_equals_serial_with_drops_bytes_exact_and_resumes(serial, tmp_path):
    ref = serial([*ARGS, "--grad-accum", str(G * M)])
    assert sum(sum(step) for step in ref["moe"]["dropped"]) > 0  # capacity drops tokens here
    ckpt = tmp_path / "ckpt"
    layout = ["--pp", "2", "--cp", str(C), "--microbatches", str(M), "--grad-accum", str(G)]
    cases = [[name, [*ARGS, *layout, *sched, "--cp-algo", algo]] for name, (sched, algo) in CASES.items()]
    cases[0][1] += ["--checkpoint-dir", str(ckpt), "--checkpoint-every", "1"]
    runs = train_cases(4, cases, tmp_path, ref)
    for name, (_, algo) in CASES.items():
        if name == "interleaved":  # two chunks a stage: as predicted (its closed form: the unit test)
            continue
        for r, rank in enumerate(runs[name]["comm"]["ranks"]):  # one chunk a stage: the closed form above
            assert sent(rank) == closed_form(algo, *divmod(r, C)), (name, r)
            n = STAGE_DENSE[r // C] + E * EXPERT
            mem = runs[name]["memory"]["ranks"][r]
            assert (mem["params"], mem["grads"], mem["optimizer"]) == (8 * n, 8 * n, 16 * n)
    extra = ["--grad-accum", str(G * M), "--resume", str(ckpt / "step-000001")]
    resumed = train_json(1, [*ARGS, *extra], tmp_path, "resumed")
    assert_same_model(resumed, {**ref, "losses": ref["losses"][1:]}, rtol=1e-12)


def test_full_mesh_and_dp2_ep2_with_uneven_micro_steps_equal_serial_and_the_prediction(serial, tmp_path):
    """One launch of 8 ranks, test_context_expert_tensor.py's model (4 heads, 18 words) with 9 sequences
    in 2 passes of 2 micro-batches = serial --grad-accum 4 (micro-steps of 3, 2, 2, 2 sequences: pass 1's
    micro-batch mb is micro-step 2 + mb, whose rows lay out the segment table over the dp ranks):
      the full mesh pp2 x cp2 x tp2, 1f1b, Ulysses over each tp rank's a/T = 2 heads;
      pp2 x dp2 x ep2 x cp2, interleaved, ring: the all-to-alls at each cp coordinate.
    Each equal at 1e-12 with serial's drops, every rank's bytes (tp ops, all-to-alls) and peaks as
    costmodel/cp_moe_pipeline.py predicts (its closed forms: tests/unit/costmodel/test_cp_moe_pipeline.py)."""
    args = [*MESH_ARGS, "--batch", "9"]
    ref = serial([*args, "--grad-accum", "4"])
    assert sum(sum(step) for step in ref["moe"]["dropped"]) > 0
    both = [*args, "--grad-accum", "2", "--microbatches", "2", "--pp", "2", "--cp", "2"]
    cases = [
        ["mesh", [*both, "--tp", "2", "--schedule", "1f1b", "--cp-algo", "ulysses"]],
        ["ep", [*both, "--dp", "2", "--ep", "2", "--schedule", "interleaved", "--virtual-stages", "2"]],
    ]
    runs = train_cases(8, cases, tmp_path, ref)
    for rank in runs["mesh"]["comm"]["ranks"]:
        assert {"activation/tp-g-allreduce", "activation/cp-alltoall"} <= set(sent(rank))
    for rank in runs["ep"]["comm"]["ranks"]:
        assert {"activation/ep-dispatch", "activation/cp-kv"} <= set(sent(rank))
