"""`gpt-step` points: published end-to-end GPT training throughput against `plan --arch gpt`.

* validation/training.csv (Narayanan et al. 2021, Table 1 and Table 2's PTD-P rows) loads,
  every row carries its source, and the printed columns agree with each other: Eq. 2 of
  the row's l and h gives its Params, TFLOP/s x GPUs its aggregate petaFLOP/s (Table 1), 300B tokens
  in steps of the published step its training days (Table 2: so Eq. 3 is the count behind the
  TFLOP/s).
* Each prediction equals the plan written again here from its formulas: Eq. 3's FLOPs over the GPUs at
  the profile's rate, stretched by the 1F1B bubble; the memory-bound elements gpt_time.py's docstring
  lists per unit, at gamma/3 a byte, stretched alike, and Adam's sweeps; 6 tp all-reduces of s h per
  layer and micro-batch (full recomputation), the pipeline's sends (1/t of s h per tp rank on its NIC,
  gathered over tp, both ways, through the bubble), what the slowest stage adds to the average one
  (the last, with the head and the loss: (m - 1) (max - mean) of the stages' work) and one dp
  all-reduce of the stage's gradients, each collective priced by validate's own collective path
  (collective_seconds, the one the nccl-tests points check), not by plan_comm.
* Every point is met within its tolerance, and `simpar validate` passes with them in the main set.
"""

from __future__ import annotations

import math

import pytest

from simpar.cli.validate import validate_main
from simpar.costmodel import hardware
from simpar.report import validation, validation_gpt
from tests.paths import ROOT

TRAINING = str(ROOT / "validation" / "training.csv")


def points():
    return validation.read_points(TRAINING)


def test_the_tables_load_with_their_sources_and_their_columns_agree():
    pts = points()
    assert len(pts) == 16 and {p["op"] for p in pts} == {"gpt-step"}
    assert len({p["id"] for p in pts}) == 16
    assert sum(bool(p["aggregate_pflops"]) for p in pts) == 10  # Table 1's rows; Table 2's print days
    for p in pts:
        assert p["source_url"].startswith("https://") and "Table" in p["how"]
        assert (p["seq"], p["vocab"], p["profile"], p["microbatch"]) == (2048, 51200, "dgx-a100", 1)
        L, h, s, V = p["layers"], p["hidden"], p["seq"], p["vocab"]
        eq2 = 12 * L * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * L * h))  # Narayanan et al., Eq. 2
        assert round(eq2 / 1e9, 1) == float(p["params_b"]), p["id"]
        if p["aggregate_pflops"]:  # the per-GPU figure is printed to 1 TFLOP/s, the aggregate to 0.1 PFLOP/s
            assert abs(float(p["aggregate_pflops"]) * 1e3 / p["gpus"] - p["value"]) <= 0.5, p["id"]
        else:  # 300B tokens, B s a step, each taking Eq. 3 / (TFLOP/s x GPUs)
            B = p["batch"]
            eq3 = 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
            days = 300e9 / (B * s) * eq3 / (p["value"] * 1e12 * p["gpus"]) / 86400
            assert days == pytest.approx(float(p["train_days_300b"]), rel=0.02), p["id"]
        assert p["gpus"] == 8 * p["nodes"] and p["gpus"] % (p["tp"] * p["pp"]) == 0


