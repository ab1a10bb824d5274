"""The plots get written, from metrics files shaped like `simpar train --metrics-out` writes them.

The metrics here are built in-process from the cost model (which equals the ledger, see
test_costmodel.py), so these tests need no MPI and take a few seconds.
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import pytest

from simpar.cli.plan import plan_main
from simpar.cli.plot import plot_main
from simpar.config import RunConfig, SimparError
from simpar.costmodel import predict_from_config
from simpar.costmodel.hardware import LOCAL_DEFAULTS
from simpar.report import plots
from simpar.report.tables import print_summary
from simpar.run.tour import print_tour_table

STEPS = 3


def fake_metrics(**layout) -> dict:
    """A metrics document for a digits run of this layout, with the ledger numbers it would measure."""
    cfg = RunConfig(steps=STEPS, **layout)
    world = (cfg.dp or 1) * cfg.tp * cfg.pp
    cfg.dp = cfg.dp or 1
    pred = predict_from_config(cfg, world, steps=STEPS, hw=LOCAL_DEFAULTS)
    ranks = [
        {
            "rank": r["rank"],
            "coords": r["coords"],
            "sent": r["sent"],
            "received": r["sent"],
            "messages": r["messages"],
            "by_op": r["by_op"],
        }
        for r in pred["comm"]["ranks"]
    ]
    total = {c: sum(r["sent"][c] for r in ranks) for c in ("data", "model", "activation")}
    return {
        "config": cfg.to_dict(),
        "world_size": world,
        "mesh": {"dp": cfg.dp, "tp": cfg.tp, "pp": cfg.pp},
        "layout": pred["layout"],
        "params": 42634,
        "steps": STEPS,
        "losses": [2.3, 2.2, 2.1],
        "final_loss": 2.1,
        "comm": {"ranks": ranks, "total_sent": total, "per_step": {c: v / STEPS for c, v in total.items()}},
        "memory": {"ranks": pred["memory"]["ranks"], "max": pred["memory"]["max"]},
        "time": {"total_s": 0.3, "step_s": 0.1, "samples_per_s": 640.0},
    }


@pytest.fixture(scope="module")
def results():
    return [
        ("serial", fake_metrics(dp=1)),
        ("dp2", fake_metrics(dp=2)),
        ("dp2-zero3", fake_metrics(dp=2, zero=3)),
        ("tp2", fake_metrics(dp=1, tp=2)),
        ("pp2-1f1b", fake_metrics(dp=1, pp=2)),
    ]


def is_png(path) -> bool:
    import matplotlib.image as mpimg

    with open(path, "rb") as f:
        if f.read(8) != b"\x89PNG\r\n\x1a\n":
            return False
    height, width = mpimg.imread(str(path)).shape[:2]
    return width >= 400 and height >= 300


def test_tour_plots_written(results, tmp_path):
    written = plots.tour_plots(results, str(tmp_path))
    names = sorted(p.split("/")[-1] for p in written)
    assert names == ["comm_by_layout.png", "comm_scaling.png", "memory_by_layout.png"]
    assert all(is_png(p) for p in written)
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temporary files


def test_plot_main_compares_metrics_files(results, tmp_path):
    paths = []
    for name, m in results[1:3]:
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(m))
        paths.append(str(path))
    out = tmp_path / "compare.png"
    with redirect_stdout(io.StringIO()):
        assert plot_main([*paths, "-o", str(out), "--scaling", str(tmp_path / "scaling.png")]) == 0
    assert is_png(out) and is_png(tmp_path / "scaling.png")


def test_plot_main_errors(tmp_path):
    with pytest.raises(SimparError, match="cannot read"):
        plot_main([str(tmp_path / "missing.json"), "-o", str(tmp_path / "x.png")])
    bad = tmp_path / "bad.json"
    bad.write_text('{"losses": []}')
    with pytest.raises(SimparError, match="not a simpar metrics file"):
        plot_main([str(bad), "-o", str(tmp_path / "x.png")])
    with pytest.raises(SimparError, match="trace"):  # --timeline goes to simpar.timeline
        plot_main(["--timeline", str(tmp_path / "no-trace.json"), "-o", str(tmp_path / "t.png")])


def test_prediction_ticks_skip_old_files_but_not_cost_model_bugs(results, monkeypatch):
    """A metrics file without a config gets no cost-model tick; a cost model that crashes is not
    quietly drawn without its tick (the plots would then hide the very failure they exist to show)."""
    _, m = results[1]
    assert plots._prediction(m)["comm"]["per_step"]["model"] > 0
    assert plots._prediction({k: v for k, v in m.items() if k != "config"}) is None

    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug in the cost model")

    monkeypatch.setattr("simpar.costmodel.predict_from_config", broken)
    with pytest.raises(ZeroDivisionError):
        plots._prediction(m)


def finished_run(modeled: bool) -> dict:
    """fake_metrics(dp=2) with what `train` adds at the end, its bytes counted or (like
    --collectives mpi) the all-reduce's modeled."""
    m = fake_metrics(dp=2)
    m["comm"]["modeled_ops"] = ["model/grad-allreduce"] if modeled else []
    m["kernels"] = "numpy"
    m["time"]["step_s_median"] = 0.1
    m["predicted"] = {"time": {"step_s": 0.1}}
    m["prediction_mismatches"] = []
    return m


