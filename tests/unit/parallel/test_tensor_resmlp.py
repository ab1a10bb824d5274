"""--arch resmlp under --tp/--sp in the cost model: the same bytes, row parts divided by t; plan shows it.

The tests that launch real MPI jobs: tests/mpi/parallel/test_tensor_resmlp.py.
"""

from __future__ import annotations

from simpar import costmodel as cm


def test_cost_model_sp_keeps_the_bytes_and_divides_the_row_parts_by_t():
    """In closed form, on a bigger model: --sp sends the same activation bytes as --tp, and keeps
    1/t of what LayerNorm, the residual and the projections hold (the module docstring's rows)."""
    widths, t, rows = [1024] + [2048] * 5 + [1000], 4, 512
    preds = {
        sp: cm.predict(cm.Spec(widths=widths, batch=rows, tp=t, arch="resmlp", sp=sp)) for sp in (False, True)
    }
    d, blocks = 2048, 4
    sent = {sp: p["comm"]["per_rank_max"]["activation"] for sp, p in preds.items()}
    assert sent[True] == sent[False] == blocks * 2 * (2 * (t - 1) * rows * d // t) * 4  # g + f, float32
    row_parts = 1024 + d + blocks * (2 * d + 1)
    kept = {sp: (rows // t if sp else rows) * row_parts + rows * blocks * (d + 2 * d // t) for sp in sent}
    for sp, p in preds.items():
        assert p["memory"]["max"]["activations_peak"] == kept[sp] * 4


def test_plan_shows_the_sp_saving_and_compare_tries_both(capsys):
    from simpar.cli.plan import plan_main
    from simpar.costmodel import hardware

    assert plan_main(["--arch", "resmlp", "--layers", "64,128,128,10", "--tp", "2", "--sp"]) == 0
    assert "sequence parallelism (--sp" in capsys.readouterr().out
    spec = cm.Spec(widths=[64, 128, 128, 10], batch=64, arch="resmlp")
    ranked, _ = cm.compare.rank_layouts(spec, hardware.load("dgx-h100"), 4, None)
    assert {"tp4", "tp4-sp", "dp2xtp2", "dp2xtp2-sp"} <= {p["layout"] for p in ranked}
