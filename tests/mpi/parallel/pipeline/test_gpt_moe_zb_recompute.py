"""--arch gpt --experts --pp with the zero-bubble schedules and --recompute (parallel/pipeline/
expert_stage.py, model/gpt_moe_split.py): equal to the serial run with --grad-accum G M in float64,
tokens dropped by capacity included, bytes and activation peaks exact. Two launches of 4 ranks
(tests/mpi/parallel/test_gpt_moe.py's model), each covering two pieces at once:

  zb-h1 + --recompute full, 3 micro-batches of 3, 3 and 2 sequences: micro-step 2 has another
      capacity than 0 and 1, and stage 0 recomputes micro-batch 1 after the forward of micro-batch 2
      (F0 F1 B0 F2 B1 ...), so a recomputation on the last forward's N would route otherwise (the
      stage's check raises) and drop other tokens. The ledger: the closed form of
      test_gpt_moe_pipeline.check_bytes with ep-dispatch and ep-combine sent twice (the forward's
      all-to-alls again), the backward's two once; the B/W split sends nothing more.
  zb-v + --recompute selective: four one-unit chunks (stage 0 the embedding and the head, stage 1
      both blocks), each block's softmax output dropped and rebuilt, no message more; the ledger op by
      op equals costmodel/gpt_moe_pipeline.py's (whose recompute forms tests/unit/costmodel/
      test_gpt_moe_pipeline.py writes out).
  pp2 x tp2 --sp, zb-v + --recompute full: the tp halves (expert_tensor_split.py; the embedding's and
      head's from tensor_gpt_split.py), row shards at the boundaries, the LayerNorms' gradients summed
      over tp, and the re-run forward's all-gathers and reduce-scatters, the ledger op by op against
      the prediction (tests/unit/costmodel/test_gpt_moe_pipeline.py writes those --sp forms out).
The first two on pp2 x dp2 x ep2; every case's activation peaks equal the prediction.
"""

from __future__ import annotations

import pytest

from tests.conftest import assert_same_model, train_json
from tests.mpi.parallel.pipeline.test_gpt_moe_pipeline import check_bytes
from tests.mpi.parallel.test_gpt_moe import ARGS

PP = {1: ["--pp", "2", "--dp", "2", "--ep", "2"], 2: ["--pp", "2", "--tp", "2", "--sp", "--vocab", "18"]}


def same_ledger_as_predicted(run: dict) -> None:
    assert run["prediction_mismatches"] == []
    for r, p in zip(run["comm"]["ranks"], run["predicted"]["comm"]["ranks"]):
        assert {k: v["sent"] for k, v in r["by_op"].items() if not k.startswith("control") and v["sent"]} == {
            k: v["sent"] for k, v in p["by_op"].items()
        }
    got = [r["activations_peak"] for r in run["memory"]["ranks"]]
    assert got == [r["activations_peak"] for r in run["predicted"]["memory"]["ranks"]]


@pytest.mark.parametrize(
    "schedule,recompute,M,T",
    [("zb-h1", "full", 3, 1), ("zb-v", "selective", 2, 1), ("zb-v", "full", 2, 2)],
)
def test_zero_bubble_with_recompute_equals_serial(serial, tmp_path, schedule, recompute, M, T):
    vocab = PP[T][-2:] if T > 1 else []  # the vocabulary split over tp: V = 18
    ref = serial([*ARGS, *vocab, "--grad-accum", str(M)])
    assert sum(sum(step) for step in ref["moe"]["dropped"]) > 0
    layout = ["--schedule", schedule, "--recompute", recompute, "--microbatches", str(M)]
    run = train_json(4, [*ARGS, *PP[T], *layout], tmp_path)
    assert_same_model(run, ref, rtol=1e-12)
    assert run["moe"]["dropped"] == ref["moe"]["dropped"]
    for micro, ref_micro in zip(run["moe"]["routed_by_rank"], ref["moe"]["routed_by_rank"]):
        assert [[sum(col) for col in zip(*Hs)] for Hs in micro] == [Hs[0] for Hs in ref_micro]
    if schedule == "zb-h1":  # two chunks: stage s holds block s + 1, as check_bytes assumes (dp2 x ep2)
        check_bytes(run, 2, 2, 1, M, redo=1)
    same_ledger_as_predicted(run)
