"""--arch gpt --experts --ep --pp (parallel/pipeline/expert_stage.py): MoE blocks on pipeline stages,
equal to the serial run with --grad-accum G M in float64 -- tokens dropped by capacity included, since
the pipeline's micro-batches are that run's micro-steps -- with every rank's ledger op by op against
closed forms written here from the run's routing histograms (gpipe), or equal to the prediction
(interleaved, with accumulation), and a checkpoint resumed serially.

The model (tests/mpi/parallel/test_gpt_moe.py's: L = 2 blocks) on pp2 x dp2: stage 0 holds the
embedding and block 1, stage 1 block 2 and the head (the balanced cut of the full units' sizes). With
micro-step i of G M holding N_i = chunk(B, G M, i) sequences, dp rank d b = chunk(N_i, D, d) of them:
    pp-send-act (stage 0), pp-send-grad (stage 1)   b s h x 8 B per micro-step, one message each
    the four all-to-alls of the stage's block        test_gpt_moe.py's closed form, per micro-step
    grad-allreduce        the stage's dense parameters (ring over the D dp ranks)
    expert-grad-allreduce the stage's block's E/P experts (ring over the D/P edp ranks)
"""

from __future__ import annotations

import math

from tests.conftest import assert_same_model, split_sizes, train_json
from tests.mpi.parallel.test_gpt_moe import ARGS, EXPERT, B, C, E, H, K, S, V, kept_in_order, ring_allreduce

STEPS = 2
BLOCK = 4 * H * H + 8 * H + H * E  # a block outside its experts
STAGE_DENSE = [(V + S) * H + BLOCK, BLOCK + 2 * H + H * V]  # embedding + block 1 | block 2 + head


