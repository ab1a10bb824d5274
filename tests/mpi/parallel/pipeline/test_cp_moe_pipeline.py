"""--arch gpt --experts --pp with --cp (parallel/pipeline/context_expert_stage.py): MoE pipeline stages on
cp ranks' tokens, pp2 x cp2 on 4 ranks, the four schedules MoE stages run (naive, gpipe, 1f1b,
interleaved) and both --cp-algo, trained in ONE launch (tests/mpi/scripts/train_cases.py): each equal to
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


def test_pp2_cp2_every_schedule_equals_serial_with_drops_bytes_exact_and_resumes(serial, tmp_path):
    ref = serial([*ARGS, "--grad-accum", str(G * M)])
    assert sum(sum(step) for step in ref["moe"]["dropped"]) > 0  # capacity drops tokens here
    ckpt = tmp_path / "ckpt"
    layout = ["--pp", "2", "--cp", str(C), "--microbatches", str(M), "--grad-accum", str(G)]
    cases = [[name, [*ARGS, *layout, *sched, "--cp-algo", algo]] for name, (sched, algo) in CASES.items()]
    cases[0][1] += ["--checkpoint-dir", str(ckpt), "--checkpoint-every", "1"]
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    res = run_script(4, MPI_SCRIPTS / "train_cases.py", [str(tmp_path / "cases.json")], timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    for name, (_, algo) in CASES.items():
        run = json.loads((tmp_path / f"{name}.json").read_text())
        with np.load(tmp_path / f"{name}.npz") as z:
            run["weights"] = [(z[f"W{i}"], z[f"b{i}"]) for i in range(len(z.files) // 2)]
        assert_same_model(run, ref, rtol=1e-12)
        for key in ("dropped", "routed_per_expert", "tokens_per_expert"):
            assert run["moe"][key] == ref["moe"][key], (name, key)
        assert run["prediction_mismatches"] == [], name
        for r, (rank, pred) in enumerate(zip(run["comm"]["ranks"], run["predicted"]["comm"]["ranks"])):
            assert sent(rank) == {k: v["sent"] for k, v in pred["by_op"].items()}, (name, r)
            if name != "interleaved":  # one chunk a stage: the closed form above
                assert sent(rank) == closed_form(algo, *divmod(r, C)), (name, r)
                n = STAGE_DENSE[r // C] + E * EXPERT
                mem = run["memory"]["ranks"][r]
                assert (mem["params"], mem["grads"], mem["optimizer"]) == (8 * n, 8 * n, 16 * n)
        peaks = [r["activations_peak"] for r in run["memory"]["ranks"]]
        assert peaks == [r["activations_peak"] for r in run["predicted"]["memory"]["ranks"]], name
    extra = ["--grad-accum", str(G * M), "--resume", str(ckpt / "step-000001")]
    resumed = train_json(1, [*ARGS, *extra], tmp_path, "resumed")
    assert_same_model(resumed, {**ref, "losses": ref["losses"][1:]}, rtol=1e-12)


def test_full_mesh_pp2_cp2_tp2_equals_serial_with_drops_and_its_prediction(serial, tmp_path):
    """The full mesh (8 ranks): pp2 x cp2 x tp2, 1f1b, Ulysses over each tp rank's a/T = 2 heads, one
    pass of 2 micro-batches = test_context_expert_tensor.py's serial run (--grad-accum 2, 6 sequences,
    4 heads, 18 words; the same session's run, trained once). Equal at 1e-12 with serial's drops; every
    rank's bytes, tp ops included, and peaks as costmodel/cp_moe_pipeline.py predicts (its tp closed form:
    tests/unit/costmodel/test_cp_moe_pipeline.py)."""
    ref = serial(MESH_ARGS)
    assert sum(sum(step) for step in ref["moe"]["dropped"]) > 0
    mesh = ["--grad-accum", "1", "--microbatches", "2", "--pp", "2", "--cp", "2", "--tp", "2"]
    run = train_json(8, [*MESH_ARGS, *mesh, "--schedule", "1f1b", "--cp-algo", "ulysses"], tmp_path)
    assert_same_model(run, ref, rtol=1e-12)
    for key in ("dropped", "routed_per_expert", "tokens_per_expert"):
        assert run["moe"][key] == ref["moe"][key], key
    assert run["prediction_mismatches"] == []
    for rank, pred in zip(run["comm"]["ranks"], run["predicted"]["comm"]["ranks"]):
        assert sent(rank) == {k: v["sent"] for k, v in pred["by_op"].items()}
        assert {"activation/tp-g-allreduce", "activation/cp-alltoall"} <= set(sent(rank))
    peaks = [r["activations_peak"] for r in run["memory"]["ranks"]]
    assert peaks == [r["activations_peak"] for r in run["predicted"]["memory"]["ranks"]]