def test_modeled_bytes_are_labelled_and_not_called_exact():
    """--collectives mpi: MPI hides its messages and the ledger books the formula's volume, which then
    equals the cost model's by construction; the summary and the tour must not call that exact."""

    def printed(fn, *args) -> str:
        with redirect_stdout(io.StringIO()) as text:
            fn(*args)
        return text.getvalue()

    def tour_verdict(m: dict) -> str:
        rows = printed(print_tour_table, [("dp2", m)], "float64").splitlines()
        return next(line for line in rows if line.startswith("dp2 ")).split()[-1]

    counted, modeled = printed(print_summary, finished_run(False)), printed(print_summary, finished_run(True))
    assert "cost model: exact (" in counted and "modeled" not in counted
    assert "exact" not in modeled and "construction, not by measurement" in modeled
    assert "model*" in modeled and "* modeled, not counted: model/grad-allreduce" in modeled
    assert tour_verdict(finished_run(False)) == "exact"
    assert tour_verdict(finished_run(True)) == "modeled"
    assert "'modeled': MPI's own" in printed(print_tour_table, [("dp2", finished_run(True))], "float64")
    wrong = dict(finished_run(True), prediction_mismatches=["rank 0 model: measured 1 B, predicted 2 B"])
    assert tour_verdict(wrong) == "NO"


def test_train_summary_asks_to_calibrate_only_when_uncalibrated(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no calibration cache here
    with redirect_stdout(io.StringIO()) as text:
        print_summary(finished_run(False))
    assert "'local', uncalibrated defaults: run `python -m simpar bench --calibrate`" in text.getvalue()
    path = tmp_path / "simpar" / "hardware-local.json"
    path.parent.mkdir()
    path.write_text(json.dumps(dict(LOCAL_DEFAULTS.to_dict(), description="measured here")))
    with redirect_stdout(io.StringIO()) as text:
        print_summary(finished_run(False))
    assert "uncalibrated" not in text.getvalue() and "'local', measured by" in text.getvalue()


def test_plan_sweep_plot(tmp_path):
    out = tmp_path / "sweep.png"
    text = io.StringIO()
    with redirect_stdout(text):
        assert (
            plan_main(
                [
                    "--layers",
                    "784,512,512,10",
                    "--batch",
                    "256",
                    "--sweep",
                    "tp=1,2,4,3",
                    "--hardware",
                    "dgx-h100",
                    "-o",
                    str(out),
                ]
            )
            == 0
        )
    assert is_png(out)
    assert "not possible" in text.getvalue()  # tp=3 does not divide the hidden widths


def test_compare_figure_titles_fit_and_say_what_the_plotted_runs_keep():
    """`simpar plot dp.json tp.json`: each panel's title stays inside the figure, clear of the other
    panel's and of the suptitle; the memory note names --sp only when an --sp run is plotted."""
    res = dict(arch="resmlp")
    plain = [("dp4", fake_metrics(dp=4, **res)), ("tp4", fake_metrics(dp=1, tp=4, **res))]
    with_sp = [*plain, ("tp4-sp", fake_metrics(dp=1, tp=4, sp=True, **res))]
    for results in (plain, with_sp):
        fig = plots.compare_figure(results)
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        page = fig.bbox
        traffic, memory = (ax.title.get_window_extent(renderer) for ax in fig.axes[:2])
        top = fig._suptitle.get_window_extent(renderer)
        for box in (traffic, memory, top):
            assert page.x0 <= box.x0 and box.x1 <= page.x1 and box.y1 <= page.y1, box
        assert traffic.x1 < memory.x0  # side by side, not running into each other
        assert top.y0 >= max(traffic.y1, memory.y1)
        note = fig.axes[1].get_title().replace("\n", " ")
        assert "dp: 1/p of the rows" in note and "tp: every row" in note
        assert ("--sp" in note) == (results is with_sp)
        assert "pp:" not in note  # no pipeline run in either figure
        plots._plt().close(fig)
