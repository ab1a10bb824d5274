"""--arch gpt --experts --ep --tp (parallel/expert_tensor_gpt.py): attention and the vocabulary split
over tp, the MoE part replicated on every tp rank, equal to serial in float64 with tokens dropped,
every rank's ledger op by op against closed forms written here, and a checkpoint resumed serially.

World rank d T + k on tp2 x dp2 x ep2. Per micro-step of R = b s rows (b this dp rank's sequences),
ring over the T = 2 tp ranks (an all-reduce of N sends 2(T-1)/T N = N, an all-gather (T-1)/T N):
    tp-g-allreduce, tp-f-allreduce      L all-reduces of R h each (attention's g and f; no MLP split)
    vocab-embed-allreduce, vocab-head-allreduce   one of R h each
    vocab-ce-max                        an all-gather of T R;  vocab-ce-sums  an all-reduce of 2R
the four all-to-alls as tests/mpi/parallel/test_gpt_moe.py's closed form for dp rank d (the same on
both tp ranks), and per step this rank's dense shards all-reduced over dp: embedding V h/T + s h,
per block 4h^2/T + 3h/T + 5h + hE, head 2h + hV/T.
"""

from __future__ import annotations

import math

from tests.conftest import assert_same_model, split_sizes, train_json
from tests.mpi.parallel.test_gpt_moe import ARGS, EXPERT, B, C, E, H, K, L, S, kept_in_order, ring_allreduce

V, T, D, P, G, STEPS = 18, 2, 2, 2, 2, 2
_AT = ARGS.index("--vocab") + 1
TP_ARGS = ARGS[:_AT] + [str(V)] + ARGS[_AT + 1 :]  # the vocabulary splits over tp: 18, not 17
DENSE = V * H // T + S * H + L * (4 * H * H // T + 3 * H // T + 5 * H + H * E) + 2 * H + H * V // T


def test_tp2_dp2_ep2_equals_serial_with_exact_bytes_and_resumes_serially(serial, tmp_path):
    extra = ["--grad-accum", str(G)]
    ref = serial([*TP_ARGS, *extra])
    assert sum(sum(step) for step in ref["moe"]["dropped"]) > 0
    ckpt = tmp_path / "ckpt"
    every = ["--checkpoint-dir", str(ckpt), "--checkpoint-every", "1"]
    run = train_json(4, [*TP_ARGS, *extra, "--tp", "2", "--dp", "2", "--ep", "2", *every], tmp_path)
    assert_same_model(run, ref, rtol=1e-12)
    assert run["moe"]["dropped"] == ref["moe"]["dropped"]
    resumed = train_json(1, [*TP_ARGS, *extra, "--resume", str(ckpt / "step-000001")], tmp_path, "resumed")
    assert_same_model(resumed, {**ref, "losses": ref["losses"][1:]}, rtol=1e-12)

    routed, per = run["moe"]["routed_by_rank"], E // P
    assert len(routed) == STEPS * G
    for r, rank in enumerate(run["comm"]["ranks"]):
        d = r // T
        j, g = d % P, d - d % P
        mine = range(j * per, (j + 1) * per)
        tp = dict.fromkeys(("tp-g-allreduce", "tp-f-allreduce", "vocab-embed-allreduce"), 0)
        tp |= dict.fromkeys(("vocab-head-allreduce", "vocab-ce-max", "vocab-ce-sums"), 0)
        out = back = 0
        for i, micro in enumerate(routed):
            seqs = split_sizes(B, G)[i % G]
            R = split_sizes(seqs, D)[d] * S
            tp["tp-g-allreduce"] += L * R * H
            tp["tp-f-allreduce"] += L * R * H
            tp["vocab-embed-allreduce"] += R * H
            tp["vocab-head-allreduce"] += R * H
            tp["vocab-ce-max"] += (T - 1) * R
            tp["vocab-ce-sums"] += 2 * R
            for Hs in micro:
                kept = kept_in_order(Hs, math.ceil(C * K * seqs * S / E))
                out += sum(kept[d][e] for e in range(E) if e not in mine)
                back += sum(kept[s][e] for s in range(g, g + P) if s != d for e in mine)
        want = {f"activation/{op}": n * 8 for op, n in tp.items()}
        for op, rows in (("ep-dispatch", out), ("ep-combine-grad", out), ("ep-combine", back)):
            want[f"activation/{op}"] = rows * H * 8
        want["activation/ep-dispatch-grad"] = back * H * 8
        want["model/grad-allreduce"] = ring_allreduce(DENSE, D, d) * 8 * STEPS
        got = {k: v["sent"] for k, v in rank["by_op"].items() if not k.startswith("control") and v["sent"]}
        assert got == want, (r, got, want)
        n = DENSE + L * per * EXPERT
        mem = run["memory"]["ranks"][r]
        assert (mem["params"], mem["grads"], mem["optimizer"]) == (8 * n, 8 * n, 16 * n)
    assert run["prediction_mismatches"] == []
    for r, p in zip(run["comm"]["ranks"], run["predicted"]["comm"]["ranks"]):
        assert {k: v["sent"] for k, v in r["by_op"].items() if not k.startswith("control") and v["sent"]} == {
            k: v["sent"] for k, v in p["by_op"].items()
        }
    got = [r["activations_peak"] for r in run["memory"]["ranks"]]
    assert got == [r["activations_peak"] for r in run["predicted"]["memory"]["ranks"]]


def test_tp2_pp2_equals_serial_and_its_prediction(serial, tmp_path):
    """pp x tp (expert_stage.py's stacks are expert_tensor_gpt.py's, one chunk a stage): 1f1b with 2
    micro-batches equals serial --grad-accum 2 with its drops, the ledger op by op equal to
    costmodel/gpt_moe_pipeline.py's (closed form: tests/unit/costmodel/test_gpt_moe_pipeline.py)."""
    ref = serial([*TP_ARGS, "--grad-accum", "2"])
    run = train_json(4, [*TP_ARGS, "--tp", "2", "--pp", "2", "--microbatches", "2"], tmp_path)
    assert_same_model(run, ref, rtol=1e-12)
    assert run["moe"]["dropped"] == ref["moe"]["dropped"] and run["prediction_mismatches"] == []
    for r, p in zip(run["comm"]["ranks"], run["predicted"]["comm"]["ranks"]):
        assert {k: v["sent"] for k, v in r["by_op"].items() if not k.startswith("control") and v["sent"]} == {
            k: v["sent"] for k, v in p["by_op"].items()
        }
    assert "activation/tp-g-allreduce" in run["comm"]["ranks"][0]["by_op"]
    got = [r["activations_peak"] for r in run["memory"]["ranks"]]
    assert got == [r["activations_peak"] for r in run["predicted"]["memory"]["ranks"]]
