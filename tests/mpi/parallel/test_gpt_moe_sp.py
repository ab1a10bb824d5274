"""--arch gpt --experts --tp --sp (parallel/expert_tensor_gpt.py under sequence parallelism): the residual
stream's rows split over tp between the units, the MoE part run on every row (its input all-gathered,
each tp rank keeping its rows of the output), equal to serial in float64 with tokens dropped, every
rank's ledger op by op against closed forms written here and equal to the prediction, and activation
peaks as predicted.

tp2 x dp2 x ep2 (tests/mpi/parallel/test_gpt_moe_tp.py's model, V = 18), --grad-accum 2. Per micro-step
of R = b s rows on dp rank d, ring over T = 2 (an all-gather or a reduce-scatter of N sends N/2):
    sp-gather   4L all-gathers of R h: attention's f-bar and the MoE input's forward, and backward
                g-bar's (dL/dx2) and dL/dm's
    sp-scatter  2L reduce-scatters of R h: attention's g-bar, and f-bar's backward (the MoE's output
                and dL/dh2 are complete on every tp rank: each takes its rows, no message)
    vocab-embed-scatter, -gather, vocab-head-gather, -scatter: one of R h each; vocab-ce-max T R
                all-gathered, vocab-ce-sums 2R all-reduced
the four all-to-alls as without --sp (every tp rank routes every row of its dp rank), and per step
sp-grad-allreduce (model) of each block's LayerNorms (4h) and the head's (2h), one all-reduce a unit.
"""

from __future__ import annotations

import math

from tests.conftest import assert_same_model, split_sizes, train_json
from tests.mpi.parallel.test_gpt_moe import EXPERT, B, C, E, H, K, L, S, kept_in_order, ring_allreduce
from tests.mpi.parallel.test_gpt_moe_tp import DENSE, TP_ARGS, D, G, P, T


def test_tp2_dp2_ep2_sp_equals_serial_with_exact_bytes(serial, tmp_path):
    extra = ["--grad-accum", str(G)]
    ref = serial([*TP_ARGS, *extra])
    assert sum(sum(step) for step in ref["moe"]["dropped"]) > 0
    run = train_json(4, [*TP_ARGS, *extra, "--tp", "2", "--dp", "2", "--ep", "2", "--sp"], tmp_path)
    assert_same_model(run, ref, rtol=1e-12)
    assert run["moe"]["dropped"] == ref["moe"]["dropped"]
    routed, per, steps = run["moe"]["routed_by_rank"], E // P, len(run["losses"])
    for r, rank in enumerate(run["comm"]["ranks"]):
        d = r // T
        j, g = d % P, d - d % P
        mine = range(j * per, (j + 1) * per)
        N = out = back = 0
        for i, micro in enumerate(routed):
            seqs = split_sizes(B, G)[i % G]
            N += split_sizes(seqs, D)[d] * S * H  # R h of this micro-step
            for Hs in micro:
                kept = kept_in_order(Hs, math.ceil(C * K * seqs * S / E))
                out += sum(kept[d][e] for e in range(E) if e not in mine)
                back += sum(kept[q][e] for q in range(g, g + P) if q != d for e in mine)
        rows = N // H  # R summed over the micro-steps
        half = N // 2 * 8  # a ring all-gather or reduce-scatter of R h over 2 ranks, bytes
        want = {
            "activation/sp-gather": 4 * L * half,
            "activation/sp-scatter": 2 * L * half,
            "activation/vocab-embed-scatter": half,
            "activation/vocab-embed-gather": half,
            "activation/vocab-head-gather": half,
            "activation/vocab-head-scatter": half,
            "activation/vocab-ce-max": rows * 8,  # (T-1)/T of T R
            "activation/vocab-ce-sums": 2 * rows * 8,  # 2 (T-1)/T of 2R
            "activation/ep-dispatch": out * H * 8,
            "activation/ep-combine-grad": out * H * 8,
            "activation/ep-combine": back * H * 8,
            "activation/ep-dispatch-grad": back * H * 8,
            "model/grad-allreduce": ring_allreduce(DENSE, D, d) * 8 * steps,
            "model/sp-grad-allreduce": (L * 4 * H + 2 * H) * 8 * steps,  # 2 (T-1)/T of each unit's
        }
        if D // P > 1:
            want["model/expert-grad-allreduce"] = ring_allreduce(L * per * EXPERT, D // P, d // P) * 8 * steps
        got = {k: v["sent"] for k, v in rank["by_op"].items() if not k.startswith("control") and v["sent"]}
        assert got == want, (r, got, want)
    assert run["prediction_mismatches"] == []
    for r, p in zip(run["comm"]["ranks"], run["predicted"]["comm"]["ranks"]):
        got = {k: v["sent"] for k, v in r["by_op"].items() if not k.startswith("control") and v["sent"]}
        assert got == {k: v["sent"] for k, v in p["by_op"].items()}
    peaks = [r["activations_peak"] for r in run["memory"]["ranks"]]
    assert peaks == [r["activations_peak"] for r in run["predicted"]["memory"]["ranks"]]
