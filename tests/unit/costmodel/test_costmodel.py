"""The cost model: formulas against hand-derived numbers, `plan` on the command line, and -- the
heart of it -- predicted bytes per category per rank == what the ledger measured, for real runs.

Hand numbers use the papers' formulas: ring all-reduce 2(p-1)/p*N per rank (Thakur et al. 2005;
Patarasuk & Yuan 2009), ZeRO memory (2+2+K)P, 4P+KP/p, 2P+(2+K)P/p, (2+2+K)P/p for mixed-precision
Adam with K = 12 (Rajbhandari et al. 2020, sec. 5 and 7), the pipeline bubble (S-1)/(M+S-1)
(GPipe, Huang et al. 2019).
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import pytest

from simpar import costmodel as cm
from simpar.cli.plan import plan_main, standin_widths
from simpar.config import SimparError
from simpar.costmodel import hardware
from tests.conftest import DIGITS, layer_sizes


def run_plan(*argv) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        assert plan_main(list(argv)) == 0
    return out.getvalue()


# -- collective volumes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("n,p", [(1200, 4), (1201, 4), (7, 3), (2, 5), (42634, 3)])
def test_ring_volumes(n, p):
    ar = [cm.ring_allreduce(n, p, r) for r in range(p)]
    assert sum(c.sent for c in ar) == 2 * (p - 1) * n  # exactly, over all ranks
    assert all(c.messages == 2 * (p - 1) for c in ar)
    for r, c in enumerate(ar):  # each within 2 elements of 2(p-1)/p N
        assert abs(c.sent - 2 * (p - 1) * n / p) <= 2
    assert sum(cm.ring_reduce_scatter(n, p, r).sent for r in range(p)) == (p - 1) * n
    assert sum(cm.ring_allgather(n, p, r).sent for r in range(p)) == (p - 1) * n


def test_ring_allreduce_even():
    assert cm.ring_allreduce(1200, 4, 2).sent == 1800  # 2 * 3/4 * 1200
    assert cm.ring_allreduce(1200, 1, 0).sent == 0


@pytest.mark.parametrize("algorithm", ["ring", "rabenseifner", "tree", "ps", "mpi"])
def test_every_allreduce_moves_2_p_minus_1_n(algorithm):
    for p in (2, 3, 4, 5, 6, 8):
        for n in (1, 37, 1000):
            assert sum(cm.ALLREDUCE[algorithm](n, p, r).sent for r in range(p)) == 2 * (p - 1) * n


def test_allreduce_shapes():
    """Where the bytes go: the parameter server's rank 0 sends (p-1)N, the tree's root ceil(log2 p)N,
    Rabenseifner's ranks 2(q-1)/q N when p = q is a power of two."""
    assert cm.ps_allreduce(100, 5, 0).sent == 400 and cm.ps_allreduce(100, 5, 3).sent == 100
    assert cm.tree_allreduce(100, 8, 0).sent == 300 and cm.tree_allreduce(100, 8, 7).sent == 100
    assert [cm.rabenseifner_allreduce(800, 8, r).sent for r in range(8)] == [1400] * 8
    assert cm.rabenseifner_allreduce(800, 8, 0).messages == 6  # 2 log2 p


def test_data_parallel_step_bytes():
    """One bucket (P*4 bytes < 1 MiB) over dp = 2: each rank sends 2(p-1)/p * P * 4 = P * 4 bytes."""
    P = 42634
    pred = cm.predict(cm.Spec(widths=DIGITS, batch=64, dp=2), hardware.LOCAL_DEFAULTS)
    assert [r["sent"]["model"] for r in pred["comm"]["ranks"]] == [P * 4, P * 4]
    assert pred["comm"]["total_sent"] == {"data": 0, "model": 2 * P * 4, "activation": 0}


def test_zero_traffic_formulas():
    """Layers of 1024x1024+1024 elements split evenly over 8 ranks: ZeRO-1/2 = 2(p-1)/p P,
    ZeRO-3 = 3(p-1)/p P."""
    widths = [1024] * 5
    P, p = 4 * (1024 * 1024 + 1024), 8
    for stage, factor in ((0, 2), (1, 2), (2, 2), (3, 3)):
        spec = cm.Spec(widths=widths, batch=64, dp=p, zero=stage, bucket_mb=1000)
        sent = cm.predict_rank(spec, 3)["sent"]["model"]
        assert sent == factor * (p - 1) * P // p * 4, stage