def check_bytes(m: dict, D: int, P: int, G: int, M: int, redo: int = 0) -> None:
    """`redo` 1: --recompute full, whose second forward sends ep-dispatch and ep-combine again."""
    routed, GM, per = m["moe"]["routed_by_rank"], G * M, E // P
    assert m["moe"]["layers"] == [1, 2] and len(routed) == STEPS * GM
    for r, rank in enumerate(m["comm"]["ranks"]):
        st, d = divmod(r, D)
        j, g = d % P, d - d % P
        mine = range(j * per, (j + 1) * per)
        boundary = out = back = 0
        for i, micro in enumerate(routed):
            seqs = split_sizes(B, GM)[i % GM]
            boundary += split_sizes(seqs, D)[d] * S * H * 8
            kept = kept_in_order(micro[st], math.ceil(C * K * seqs * S / E))  # the stage's block
            out += sum(kept[d][e] for e in range(E) if e not in mine)
            back += sum(kept[s][e] for s in range(g, g + P) if s != d for e in mine)
        want = {f"activation/{'pp-send-act' if st == 0 else 'pp-send-grad'}": boundary}
        if P > 1:
            again = 1 + redo  # the forward's two all-to-alls, sent again by a recomputed forward
            want["activation/ep-dispatch"] = out * again * H * 8
            want["activation/ep-combine"] = back * again * H * 8
            want["activation/ep-combine-grad"] = out * H * 8
            want["activation/ep-dispatch-grad"] = back * H * 8
        want["model/grad-allreduce"] = ring_allreduce(STAGE_DENSE[st], D, d) * 8 * STEPS
        if D // P > 1:
            want["model/expert-grad-allreduce"] = ring_allreduce(per * EXPERT, D // P, d // P) * 8 * STEPS
        got = {k: v["sent"] for k, v in rank["by_op"].items() if not k.startswith("control") and v["sent"]}
        assert got == want, (r, got, want)
        if P > 1:
            assert rank["by_op"]["activation/ep-dispatch"]["messages"] == (P - 1) * STEPS * GM * (1 + redo)
        n = STAGE_DENSE[st] + per * EXPERT
        mem = m["memory"]["ranks"][r]
        assert (mem["params"], mem["grads"], mem["optimizer"]) == (8 * n, 8 * n, 16 * n)
    assert m["prediction_mismatches"] == []
    for r, p in zip(m["comm"]["ranks"], m["predicted"]["comm"]["ranks"]):  # predicted op by op
        assert {k: v["sent"] for k, v in r["by_op"].items() if not k.startswith("control") and v["sent"]} == {
            k: v["sent"] for k, v in p["by_op"].items()
        }
    # the activation peaks as the cost model walks the schedule with the routing's kept rows
    got = [r["activations_peak"] for r in m["memory"]["ranks"]]
    assert got == [r["activations_peak"] for r in m["predicted"]["memory"]["ranks"]]


def test_gpipe_pp2_dp2_ep2_equals_serial_with_drops_and_resumes_serially(serial, tmp_path):
    """gpipe, 2 micro-batches: serial --grad-accum 2 (capacity per micro-step: tokens dropped), the
    same routing and drops, bytes exact; its step-1 checkpoint (experts gathered) resumed serially."""
    ref = serial([*ARGS, "--grad-accum", "2"])
    assert sum(sum(step) for step in ref["moe"]["dropped"]) > 0
    ckpt = tmp_path / "ckpt"
    pp = ["--pp", "2", "--dp", "2", "--ep", "2", "--schedule", "gpipe", "--microbatches", "2"]
    every = ["--checkpoint-dir", str(ckpt), "--checkpoint-every", "1"]
    run = train_json(4, [*ARGS, *pp, *every], tmp_path)
    assert_same_model(run, ref, rtol=1e-12)
    assert run["moe"]["dropped"] == ref["moe"]["dropped"]
    for micro, ref_micro in zip(run["moe"]["routed_by_rank"], ref["moe"]["routed_by_rank"]):
        assert [[sum(col) for col in zip(*Hs)] for Hs in micro] == [Hs[0] for Hs in ref_micro]
    check_bytes(run, 2, 2, 1, 2)
    extra = ["--grad-accum", "2", "--resume", str(ckpt / "step-000001")]
    resumed = train_json(1, [*ARGS, *extra], tmp_path, "resumed")
    assert_same_model(resumed, {**ref, "losses": ref["losses"][1:]}, rtol=1e-12)


def test_interleaved_accumulating_equals_serial_and_its_prediction(serial, tmp_path):
    """--schedule interleaved --virtual-stages 2 (four one-unit chunks, two a stage, each all-reducing
    its own dense part and experts) with --grad-accum 2 x 2 micro-batches = serial --grad-accum 4;
    --ep 1, so each expert's gradient is all-reduced over the 2 expert-data-parallel ranks. The ledger
    op by op equals costmodel/gpt_moe_pipeline.py's, whose interleaved closed form
    tests/unit/costmodel/test_gpt_moe_pipeline.py writes out (1f1b: tests/mpi/parallel/test_gpt_moe_tp.py)."""
    ref = serial([*ARGS, "--grad-accum", "4"])
    pp = ["--pp", "2", "--dp", "2", "--schedule", "interleaved", "--virtual-stages", "2"]
    run = train_json(4, [*ARGS, *pp, "--microbatches", "2", "--grad-accum", "2"], tmp_path)
    assert_same_model(run, ref, rtol=1e-12)
    assert run["moe"]["dropped"] == ref["moe"]["dropped"] and run["prediction_mismatches"] == []
    for r, p in zip(run["comm"]["ranks"], run["predicted"]["comm"]["ranks"]):
        assert {k: v["sent"] for k, v in r["by_op"].items() if not k.startswith("control") and v["sent"]} == {
            k: v["sent"] for k, v in p["by_op"].items()
        }
        assert r["by_op"]["model/expert-grad-allreduce"]["sent"] > 0
    got = [r["activations_peak"] for r in run["memory"]["ranks"]]
    assert got == [r["activations_peak"] for r in run["predicted"]["memory"]["ranks"]]
