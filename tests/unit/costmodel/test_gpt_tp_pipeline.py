"""costmodel/gpt_tp_pipeline.py on shapes too large to run: tp inside pipeline stages moves, over all
its ranks, exactly the tensor-parallel bytes of the same model without stages, and the pipeline's
boundary bytes are the serial pipeline's times t (or the same, split in t, under --sp).

Why they must agree: a pipeline of S stages with M micro-batches runs every unit on every micro-batch
once, as --tp alone with --grad-accum M does on the same b-sequence parts; the tp messages of a unit
depend only on its micro-batch's rows, so summed over all ranks the two layouts' tp bytes are equal.
(The MPI test, tests/mpi/parallel/pipeline/test_gpt_tp_pipeline.py, checks a small run against the
ledger; this checks the closed form's bookkeeping on a shape with 8 blocks, t = 4, 3 stages.)
"""

from __future__ import annotations

import pytest

from simpar.config import RunConfig
from simpar.costmodel import predict_from_config
from simpar.costmodel.hardware import LOCAL_DEFAULTS

SHAPE = dict(arch="gpt", dataset="copy", blocks=8, hidden=64, heads=8, seq_len=16, vocab=64, batch=24)
TP_OPS = ("tp-", "sp-gather", "sp-scatter", "vocab-")


def op_totals(pred: dict, prefixes) -> dict:
    out: dict = {}
    for r in pred["comm"]["ranks"]:
        for key, v in r["by_op"].items():
            cat, op = key.split("/")
            if cat == "activation" and op.startswith(prefixes):
                out[op] = out.get(op, 0) + v["sent"]
    return out


@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved"])
def test_tp_inside_stages_moves_the_tp_bytes_of_tp_alone(sp, schedule):
    t, S, M = 4, 3, 3
    extra = dict(virtual_stages=2) if schedule == "interleaved" else {}
    tppp = RunConfig(**SHAPE, tp=t, pp=S, dp=1, microbatches=M, schedule=schedule, sp=sp, steps=1, **extra)
    tp = RunConfig(**SHAPE, tp=t, dp=1, grad_accum=M, sp=sp, steps=1)
    a = predict_from_config(tppp, t * S, steps=1, hw=LOCAL_DEFAULTS)
    b = predict_from_config(tp, t, steps=1, hw=LOCAL_DEFAULTS)
    assert op_totals(a, TP_OPS) == op_totals(b, TP_OPS)
    serial_pp = RunConfig(**SHAPE, pp=S, dp=1, microbatches=M, schedule=schedule, steps=1, **extra)
    c = predict_from_config(serial_pp, S, steps=1, hw=LOCAL_DEFAULTS)
    pp_ops = ("pp-send-act", "pp-send-grad")
    copies = 1 if sp else t  # under --sp each tp rank sends its 1/t rows: one copy in all
    assert op_totals(a, pp_ops) == {op: copies * n for op, n in op_totals(c, pp_ops).items()}