def test_zero_memory_mixed_adam():
    """ZeRO paper (sec. 5): (2+2+K)P, 4P + KP/p, 2P + (2+K)P/p, (2+2+K)P/p with K = 12. simpar's
    stage 2/3 also hold ONE full layer's gradient buffer while it is reduce-scattered (2*n bytes),
    and stage 3 one full layer's fp16 parameters while it computes (another 2*n bytes)."""
    widths = [1024] * 9
    n = 1024 * 1024 + 1024
    P, p, K = 8 * n, 8, 12
    assert P == 8_396_800
    expect = {
        0: 16 * P,
        1: 4 * P + K * P // p,
        2: 2 * P + (2 + K) * P // p + 2 * n,
        3: (2 + 2 + K) * P // p + 2 * n + 2 * n,
    }
    assert expect[0] == 134_348_800 and expect[1] == 46_182_400
    for stage, total in expect.items():
        spec = cm.Spec(widths=widths, batch=64, dp=p, zero=stage, precision="mixed", optimizer="adam")
        mem = cm.predict_rank(spec, 5)["memory"]
        assert mem["params"] + mem["grads"] + mem["optimizer"] == total, stage


def test_zero3_params_shard_plus_largest_gathered_layer():
    """ZeRO-3 holds its chunk of every layer and, while a layer computes, that whole layer gathered
    (one at a time): params = (sum_l chunk_r(n_l) + max_l n_l) * bpe, with uneven chunks (digits, p = 3)."""
    sizes = [a * b + b for a, b in zip(DIGITS[:-1], DIGITS[1:])]
    p = 3
    for r in range(p):
        shard = sum(n // p + (r < n % p) for n in sizes)  # chunk r of n split p ways
        spec = cm.Spec(widths=DIGITS, batch=64, dp=p, zero=3, precision="fp64")
        mem = cm.predict_rank(spec, r)["memory"]
        assert mem["params"] == (shard + max(sizes)) * 8, r
        assert mem["grads"] == (shard + max(sizes)) * 8, r


def test_tensor_parallel_pair():
    """digits model, tp = 2: pair (0, 1) -> g all-reduces B x 128 (forward); f is skipped at layer 0;
    layer 2 (odd, last) is replicated. Per rank: 2(t-1)/t * 64*128 elements * 4 bytes."""
    spec = cm.Spec(widths=[64, 128, 128, 10], batch=64, tp=2)
    r = cm.predict_rank(spec, 1)
    assert r["sent"] == {"data": 0, "model": 0, "activation": 64 * 128 * 4}
    spec = cm.Spec(widths=DIGITS, batch=64, tp=2)  # two pairs: f at layer 2
    ops = cm.predict_rank(spec, 0)["ops"]
    assert ops[("activation", "tp-f-allreduce", "tp")].sent == 64 * 128 * 4
    assert ops[("activation", "tp-g-allreduce", "tp")].sent == (64 * 128 + 64 * 10) * 4


def test_pipeline_boundary_bytes_and_bubble():
    """pp = 2: one boundary of width h: B*h forward from stage 0, B*h backward from stage 1."""
    spec = cm.Spec(widths=[64, 128, 10], batch=64, pp=2, microbatches=4)
    r0, r1 = cm.predict_rank(spec, 0), cm.predict_rank(spec, 1)
    assert r0["sent"]["activation"] == r1["sent"]["activation"] == 64 * 128 * 4
    assert r0["messages"]["activation"] == 4
    assert cm.bubble_fraction(cm.Spec(widths=DIGITS, batch=64, pp=4, microbatches=8)) == pytest.approx(3 / 11)
    assert cm.bubble_fraction(
        cm.Spec(widths=DIGITS, batch=64, pp=4, microbatches=8, schedule="gpipe")
    ) == pytest.approx(3 / 11)
    assert cm.bubble_fraction(cm.Spec(widths=DIGITS, batch=64, pp=4, schedule="naive")) == pytest.approx(
        3 / 4
    )


def test_activation_peak_gpipe_vs_1f1b():
    """GPipe keeps all M micro-batches alive on stage 0, 1F1B at most S."""
    g = cm.predict_rank(cm.Spec(widths=DIGITS, batch=64, pp=2, microbatches=8, schedule="gpipe"), 0)
    f = cm.predict_rank(cm.Spec(widths=DIGITS, batch=64, pp=2, microbatches=8, schedule="1f1b"), 0)
    assert g["memory"]["activations_peak"] == 4 * f["memory"]["activations_peak"]


# -- hardware ----------------------------------------------------------------------------------------


def test_group_links_follow_the_rank_layout():
    hw = hardware.load("ib-cluster")
    assert hardware.group_link(hw, "tp", 4, 8, 2).name == "NVLink4"  # 8 consecutive ranks
    assert hardware.group_link(hw, "dp", 4, 8, 2).name == "IB-NDR"
    assert hardware.group_link(hw, "dp", 2, 4, 1).name == "NVLink4"  # dp*tp = 8 fits a node
    eth = hardware.load("ethernet-100g")
    one, eight = hardware.group_link(eth, "dp", 16, 1, 1), hardware.group_link(eth, "dp", 2, 8, 1)
    assert eight.bw == pytest.approx(one.bw / 8)  # 8 rings share the one NIC


def test_hardware_errors(tmp_path):
    with pytest.raises(SimparError, match="unknown hardware"):
        hardware.load("no-such-cluster")
    bad = tmp_path / "hw.json"
    bad.write_text('{"name": "x", "flops": 3}')
    with pytest.raises(SimparError):
        hardware.load(str(bad))
    good = tmp_path / "good.json"
    good.write_text(json.dumps(hardware.PRESETS["dgx-h100"].to_dict()))
    assert hardware.load(str(good)).intra_bw == hardware.PRESETS["dgx-h100"].intra_bw


# -- plan on the command line -----------------------------------------------------------------------------


def test_plan_one_trillion_parameters():
    out = run_plan(
        "--params",
        "1T",
        "--batch",
        "8192",
        "--dp",
        "64",
        "--tp",
        "8",
        "--pp",
        "32",
        "--microbatches",
        "64",
        "--precision",
        "mixed",
        "--optimizer",
        "adam",
        "--hardware",
        "ib-cluster",
        "--memory-limit",
        "80GB",
    )
    assert "999.57 B params" in out and "pipeline bubble (1f1b): (S-1)/(M+S-1) = 31/95" in out
    assert sum(standin_widths(10**12)[1:]) > 0


def test_plan_json_and_errors():
    pred = json.loads(
        run_plan(
            "--layers",
            "784,4096,4096,10",
            "--batch",
            "1024",
            "--dp",
            "8",
            "--tp",
            "4",
            "--pp",
            "2",
            "--hardware",
            "dgx-h100",
            "--json",
        )
    )
    assert pred["world"] == 64 and pred["time"]["step_s"] > 0
    for argv, message in (
        (["--layers", "64,100,10", "--tp", "3"], "not divisible by --tp"),
        (["--params", "lots"], "expected a number"),
        (["--compare"], "--world"),
        (["--pp", "9"], "more pipeline stages"),
        (["--precision", "fp8"], "unknown precision"),
        (["--sweep", "colour=1,2"], "KEY=V1"),
    ):
        with pytest.raises(SimparError, match=message):
            plan_main(argv)


def test_plan_compare_explains_the_winner():
    out = run_plan(
        "--params",
        "13e9",
        "--batch",
        "512",
        "--compare",
        "--world",
        "64",
        "--hardware",
        "ib-cluster",
        "--precision",
        "mixed",
        "--optimizer",
        "adam",
        "--memory-limit",
        "80GB",
    )
    assert "winner:" in out and "dp64 would need" in out and "x the memory limit" in out


def test_plan_show_schedule():
    out = run_plan("--pp", "4", "--microbatches", "6", "--schedule", "gpipe", "--show-schedule")
    assert "stage 3" in out and "3/9" in out


def test_plan_says_when_local_is_the_uncalibrated_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no calibration cache here
    note = "hardware local is the uncalibrated defaults"
    assert note in run_plan("--dp", "2")
    assert note in run_plan("--compare", "--world", "4")
    assert note in run_plan("--sweep", "dp=1,2", "-o", str(tmp_path / "sweep.png"))
    assert note not in run_plan("--dp", "2", "--hardware", "dgx-h100")
    calibrated = dict(hardware.LOCAL_DEFAULTS.to_dict(), description="measured here")
    path = tmp_path / "simpar" / "hardware-local.json"
    path.parent.mkdir()
    path.write_text(json.dumps(calibrated))
    assert note not in run_plan("--dp", "2")


@pytest.mark.parametrize("zero,accum", [(2, 1), (3, 1), (3, 2), (2, 2)])
def test_plan_names_the_zero_gradient_buffer(zero, accum):
    """ZeRO-2/3 hold their 1/p shard of every layer's gradient plus one layer's full gradient (the
    largest, 128x128+128 here) while it is reduce-scattered; ZeRO-2 with accumulation the whole P."""
    from simpar.units import fmt_si

    args = ["--dp", "4", "--zero", str(zero), "--grad-accum", str(accum), "--precision", "fp32"]
    out = run_plan(*args)
    sizes = layer_sizes(DIGITS)
    shard = sum(n // 4 + (0 < n % 4) for n in sizes) * 4  # rank 0 holds the largest chunks
    if zero == 2 and accum > 1:
        want = f"+ accumulation buffer {fmt_si(sum(sizes) * 4)}"
    else:
        want = f"+ one-layer gradient buffer {fmt_si((128 * 128 + 128) * 4)}"
    assert f"shard {fmt_si(shard)} (1/4 of every layer's) {want}" in out
    assert "gradient buffer" not in run_plan("--dp", "4", "--zero", "1")
