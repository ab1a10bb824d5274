"""`simpar validate`, `bench --fit-profile` and predict == simulate on the GPU profiles, as users run
them: real processes (the data, the parsers and the tuner are checked in-process in
tests/unit/report/test_validation.py)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from simpar.costmodel import hardware
from tests.paths import ROOT
from tests.unit.report.test_validation import shipped, synthetic_log


def simpar(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "simpar", *args], capture_output=True, text=True, timeout=120, cwd=cwd or ROOT
    )


def test_validate_passes_on_the_shipped_data_and_draws_the_picture(tmp_path):
    res = simpar("validate", "--json", "-o", str(tmp_path / "v.png"))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    out = json.loads(res.stdout)
    s = out["summary"]
    assert s["failed"] == [] and s["points"] == len(shipped())
    assert s["median_abs_error"] <= 0.10
    assert all(abs(r["ratio"] - 1) <= r["tolerance"] for r in out["rows"])
    assert (tmp_path / "v.png").stat().st_size > 10_000


def test_validate_fails_when_a_point_leaves_its_tolerance(tmp_path):
    rows = list(csv.DictReader(open(ROOT / "validation" / "collectives.csv")))
    moved = next(r for r in rows if r["id"] == "h200-all-gather-auto-16g")
    moved["value"] = str(float(moved["value"]) * 1.3)  # 30% off the measurement: out of +-20%
    path = tmp_path / "moved.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    res = simpar("validate", "--data", str(path))
    assert res.returncode == 1
    assert "1 of" in res.stderr and "h200-all-gather-auto-16g" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--data", "no-such.csv"], "cannot read validation data"),
        (["--hardware", "no-such-profile"], "unknown hardware"),
        (["--bogus"], "unrecognized arguments"),
    ],
)
def test_bad_input_is_one_line_and_status_2(args, message):
    res = simpar("validate", *args)
    assert res.returncode == 2 and res.stderr.startswith("simpar: error:") and message in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


# A log as all_reduce_perf prints it (nccl-tests 2.x: a `root` column). The two rows are real (8x H20,
# nccl-tests 2.19.7, github.com/kvcache-ai/Mooncake/pull/3484); the Rank lines are cut to 4 ranks on
# two hosts so that the node count is exercised.
def test_fit_profile_recovers_latency_and_bandwidth_and_loads(tmp_path):
    sizes = [1 << k for k in range(12, 31, 2)]
    one = tmp_path / "ag-1node.log"
    one.write_text(synthetic_log("all_gather", 8, 1, hop=2.5e-6, bw=300e9, sizes=sizes))
    two = tmp_path / "ar-2nodes.log"
    # 16 ranks on 2 hosts: per step (14 x 2.5 us + 1 x 12 us) / 15; 300 GB/s bus over 8 rails
    two.write_text(synthetic_log("all_reduce", 16, 2, hop=(14 * 2.5e-6 + 12e-6) / 15, bw=300e9, sizes=sizes))
    out = tmp_path / "my.json"
    res = simpar("bench", "--fit-profile", str(one), str(two), "--hardware", "dgx-h100", "-o", str(out))
    assert res.returncode == 0, res.stderr
    hw = hardware.load(str(out))
    # (the log prints times to 4 decimals of a microsecond, as the fit sees them)
    assert hw.intra_bw == pytest.approx(300e9, rel=1e-5)
    assert hw.intra_alpha == pytest.approx(2.5e-6, rel=1e-4)
    assert hw.inter_alpha == pytest.approx(12e-6, rel=1e-3)
    assert hw.nic_bw * 8 == pytest.approx(300e9, rel=1e-5)  # the bus bandwidth over the 8 rails
    # and the fitted profile predicts the logs it was fitted to
    res = simpar("validate", "--data", str(one), str(two), "--hardware", str(out), "--json")
    assert res.returncode == 0, res.stderr
    ratios = [r["ratio"] for r in json.loads(res.stdout)["rows"]]
    assert max(abs(r - 1) for r in ratios) < 1e-4


# -- the same model in the closed form and the simulated clock -------------------------------------------


def gpu_profile(tmp_path, base: str, **changes) -> str:
    """A preset with some numbers changed, as a JSON profile (what --hardware FILE.json loads)."""
    d = {**hardware.load(base).to_dict(), **changes, "name": f"{base}-test"}
    path = tmp_path / f"{base}-{len(changes)}.json"
    path.write_text(json.dumps(d))
    return str(path)


@pytest.mark.parametrize(
    "hw, layout",
    [
        ("h200", dict(dp=4, collectives="auto")),
        ("dgx-a100", dict(tp=2, dp=2)),
        ("dgx-h100", dict(dp=4, zero=3)),
        # ZeRO's per-layer calls of very different sizes take different protocols: priced call by call
        ("dgx-h100", dict(dp=4, zero=2, layers="64,4096,64,10", dtype="float64")),
        ("nodes-of-2", dict(dp=2, pp=2, collectives="auto")),  # dp and pp cross nodes: rails, net steps
        ("nodes-of-2", dict(tp=2, dp=2, sp=True, arch="resmlp")),
    ],
)
def test_predict_equals_simulate_on_gpu_profiles(tmp_path, hw, layout):
    """NCCL's protocols, the reduction inside the copy and the launch cost, in both the closed form and
    the simulated clock, on the GPU presets and on DGX H100 nodes of 2 GPUs (2 NDR rails each)."""
    from simpar.run.launch import launch

    if hw == "nodes-of-2":
        hw = gpu_profile(tmp_path, "ib-cluster", devices_per_node=2, nics_per_node=2)
    layout = {"layers": "64,128,128,10", **layout}
    m = launch(4, clock="sim", hardware=hw, steps=2, batch=64, **layout)
    assert m["prediction_mismatches"] == []
    assert m["predicted"]["time"]["step_s"] == pytest.approx(m["time"]["sim"]["step_s"], rel=1e-6)


def test_nvlink_sharp_under_collectives_auto_in_both_clocks(tmp_path):
    """On 6 GPUs of one NVSwitch node, --collectives auto may take NVLS for the gradient all-reduce (here
    made cheap enough to win at this size: its latency set to 1 us); --collectives ring may not. Both
    clocks agree on each, and on auto being the faster."""
    from simpar.run.launch import launch

    hw = gpu_profile(tmp_path, "dgx-h100", nvls_lat=1e-6, nvls_bw=2000e9)
    steps = {}
    for algo in ("ring", "auto"):
        common = dict(clock="sim", hardware=hw, layers="64,512,512,10", steps=2, batch=60)
        m = launch(6, dp=6, collectives=algo, **common)
        sim, pred = m["time"]["sim"]["step_s"], m["predicted"]["time"]["step_s"]
        assert pred == pytest.approx(sim, rel=1e-6), algo
        steps[algo] = sim
    assert steps["auto"] < steps["ring"]
