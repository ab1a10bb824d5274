"""--arch gpt --experts with --cp and --tp (parallel/context_expert_tensor.py): cp2 x tp2 (ring, 4 ranks)
and dp2 x ep2 x cp2 x tp2 (Ulysses, 8 ranks), both equal to serial in float64 with the SAME tokens
dropped, every rank's ledger op by op against closed forms written here from the run's routing, the
cp2 x tp2 checkpoint resumed serially. test_context_expert.py's model with 4 heads (Ulysses gives
each cp rank whole heads of a tp rank's a/T = 2) and 18 words (the vocabulary splits over tp).

Closed forms, world rank w = (d C + c) T + k, per micro-step (b_d of its B_k rows on dp rank d,
n = s/C tokens of each on cp rank c, R = b_d n rows) and block:
  cp-kv (ring)      6 (C-1) b_d n h/T elements in 3 (C-1) messages (the ring carries a/T heads)
  cp-alltoall       8 (C-1)/C b_d n h/T elements in 8 (C-1) messages (Ulysses)
  tp-g, tp-f        one ring all-reduce of R h each (attention only: the MoE part is whole on each)
  ep-*              test_context_expert.py's, from kept(d, c): the same on both tp ranks
per micro-step the vocabulary's: embed and head all-reduces of R h, an all-gather of T R maxima, an
all-reduce of 2R sums; per step the dense shard over the D C ranks of dpcp (rank d C + c), the
rank's experts over the D/P x C ranks of edpcp (rank (d div P) C + c).
"""

from __future__ import annotations

from tests.conftest import assert_same_model, split_sizes, train_json
from tests.mpi.parallel.test_context_expert import ARGS as CP_ARGS
from tests.mpi.parallel.test_context_expert import EXPERT, STEPS, B, E, G, H, L, S, rank_kept, ring_allreduce

A, V, T = 4, 18, 2
ARGS = [*CP_ARGS]
ARGS[ARGS.index("--heads") + 1], ARGS[ARGS.index("--vocab") + 1] = str(A), str(V)
DENSE = V * H // T + S * H + L * (4 * H * H // T + 3 * H // T + 5 * H + H * E) + 2 * H + H * V // T


def expected(m: dict, D: int, C: int, P: int, algo: str) -> dict:
    """{world rank: {op: bytes sent}} (module docstring), 8 B an element."""
    per, n, want = E // P, S // C, {}
    for w in range(D * C * T):
        (d, c), k = divmod(w // T, C), w % T
        j, ops = d % P, {}

        def add(op, elems):
            if elems:
                ops[f"activation/{op}"] = ops.get(f"activation/{op}", 0) + elems * 8

        for i, micro in enumerate(m["moe"]["routed_by_segment"]):
            rows = split_sizes(B, G)[i % G]
            b = split_sizes(rows, D)[d]
            R = b * n
            for op, elems in (
                ("tp-g-allreduce", L * ring_allreduce(R * H, T, k)),
                ("tp-f-allreduce", L * ring_allreduce(R * H, T, k)),
                ("vocab-embed-allreduce", ring_allreduce(R * H, T, k)),
                ("vocab-head-allreduce", ring_allreduce(R * H, T, k)),
                ("vocab-ce-max", (T - 1) * R),
                ("vocab-ce-sums", ring_allreduce(2 * R, T, k)),
            ):
                add(op, elems)
            if algo == "ring":
                add("cp-kv", L * 6 * (C - 1) * b * n * H // T)
            else:
                add("cp-alltoall", L * 8 * (C - 1) * b * n * H // T // C)
            for Ts in micro if P > 1 else []:
                kept = rank_kept(Ts, rows, D, C)
                out = sum(kept[d, c][e] for e in range(E) if e // per != j) * H
                group = [q for q in range(d - j, d - j + P) if q != d]
                back = sum(kept[q, c][e] for q in group for e in range(j * per, (j + 1) * per)) * H
                for op, elems in (("dispatch", out), ("combine-grad", out), ("combine", back)):
                    add(f"ep-{op}", elems)
                add("ep-dispatch-grad", back)
        ops["model/grad-allreduce"] = ring_allreduce(DENSE, D * C, d * C + c) * 8 * STEPS
        experts = ring_allreduce(L * per * EXPERT, D // P * C, d // P * C + c) * 8 * STEPS
        if experts:
            ops["model/expert-grad-allreduce"] = experts
        want[w] = ops
    return want


def check(run: dict, D: int, C: int, P: int, algo: str) -> None:
    want = expected(run, D, C, P, algo)
    messages = 3 * (C - 1) if algo == "ring" else 8 * (C - 1)
    op = "activation/cp-kv" if algo == "ring" else "activation/cp-alltoall"
    for w, rank in enumerate(run["comm"]["ranks"]):
        got = {k: v["sent"] for k, v in rank["by_op"].items() if not k.startswith("control") and v["sent"]}
        assert got == want[w], (w, got, want[w])
        assert rank["by_op"][op]["messages"] == messages * L * STEPS * G
        n = DENSE + L * (E // P) * EXPERT
        mem = run["memory"]["ranks"][w]
        assert (mem["params"], mem["grads"], mem["optimizer"]) == (8 * n, 8 * n, 16 * n)
    assert run["prediction_mismatches"] == []
    got = [r["activations_peak"] for r in run["memory"]["ranks"]]
    assert got == [r["activations_peak"] for r in run["predicted"]["memory"]["ranks"]]


def test_cp2_tp2_and_dp2_ep2_cp2_tp2_drop_the_serial_tokens_with_exact_bytes(serial, tmp_path):
    """Both layouts (ring, Ulysses) equal serial at 1e-12 with the same drops; bytes as above; the
    cp2 x tp2 checkpoint of step 1 (gathered from cp rank 0's tp group) resumes on one process."""
    ref = serial(ARGS)
    assert sum(sum(step) for step in ref["moe"]["dropped"]) > 0  # capacity drops tokens here
    ckpt = tmp_path / "ckpt"
    every = ["--checkpoint-dir", str(ckpt), "--checkpoint-every", "1"]
    for D, P, algo, extra in ((1, 1, "ring", every), (2, 2, "ulysses", [])):
        layout = ["--dp", str(D), "--ep", str(P), "--cp", "2", "--tp", str(T), "--cp-algo", algo]
        run = train_json(D * 2 * T, [*ARGS, *layout, *extra], tmp_path, f"dp{D}ep{P}{algo}")
        assert_same_model(run, ref, rtol=1e-12)
        assert run["moe"]["dropped"] == ref["moe"]["dropped"]
        assert run["moe"]["routed_per_expert"] == ref["moe"]["routed_per_expert"]
        check(run, D, 2, P, algo)
    resumed = train_json(1, [*ARGS, "--resume", str(ckpt / "step-000001")], tmp_path, "resumed")
    assert_same_model(resumed, {**ref, "losses": ref["losses"][1:]}, rtol=1e-12)