def expected_step(p, hw) -> float:
    """The plan's step, from its formulas (costmodel/gpt.py's docstring), b = 1 sequence a micro-batch."""
    L, h, s, V, B = p["layers"], p["hidden"], p["seq"], p["vocab"], p["batch"]
    t, pp, n = p["tp"], p["pp"], p["gpus"]
    dp = n // (t * pp)
    m = B // dp  # micro-batches a step: through the pipeline, or accumulated when pp = 1
    eq3 = 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    compute = eq3 / n / hw.flop_rate("mixed") * (m + pp - 1) / m
    tp_s = 0.0
    if t > 1:  # one node holds the tp group; 2 bytes an activation
        one, _ = validation.collective_seconds(hw, "all-reduce", s * h * 2, t, 1)
        # the first stage's: its blocks' f and g (twice forward: recomputation), the embedding's (twice);
        # with pp 1 the head's too, and the loss's all-gather of t s and all-reduce of 2 s float32 numbers
        calls = 6 * math.ceil(L / pp) + 2 + (1 if pp == 1 else 0)
        loss = 0.0
        if pp == 1:
            loss = validation.collective_seconds(hw, "all-gather", t * s * 4, t, 1)[0]
            loss += validation.collective_seconds(hw, "all-reduce", 2 * s * 4, t, 1)[0]
        tp_s = m * (calls * one + loss)
    # the first stage's parameters: its blocks (12h^2 + 7h sharded, 6h replicated), the vocab-parallel
    # embedding and the positions; the head too when pp = 1
    stage = math.ceil(L / pp) * (12 * h * h // t + 7 * h // t + 6 * h) + V * h // t + s * h
    stage += 2 * h + V * h // t if pp == 1 else 0
    nodes = dp if t * pp >= 8 else dp * t * pp // 8  # the dp group's nodes (tp innermost, then pp)
    dp_s, _ = validation.collective_seconds(hw, "all-reduce", stage * 2, dp, nodes)
    pp_s = 0.0
    if pp > 1:  # every row's stage fills its node (t x dp >= 8): each tp rank sends on its own NIC its
        # 1/t of the s h activations (2 bytes), the next stage gathers them over NVLink; both ways, each
        # micro-batch, through the bubble
        assert t * dp >= hw.devices_per_node and hw.nics_per_node == hw.devices_per_node
        gather, _ = validation.collective_seconds(hw, "all-gather", s * h * 2, t, 1)
        send = hw.inter_alpha + s * h // t * 2 / hw.nic_bw + gather
        pp_s = m * 2 * send * (m + pp - 1) / m
    return compute + memory_bound(p, hw, stage) + slowest_stage(p, hw) + tp_s + pp_s + dp_s


def slowest_stage(p, hw) -> float:
    """1F1B at its slowest stage's pace: (m - 1) (max w - mean w), w a stage's work per micro-batch --
    its blocks (L/p, the first L mod p stages one more) with their matmuls and passes, the first stage's
    embedding, the last's head (6 s h V / t FLOPs) and loss (memory_bound's per-unit counts)."""
    L, h, a, s, V, t, pp, n = (
        p[k] for k in ("layers", "hidden", "heads", "seq", "vocab", "tp", "pp", "gpus")
    )
    if pp == 1:
        return 0.0
    R, byte, B, over, rate = s, hw.gamma / 3, p["batch"], hw.layer_overhead, hw.flop_rate("mixed")
    m = B // (n // (t * pp))
    eq3 = 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    block_params = 12 * h * h // t + 7 * h // t + 6 * h
    block_fwd = 26 * R * h + 24 * R * h // t + 6 * R * (a // t) * s
    block_bwd = 26 * R * h + 25 * R * h // t + 4 * R * (a // t) * s + 3 * block_params
    block = (2 * block_fwd + block_bwd) * 2 * byte + 2 * over + (eq3 - 6 * B * s * h * V) / L / (B * t) / rate
    embed = (2 * 3 * R * h + 4 * R * h) * 2 * byte + 2 * over
    head = (2 * 8 * R * h + 10 * R * h + 3 * (2 * h + V * h // t)) * 2 * byte + 2 * over
    head += 6 * R * (V // t) * 4 * byte + 6 * s * h * V / t / rate  # the loss, the head's matmuls
    work = [(L // pp + (1 if i < L % pp else 0)) * block for i in range(pp)]
    work[0] += embed
    work[-1] += head
    return (m - 1) * (max(work) - sum(work) / pp)


def memory_bound(p, hw, stage: int) -> float:
    """Memory passes per step on one GPU, from gpt_time.py's docstring counts (elements of 2 bytes, R = s
    rows a micro-batch, this tp rank's h/t and a/t), at gamma/3 seconds a byte, plus one call a unit's
    forward: the embedding 3Rh forward, 4Rh backward; a block 26Rh + 24Rh/t + 6R(a/t)s forward,
    26Rh + 25Rh/t + 4R(a/t)s + 3 per parameter backward; the head 8Rh forward, 10Rh + 3 per parameter
    backward; the loss 6R V/t float32 logits; the forward twice (full recomputation). Per micro-batch over
    all units, / pp for the average stage, x the micro-batches and 1F1B's bubble; Adam once: 32 sweeps
    of 4-byte masters + 14 bytes of casts per parameter of the stage."""
    L, h, a, s, V, t, pp, n = (
        p[k] for k in ("layers", "hidden", "heads", "seq", "vocab", "tp", "pp", "gpus")
    )
    R, byte = s, hw.gamma / 3
    m = p["batch"] // (n // (t * pp))
    block = 12 * h * h // t + 7 * h // t + 6 * h
    forward = 3 * R * h + L * (26 * R * h + 24 * R * h // t + 6 * R * (a // t) * s) + 8 * R * h
    backward = 4 * R * h + L * (26 * R * h + 25 * R * h // t + 4 * R * (a // t) * s + 3 * block)
    backward += 10 * R * h + 3 * (2 * h + V * h // t)
    micro = (
        (2 * forward + backward) * 2 * byte + 6 * R * (V // t) * 4 * byte + 2 * (L + 2) * hw.layer_overhead
    )
    return micro / pp * m * (m + pp - 1) / m + (32 * 4 + 14) * stage * byte


@pytest.mark.parametrize("i", range(16))
def test_each_prediction_is_the_plan_written_again(i):
    hw = hardware.load("dgx-a100")
    p = points()[i]
    step = expected_step(p, hw)
    L, h, s, V, B = p["layers"], p["hidden"], p["seq"], p["vocab"], p["batch"]
    eq3 = 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    predicted, _ = validation.predict(p, hw)
    assert predicted == pytest.approx(eq3 / (step * p["gpus"]) / 1e12, rel=1e-9)
    assert validation.predict({**p, "quantity": "time", "unit": "s"}, hw)[0] == pytest.approx(step, rel=1e-9)


def test_every_point_is_met_and_the_main_set_passes(capsys):
    rows = validation.evaluate(points())
    assert all(r["ok"] for r in rows)
    assert validate_main(["--data", TRAINING]) == 0
    assert validate_main([]) == 0
    assert TRAINING in validation.default_files()
    shipped = validation.evaluate([q for f in validation.default_files() for q in validation.read_points(f)])
    assert validation.summary(shipped)["median_abs_error"] <= 0.10
    capsys.readouterr()


def test_a_layout_that_does_not_divide_is_refused():
    p = points()[0]
    with pytest.raises(validation.SimparError, match="multiple of tp x pp"):
        validation_gpt.layout({**p, "gpus": 30, "tp": 4})
    with pytest.raises(validation.SimparError, match="multiple of dp x microbatch"):
        validation_gpt.layout({**p, "batch": 500})
    with pytest.raises(validation.SimparError, match="needs layers"):
        validation.predict({**p, "layers": 0}, hardware.load("dgx-a100"))
