"""--arch gpt --experts: the MoE transformer (model/gpt_moe.py) with expert parallelism inside data
parallelism (parallel/expert_gpt.py) equal to serial in float64, its all-to-all, gradient and memory
bytes against closed forms written here from the run's routing histograms, on 2 ranks (dp2 x ep2,
--grad-accum 2) and 4 (the tour: dp4, dp4 x ep2, dp4 x ep4).

Closed forms, per block and micro-step, with kept[s][e] = the assignments of dp rank s's tokens that
expert e keeps (capacity ceil(C K N / E), N the micro-step's tokens, filled from rank 0's tokens on)
and rank d = ep rank j of the group starting at g = d - j holding experts j E/P .. (j+1) E/P - 1:
    ep-dispatch = ep-combine-grad:  sum over e not on d of kept[d][e] x h x 8 B,            P-1 messages
    ep-combine = ep-dispatch-grad:  sum over s != d in the group, e on d, of kept[s][e] x h x 8 B
Per step: the non-expert parameters M all-reduced over dp (ring), the rank's experts over its D/P
expert-data-parallel ranks. Parameters: embedding (V + s) h, per block 4h^2 + 8h + hE outside the
experts and E experts of 8h^2 + 5h, head 2h + hV.
"""

from __future__ import annotations

import json
import math

from tests.conftest import assert_same_model, split_sizes, train_json
from tests.mpiutil import run_mpi

L, H, A, S, V, B, E, K, C, STEPS = 2, 16, 2, 8, 17, 8, 4, 2, 1.0, 2
ARGS = ["--arch", "gpt", "--n-layers", str(L), "--hidden", str(H), "--heads", str(A), "--seq-len", str(S)]
ARGS += ["--vocab", str(V), "--dataset", "copy", "--samples", "64", "--batch", str(B), "--steps", str(STEPS)]
ARGS += ["--dtype", "float64", "--optimizer", "adam", "--lr", "0.01", "--kernels", "numpy"]
ARGS += ["--experts", str(E), "--top-k", str(K), "--capacity-factor", str(C)]
M = (V + S) * H + L * (4 * H * H + 8 * H + H * E) + 2 * H + H * V  # outside the experts
EXPERT = 8 * H * H + 5 * H


def kept_in_order(Hs: list, cap: int) -> list:
    """An expert's cap slots go to rank 0's assignments first, then rank 1's, ..."""
    before, kept = [0] * E, []
    for row in Hs:
        kept.append([max(0, min(n, cap - b)) for n, b in zip(row, before)])
        before = [b + n for b, n in zip(before, row)]
    return kept


def ring_allreduce(n: int, p: int, r: int) -> int:
    c = split_sizes(n, p)
    return 2 * n - c[r] - c[(r + 1) % p] if p > 1 else 0


