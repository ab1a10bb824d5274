"""--tp 2 --sp --pp 2 in the cost model: each rank sends 1/t of --tp --pp's rows between stages.

The tests that launch real MPI jobs: tests/mpi/parallel/pipeline/test_sp_pipeline.py.
"""

from __future__ import annotations

from simpar import costmodel as cm


def test_cost_model_sends_one_tth_of_the_rows_between_stages():
    """In closed form, on a bigger model: with --sp each rank's pipeline bytes are 1/t of --tp --pp's,
    and its tp activation bytes are the same (reduce-scatter + all-gather = all-reduce)."""
    widths, t, batch = [1024] + [2048] * 6 + [1000], 4, 512
    spec = dict(widths=widths, batch=batch, tp=t, pp=2, arch="resmlp", microbatches=4)
    pred = {sp: cm.predict(cm.Spec(**spec, sp=sp)) for sp in (False, True)}
    for without, with_sp in zip(pred[False]["comm"]["ranks"], pred[True]["comm"]["ranks"]):
        for op in ("activation/pp-send-act", "activation/pp-send-grad"):
            assert (
                with_sp["by_op"].get(op, {"sent": 0})["sent"] * t
                == without["by_op"].get(op, {"sent": 0})["sent"]
            )
        tp_ops = lambda r, names: sum(r["by_op"].get(f"activation/{n}", {"sent": 0})["sent"] for n in names)
        assert tp_ops(with_sp, ("sp-gather", "sp-scatter")) == tp_ops(
            without, ("tp-g-allreduce", "tp-f-allreduce")
        )
    # stage 0's boundary: its micro-batches' rows / t, times the residual width, times 4 bytes
    assert pred[True]["comm"]["ranks"][0]["by_op"]["activation/pp-send-act"]["sent"] == batch // t * 2048 * 4
