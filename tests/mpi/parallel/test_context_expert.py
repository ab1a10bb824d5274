"""--arch gpt --experts --ep with --cp (parallel/context_expert.py): dp2 x cp2 with ep2 on 4 ranks,
--grad-accum 2 over 6 sequences (micro-steps of 3 rows: dp ranks hold 2 and 1), equal to serial in
float64 with the SAME tokens dropped by capacity, its bytes against closed forms written here from the
run's routing, and its checkpoint resumed serially.

Closed forms, per block and micro-step k (B_k rows; dp rank d holds b_d of them), world rank r = d C + c:
  segments: row g's chunk q of 2C (m = s/(2C) tokens) is segment 2C g + q; rank (d, c) holds
            2C g + c and 2C g + 2C-1-c of its rows g. T[i][e]: segment i's assignments to expert e
            (metrics["moe"]["routed_by_segment"]); an expert keeps, in segment order,
            kept[i][e] = clip(cap - sum_{i'<i} T[i'][e], 0, T[i][e]), cap = ceil(C_f K B_k s / E)
  cp-kv (ring):  forward 2 (C-1) b_d n h + backward 4 (C-1) b_d n h elements, n = s/C, 3 (C-1) messages
  ep all-to-alls (ep rank j = d mod P, experts j E/P ..): rank (d, c) sends, 8 B an element,
            ep-dispatch = ep-combine-grad = sum over e not on j of kept(d, c)[e] x h
            ep-combine = ep-dispatch-grad = sum over d' != d in the group, e on j, of kept(d', c)[e] x h
  per step: non-expert parameters M over D C ranks, the rank's experts over (D/P) C ranks (ring).
"""

from __future__ import annotations

import math

from tests.conftest import assert_same_model, split_sizes, train_json
from tests.mpi.parallel import test_gpt_moe

L, H, A, S, V, B, E, K, CF, STEPS, G = 2, 16, 2, 8, 17, 6, 4, 2, 1.0, 2, 2
ARGS = ["--arch", "gpt", "--n-layers", str(L), "--hidden", str(H), "--heads", str(A), "--seq-len", str(S)]
ARGS += ["--vocab", str(V), "--dataset", "copy", "--samples", "64", "--batch", str(B), "--steps", str(STEPS)]
ARGS += ["--dtype", "float64", "--optimizer", "adam", "--lr", "0.01", "--kernels", "numpy"]
ARGS += ["--experts", str(E), "--top-k", str(K), "--capacity-factor", str(CF), "--grad-accum", str(G)]
M = (V + S) * H + L * (4 * H * H + 8 * H + H * E) + 2 * H + H * V  # outside the experts
EXPERT = 8 * H * H + 5 * H


def ring_allreduce(n: int, p: int, r: int) -> int:
    c = split_sizes(n, p)
    return 2 * n - c[r] - c[(r + 1) % p] if p > 1 else 0


def rank_kept(T: list, rows: int, D: int, C: int) -> dict:
    """{(d, c): kept per expert}: the segments' kept rows, summed over each rank's segments."""
    before, kept = [0] * E, []
    for seg in T:
        kept.append([max(0, min(t, math.ceil(CF * K * rows * S / E) - b)) for t, b in zip(seg, before)])
        before = [b + t for b, t in zip(before, seg)]
    starts = [sum(split_sizes(rows, D)[:d]) for d in range(D + 1)]
    out = {}
    for d in range(D):
        for c in range(C):
            mine = [2 * C * g + q for g in range(starts[d], starts[d + 1]) for q in (c, 2 * C - 1 - c)]
            out[d, c] = [sum(kept[i][e] for i in mine) for e in range(E)]
    return out


def tree_allreduce(n: int, p: int, r: int) -> int:
    """Binomial reduce and broadcast (Thakur et al. 2005, sec. 4): rank r sends its n to its parent
    (r != 0) and the result to each child r + 2^k (2^k > r, r + 2^k < p)."""
    children = sum(1 for k in range(p.bit_length()) if 2**k > r and r + 2**k < p)
    return ((1 if r else 0) + children) * n