def check_bytes(m: dict, D: int, P: int, G: int, bpe: int = 8, states=(8, 8, 16)) -> None:
    """Every rank's ledger, op by op, against the module docstring's closed forms; `bpe` of the
    activations and gradients, `states` the bytes per parameter of params, grads, Adam's state."""
    routed = m["moe"]["routed_by_rank"]
    assert len(routed) == STEPS * G and all(len(micro) == L for micro in routed)
    per = E // P
    for d in range(D):
        j, g = d % P, d - d % P
        mine = range(j * per, (j + 1) * per)
        out = back = 0
        for i, micro in enumerate(routed):
            tokens = split_sizes(B, G)[i % G] * S
            for Hs in micro:
                kept = kept_in_order(Hs, math.ceil(C * K * tokens / E))
                out += sum(kept[d][e] for e in range(E) if e not in mine)
                back += sum(kept[s][e] for s in range(g, g + P) if s != d for e in mine)
        by_op = m["comm"]["ranks"][d]["by_op"]
        want = {}
        if P > 1:
            for op, rows in (("ep-dispatch", out), ("ep-combine-grad", out), ("ep-combine", back)):
                want[f"activation/{op}"] = rows * H * bpe
            want["activation/ep-dispatch-grad"] = back * H * bpe
        edp = D // P
        if D > 1:
            want["model/grad-allreduce"] = ring_allreduce(M, D, d) * bpe * STEPS
        if edp > 1:
            want["model/expert-grad-allreduce"] = ring_allreduce(L * per * EXPERT, edp, d // P) * bpe * STEPS
        got = {k: v["sent"] for k, v in by_op.items() if not k.startswith("control")}
        assert got == want, (d, got, want)
        for op in ("ep-dispatch", "ep-combine", "ep-combine-grad", "ep-dispatch-grad"):
            if P > 1:
                assert by_op[f"activation/{op}"]["messages"] == (P - 1) * L * STEPS * G
        n = M + L * per * EXPERT
        mem = m["memory"]["ranks"][d]
        assert (mem["params"], mem["grads"], mem["optimizer"]) == tuple(n * b for b in states)
    assert m["prediction_mismatches"] == []
    for r, p in zip(m["comm"]["ranks"], m["predicted"]["comm"]["ranks"]):  # predicted op by op, too
        assert {k: v["sent"] for k, v in r["by_op"].items() if not k.startswith("control")} == {
            k: v["sent"] for k, v in p["by_op"].items()
        }


def activations(m: dict, D: int, P: int, G: int, bpe: int = 8, router: int = 8) -> list[int]:
    """Per rank, the most any micro-step keeps at the end of its forward (costmodel/gpt_moe.py's list:
    token ids 8 B each; head 2h + 1 and per block 7h + a s + 2 + h + E per token; h per kept output
    that came back; 9h per row each of the rank's experts received; the router's E per token in its
    own type, float32 under mixed precision)."""
    per, out = E // P, []
    for d in range(D):
        j, g, peak = d % P, d - d % P, 0
        for i, micro in enumerate(m["moe"]["routed_by_rank"]):
            seqs = split_sizes(B, G)[i % G]
            n = split_sizes(seqs, D)[d] * S
            elems = n * (2 * H + 1)
            for Hs in micro:
                kept = kept_in_order(Hs, math.ceil(C * K * seqs * S / E))
                elems += n * (7 * H + A * S + 2 + H) + sum(kept[d]) * H + n * E * router // bpe
                elems += sum(
                    9 * H * kept[s][e] for s in range(g, g + P) for e in range(j * per, (j + 1) * per)
                )
            peak = max(peak, 8 * n + bpe * elems)
        out.append(peak)
    return out


def test_dp2_ep2_with_accumulation_equals_serial_with_exact_bytes(serial, tmp_path):
    """dp2 x ep2 with --grad-accum 2 (capacity per micro-step) equals serial; its checkpoint resumes
    serially onto the same model."""
    extra = ["--grad-accum", "2"]
    ref = serial([*ARGS, *extra])
    assert ref["params"] == M + L * E * EXPERT
    assert sum(sum(step) for step in ref["moe"]["dropped"]) > 0  # capacity drops tokens here
    ckpt = tmp_path / "ckpt"
    every = ["--checkpoint-dir", str(ckpt), "--checkpoint-every", "1"]
    run = train_json(2, [*ARGS, *extra, "--dp", "2", "--ep", "2", *every], tmp_path)
    assert_same_model(run, ref, rtol=1e-12)
    # the dp2 x ep2 checkpoint of step 1 (every expert gathered to full shape) resumed serially
    resumed = train_json(1, [*ARGS, *extra, "--resume", str(ckpt / "step-000001")], tmp_path, "resumed")
    assert_same_model(resumed, {**ref, "losses": ref["losses"][1:]}, rtol=1e-12)
    assert run["moe"]["routed_by_rank"] and run["moe"]["dropped"] == ref["moe"]["dropped"]
    check_bytes(run, 2, 2, 2)
    check_bytes(ref, 1, 1, 2)
    assert [r["activations_peak"] for r in run["memory"]["ranks"]] == activations(run, 2, 2, 2)
    assert [r["activations_peak"] for r in ref["memory"]["ranks"]] == activations(ref, 1, 1, 2)


def test_tour_with_experts_runs_dp_and_ep_layouts_equal_to_serial(tmp_path):
    """`tour --arch gpt --experts 4` on 4 ranks: serial, dp4, dp4 x ep2, dp4 x ep4 (and the cp layouts
    cp2, cp4, dp2 x cp2, dp2 x cp2 x ep2: the same drops, exact predictions), each with
    bytes=pred exact (the tour fails otherwise), losses equal to serial's at 1e-12, bytes = closed form."""
    res = run_mpi(4, ["tour", *ARGS, "--quiet", "--out", str(tmp_path)], timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = [line.split() for line in res.stdout.splitlines() if line.split()[-1:] == ["exact"]]
    cp = ["cp2", "cp4", "dp2xcp2", "dp2xcp2xep2"]  # parallel/context_expert.py (test_context_expert.py)
    assert [r[0] for r in rows] == ["serial", "dp4", "dp4xep2", "dp4xep4", *cp], res.stdout
    ref = json.loads((tmp_path / "serial.json").read_text())
    for name in cp:
        m = json.loads((tmp_path / f"{name}.json").read_text())
        assert max(abs(a / b - 1) for a, b in zip(m["losses"], ref["losses"])) <= 1e-12
        assert m["moe"]["dropped"] == ref["moe"]["dropped"] and m["prediction_mismatches"] == []
    for name, P in (("dp4", 1), ("dp4xep2", 2), ("dp4xep4", 4)):
        m = json.loads((tmp_path / f"{name}.json").read_text())
        assert max(abs(a / b - 1) for a, b in zip(m["losses"], ref["losses"])) <= 1e-12
        check_bytes(m, 4, P, 1)
        assert [r["activations_peak"] for r in m["memory"]["ranks"]] == activations(m, 4, P, 1)


def test_mixed_bf16_dp2_ep2_bytes_and_memory(serial, tmp_path):
    """--precision mixed-bf16: 2-byte activations, all-to-alls and gradients, float32 master and Adam
    state (12 B a parameter), the router's probabilities in float32 (Switch's selective precision);
    the first step's loss is serial's up to bfloat16 roundoff."""
    args = [a for a in ARGS if a not in ("--dtype", "float64")] + ["--precision", "mixed-bf16"]
    ref = serial(args)
    run = train_json(2, [*args, "--dp", "2", "--ep", "2"], tmp_path)
    assert abs(run["losses"][0] / ref["losses"][0] - 1) <= 1e-3
    check_bytes(run, 2, 2, 1, bpe=2, states=(2, 2, 12))
    assert [r["activations_peak"] for r in run["memory"]["ranks"]] == activations(run, 2, 2, 1, 2, 4)
    assert [r["activations_peak"] for r in ref["memory"]["ranks"]] == activations(ref, 1, 1, 1, 2, 4)
