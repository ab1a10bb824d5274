"""The tour offers every layout `train` runs with the chosen --arch/--precision, and nothing else.

The default tour (CI's `mpiexec -n 4 ... simpar tour --quick`) keeps its 11 layouts; mixed precision
adds the tensor-parallel ones it now runs; --arch resmlp adds tp x pp and each tensor-parallel layout
again with --sp. One MPI tour (resmlp, bfloat16: every one of those additions at once) checks that the
layouts it offers train, equal to serial and with bytes equal to the cost model's.
(test_simclock.py runs the default tour on the simulated clock.)
"""

from __future__ import annotations

import json
import os

from simpar.report.plots import activations_note
from simpar.run.launch import run
from simpar.run.tour import TOLERANCE
from tests.unit.run.test_tour import RESMLP_TOUR


def test_resmlp_bf16_tour_trains_every_layout_it_offers(tmp_path):
    out = tmp_path / "tour"
    args = ["tour", "--quick", "--arch", "resmlp", "--precision", "mixed-bf16", "--steps", "2"]
    res = run(4, [*args, "--out", str(out), "--no-plots"], timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"simpar tour: {len(RESMLP_TOUR)} layouts" in res.stdout
    # --no-plots: the metrics, no figure (test_tour_moe.py checks the figures)
    assert not list(out.glob("*.png")) and f"metrics in {out}/" in res.stdout
    # 4 ranks on fewer cores: the wall-clock table says why its pred err misses (run/oversubscribed.py)
    assert ("(pred err n/a*: 4 ranks on" in res.stdout) == ((os.cpu_count() or 1) < 4), res.stdout[-2000:]
    metrics = {name: json.loads((out / f"{name}.json").read_text()) for name in RESMLP_TOUR}
    serial = metrics["serial"]["losses"]
    for name, m in metrics.items():
        assert len(m["losses"]) == 2 and m["prediction_mismatches"] == [], name
        # bfloat16 layouts sum in another order: within the tour's 32 units of roundoff of serial
        worst = max(abs(a - b) / abs(b) for a, b in zip(m["losses"], serial))
        assert worst <= TOLERANCE["mixed-bf16"], (name, worst)
        assert m["config"]["sp"] == name.endswith("-sp"), name
    # the memory panel's note (simpar plot) speaks of --sp only when an --sp run is plotted
    tp, tp_sp = ("tp2xpp2", metrics["tp2xpp2"]), ("tp2xpp2-sp", metrics["tp2xpp2-sp"])
    assert not any("--sp" in piece for piece in activations_note([tp]))
    assert any("--sp" in piece for piece in activations_note([tp, tp_sp]))
    assert "pp:" in " ".join(activations_note([tp]))