def check_bytes(m: dict, D: int, C: int, P: int, allreduce=ring_allreduce) -> None:
    per, n = E // P, S // C
    want = {r: {} for r in range(D * C)}
    for i, micro in enumerate(m["moe"]["routed_by_segment"]):
        rows = split_sizes(B, G)[i % G]
        for T in micro:
            assert len(T) == 2 * C * rows
            kept = rank_kept(T, rows, D, C)
            for d in range(D):
                for c in range(C):
                    j, w = d % P, want[d * C + c]
                    b = split_sizes(rows, D)[d]
                    w["activation/cp-kv"] = w.get("activation/cp-kv", 0) + 6 * (C - 1) * b * n * H * 8
                    if P == 1:
                        continue
                    out = sum(kept[d, c][e] for e in range(E) if e // per != j) * H * 8
                    group = [q for q in range(d - j, d - j + P) if q != d]
                    back = sum(kept[q, c][e] for q in group for e in range(j * per, (j + 1) * per)) * H * 8
                    for op, sent in (("dispatch", out), ("combine-grad", out), ("combine", back)):
                        w[f"activation/ep-{op}"] = w.get(f"activation/ep-{op}", 0) + sent
                    w["activation/ep-dispatch-grad"] = w.get("activation/ep-dispatch-grad", 0) + back
    for r, rank in enumerate(m["comm"]["ranks"]):
        d, c = divmod(r, C)
        w = want[r]
        w["model/grad-allreduce"] = allreduce(M, D * C, r) * 8 * STEPS
        w["model/expert-grad-allreduce"] = allreduce(L * per * EXPERT, D // P * C, d // P * C + c) * 8 * STEPS
        got = {k: v["sent"] for k, v in rank["by_op"].items() if not k.startswith("control")}
        assert got == w, (r, got, w)
        assert rank["by_op"]["activation/cp-kv"]["messages"] == 3 * (C - 1) * L * STEPS * G
        mem = m["memory"]["ranks"][r]
        assert (mem["params"], mem["grads"], mem["optimizer"]) == tuple(
            (M + L * per * EXPERT) * x for x in (8, 8, 16)
        )
    assert m["prediction_mismatches"] == []
    for r, p in zip(m["comm"]["ranks"], m["predicted"]["comm"]["ranks"]):  # predicted op by op, too
        assert {k: v["sent"] for k, v in r["by_op"].items() if not k.startswith("control")} == {
            k: v["sent"] for k, v in p["by_op"].items()
        }
    assert [r["activations_peak"] for r in m["memory"]["ranks"]] == [
        r["activations_peak"] for r in m["predicted"]["memory"]["ranks"]
    ]


def test_dp2_cp2_ep2_drops_the_serial_tokens_and_resumes_serially(serial, tmp_path):
    """dp2 x cp2 with ep2: equal to serial at 1e-12, the same drops per step and block, bytes exact;
    the checkpoint of step 1 (experts gathered from cp rank 0's ep group) resumes on one process."""
    ref = serial(ARGS)
    assert sum(sum(step) for step in ref["moe"]["dropped"]) > 0  # capacity drops tokens here
    ckpt = tmp_path / "ckpt"
    every = ["--checkpoint-dir", str(ckpt), "--checkpoint-every", "1"]
    run = train_json(4, [*ARGS, "--dp", "2", "--cp", "2", "--ep", "2", *every], tmp_path)
    assert_same_model(run, ref, rtol=1e-12)
    assert run["moe"]["dropped"] == ref["moe"]["dropped"]
    assert run["moe"]["routed_per_expert"] == ref["moe"]["routed_per_expert"]
    check_bytes(run, 2, 2, 2)
    resumed = train_json(1, [*ARGS, "--resume", str(ckpt / "step-000001")], tmp_path, "resumed")
    assert_same_model(resumed, {**ref, "losses": ref["losses"][1:]}, rtol=1e-12)


def test_dp2_cp2_ep2_with_a_tree_all_reduce_is_serial_and_its_clock_exact(serial, tmp_path):
    """--collectives tree over the dp x cp group and each expert group (parallel/context_expert.py runs
    the chosen algorithm): equal to serial at 1e-12, the tree's bytes from its closed form, and under
    --clock sim the closed form's step equal to the clock's (costmodel/allreduce_ends.py follows each
    rank through the tree, which ends them apart)."""
    ref = serial(ARGS)
    sim = ["--collectives", "tree", "--clock", "sim", "--hardware", "dgx-h100"]
    run = train_json(4, [*ARGS, "--dp", "2", "--cp", "2", "--ep", "2", *sim], tmp_path)
    assert_same_model(run, ref, rtol=1e-12)
    assert run["moe"]["dropped"] == ref["moe"]["dropped"]
    check_bytes(run, 2, 2, 2, allreduce=tree_allreduce)
    assert abs(run["predicted"]["time"]["step_s"] / run["time"]["sim"]["step_s"] - 1) <= 1e-9


def test_mixed_bf16_dp2_cp2_ep2_bytes_and_memory_as_predicted(serial, tmp_path):
    """--precision mixed-bf16 (test_gpt_moe.py's model and serial run, so the serial trains once a
    session): the first loss is serial's up to bfloat16 roundoff; every rank's bytes (the ring's dK, dV
    partial sums in float32, the rest in 2 bytes), params/grads/optimizer and activations as predicted."""
    args = [a for a in test_gpt_moe.ARGS if a not in ("--dtype", "float64")] + ["--precision", "mixed-bf16"]
    ref = serial(args)
    run = train_json(4, [*args, "--dp", "2", "--cp", "2", "--ep", "2"], tmp_path)
    assert abs(run["losses"][0] / ref["losses"][0] - 1) <= 1e-3
    assert run["prediction_mismatches"] == []
    assert run["comm"]["ranks"][0]["by_op"]["activation/ep-dispatch"]["sent"] > 0
    for r, p in zip(run["comm"]["ranks"], run["predicted"]["comm"]["ranks"]):
        assert {k: v["sent"] for k, v in r["by_op"].items() if not k.startswith("control")} == {
            k: v["sent"] for k, v in p["by_op"].items()
        }
    assert [r["activations_peak"] for r in run["memory"]["ranks"]] == [
        r["activations_peak"] for r in run["predicted"]["memory"]["ranks"]
    ]
