"""The last MoE x cp pieces in ONE launch of 8 ranks (tests/mpi/scripts/train_each.py), each equal to
the serial run --grad-accum 4 in float64 with the SAME tokens dropped, every rank's ledger op by op and
its activation peak as costmodel/cp_moe_pipeline.py and cp_moe_tp.py predict (their closed forms:
tests/unit/costmodel/test_cp_moe_pipeline.py and test_cp_moe_tp.py), and closed forms written here:

  zb-h1 + --recompute full on pp2 x dp2 x ep2 x cp2, ring (pipeline/context_expert_stage.py): each
      stage's one block sends per micro-step 8 (C-1) b n h elements of K/V (the ring's forward hops
      again), and its forward's all-to-alls twice: ep-dispatch = 2 ep-combine-grad, ep-combine =
      2 ep-dispatch-grad (without recompute they are equal, test_gpt_moe.py). 9 sequences in micro-steps
      of 3, 2, 2, 2: a recomputed forward must re-plan on its own micro-step's rows (the segment table),
      not the last forward's.
  zb-v + --recompute selective on the full mesh pp2 x cp2 x tp2 --sp, ring: stage 1 holds both blocks,
      each sends per micro-step 8 (C-1) b n h/T of K/V (the ring's lse rebuilt by its forward) and 4
      sp-gathers of R h / T (R = b n rows); stage 0 (embedding and head) no K/V; a boundary R h / T.
  dp2 x ep2 x cp2 x tp2 --sp, Ulysses, no pipeline (context_expert_tensor.py on row shards): per
      micro-step 4 L sp-gathers and 2 L sp-scatters of R h / T, no tp all-reduce; per step the
      LayerNorms' gradients over tp, (4h L + 2h) elements (a ring of 2 sends what it reduces).
test_context_expert_tensor.py's model (4 heads, 18 words, h = 16, s = 8, L = 2, E = 4) with 9 sequences.
"""

from __future__ import annotations

from tests.conftest import split_sizes
from tests.mpi.parallel.pipeline.test_cp_moe_pipeline import sent, train_cases
from tests.mpi.parallel.test_context_expert_tensor import ARGS as MESH_ARGS
from tests.mpi.parallel.test_gpt_moe import H, L, S

C, T, STEPS = 2, 2, 2
N = split_sizes(9, 4)  # the micro-steps' sequences: 3, 2, 2, 2


def per_step(f) -> int:
    """Bytes over the run of f(micro-step's sequences) elements a micro-step, float64."""
    return STEPS * sum(f(n) for n in N) * 8


def test_zero_bubble_recompute_and_sp_on_moe_cp_meshes_equal_serial(serial, tmp_path):
    args = [*MESH_ARGS, "--batch", "9"]
    ref = serial([*args, "--grad-accum", "4"])
    assert sum(sum(step) for step in ref["moe"]["dropped"]) > 0
    pp = [*args, "--grad-accum", "2", "--microbatches", "2", "--pp", "2", "--cp", str(C)]
    cases = [
        ["zbh1", [*pp, "--dp", "2", "--ep", "2", "--schedule", "zb-h1", "--recompute", "full"]],
        ["zbv", [*pp, "--tp", "2", "--sp", "--schedule", "zb-v", "--recompute", "selective"]],
        ["sp", [*args, "--grad-accum", "4", "--dp", "2", "--ep", "2", "--cp", "2", "--tp", "2", "--sp"]],
    ]
    cases[2][1] += ["--cp-algo", "ulysses"]
    runs = train_cases(8, cases, tmp_path, ref)
    n = S // C  # a cp rank's tokens of a sequence
    for r, rank in enumerate(runs["zbh1"]["comm"]["ranks"]):
        d = r // C % 2
        got = sent(rank)
        assert got["activation/cp-kv"] == per_step(lambda N_i: 8 * (C - 1) * split_sizes(N_i, 2)[d] * n * H)
        assert got["activation/ep-dispatch"] == 2 * got["activation/ep-combine-grad"] > 0, r
        assert got["activation/ep-combine"] == 2 * got["activation/ep-dispatch-grad"] > 0, r
    for w, rank in enumerate(runs["zbv"]["comm"]["ranks"]):
        got, stage = sent(rank), w // (C * T)
        kv = per_step(lambda N_i: 2 * 8 * (C - 1) * N_i * n * H // T) if stage == 1 else None
        assert got.get("activation/cp-kv") == kv, w
        assert got["activation/pp-send-act" if stage == 0 else "activation/pp-send-grad"] == per_step(
            lambda N_i: N_i * n * H // T
        )
        if stage == 1:
            assert got["activation/sp-gather"] == per_step(lambda N_i: 2 * 4 * N_i * n * H // T)
    for w, rank in enumerate(runs["sp"]["comm"]["ranks"]):
        got, d = sent(rank), w // (C * T)
        R = lambda N_i: split_sizes(N_i, 2)[d] * n  # noqa: E731
        assert got["activation/sp-gather"] == per_step(lambda N_i: 4 * L * R(N_i) * H // T)
        assert got["activation/sp-scatter"] == per_step(lambda N_i: 2 * L * R(N_i) * H // T)
        assert got["model/sp-grad-allreduce"] == STEPS * (4 * H * L + 2 * H) * 8
        assert not any(op.startswith("activation/tp-") for op in got)
