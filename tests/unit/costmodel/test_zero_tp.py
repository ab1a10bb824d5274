"""costmodel/zero_tp.py (--zero 2|3 with --tp on gpt) against closed forms written here, on a shape whose
units do NOT split evenly over dp 3, with nothing run; and zero_tp_time.py against gpt_time.py where
the two must agree (one dp rank: no ring runs).

Per dp rank g of p holding tp shares n_u of the units (Rajbhandari et al. 2020, sec. 5.2, 5.3, 7.2),
c(n, g) = np.array_split's g-th size, K = --grad-accum, 8 bytes an element:
    stage 2  reduce-scatter sum_u n_u - c(n_u, g); all-gather sum_u n_u - c(n_u, g+1)
    stage 3  K x that reduce-scatter, 2K x that all-gather; under --sp the tp layout's
             "sp-grad-allreduce" K times (every micro-step's buffers)
    memory   S = sum_u c(n_u, g): optimizer 2 S (Adam); params P_T (2) or S + max n_u (3);
             grads S + max n_u, or S + P_T for stage 2 with K > 1
The MPI test (tests/mpi/parallel/test_zero_tp.py) holds the real ledger to the same forms.
"""

from __future__ import annotations

import dataclasses

import pytest

from simpar.config import RunConfig
from simpar.costmodel import hardware, predict_from_config
from simpar.costmodel.gpt_time import step_seconds
from simpar.costmodel.zero_tp_time import zero_tp_seconds

SHAPE = dict(arch="gpt", dataset="copy", blocks=2, hidden=10, heads=2, seq_len=8, vocab=22, batch=12)
SHAPE |= dict(optimizer="adam", steps=1, dtype="float64")
D, T = 3, 2


def split(n: int, p: int, g: int) -> int:
    return n // p + (1 if g % p < n % p else 0)


def tp_units() -> list[int]:
    h, s, V, L = SHAPE["hidden"], SHAPE["seq_len"], SHAPE["vocab"], SHAPE["blocks"]
    return [V * h // T + s * h] + [12 * h * h // T + 7 * h // T + 6 * h] * L + [2 * h + h * V // T]


@pytest.mark.parametrize(
    "stage, K, sp, C", [(2, 1, False, 1), (2, 2, True, 1), (3, 1, False, 1), (3, 2, True, 1), (3, 1, True, 2)]
)
def test_zero2_and_3_bytes_and_memory_per_rank(stage, K, sp, C):
    """C = 2: the sharding group is dp x cp (p = D C ranks, g = d C + c: world rank g T + j still)."""
    cfg = RunConfig(**SHAPE, dp=D, cp=C, tp=T, zero=stage, grad_accum=K, sp=sp)
    p = D * C
    pred = predict_from_config(cfg, p * T)
    plain = predict_from_config(dataclasses.replace(cfg, zero=0), p * T)
    units, times = tp_units(), (K if stage == 3 else 1)
    assert any(n % p for n in units), "the shape must leave uneven chunks"
    group: dict = {}
    for r in range(p * T):
        g, j = divmod(r, T)
        by_op, base = pred["comm"]["ranks"][r]["by_op"], plain["comm"]["ranks"][r]["by_op"]
        rs = sum(n - split(n, p, g) for n in units) * times * 8
        ag = sum(n - split(n, p, g + 1) for n in units) * times * (2 if stage == 3 else 1) * 8
        assert "model/grad-allreduce" not in by_op
        assert by_op["model/grad-reduce-scatter"] == {"sent": rs, "messages": (p - 1) * len(units) * times}
        assert by_op["model/param-all-gather"]["sent"] == ag
        gathers = times * (2 if stage == 3 else 1)
        assert by_op["model/param-all-gather"]["messages"] == (p - 1) * len(units) * gathers
        if sp:  # the LayerNorms' sum over tp: once a step, or on each of stage 3's K micro-steps
            assert by_op["model/sp-grad-allreduce"]["sent"] == base["model/sp-grad-allreduce"]["sent"] * times
        group[j] = group.get(j, 0) + rs + ag
        S, P_T, n_max = sum(split(n, p, g) for n in units), sum(units), max(units)
        mem = pred["memory"]["ranks"][r]
        assert mem["params"] == (P_T if stage == 2 else S + n_max) * 8
        assert mem["grads"] == (S + (P_T if stage == 2 and K > 1 else n_max)) * 8
        assert mem["optimizer"] == 2 * S * 8
        assert mem["activations_peak"] == plain["memory"]["ranks"][r]["activations_peak"]
        # everything but the model category is the tp layout's own prediction
        assert {k: v for k, v in by_op.items() if not k.startswith("model/")} == {
            k: v for k, v in base.items() if not k.startswith("model/")
        }
    ring = 2 * (p - 1) if stage == 2 else 3 * K * (p - 1)  # over the group: the ring's totals exactly
    assert all(sent == ring * sum(units) * 8 for sent in group.values()), group


@pytest.mark.parametrize("stage, K", [(2, 2), (3, 1)])
def test_zero_tp_time_on_one_dp_rank_is_the_tp_step(stage, K):
    """p = 1: no ring runs, the optimizer sweeps every parameter: gpt_time.step_seconds' tp step (stage 3
    with K > 1 would add --sp's LayerNorm sums on the K - 1 earlier micro-steps)."""
    hw = hardware.load("local")
    cfg = RunConfig(**SHAPE, dp=1, tp=T, zero=stage, sp=True, grad_accum=K)
    plain = step_seconds(cfg, 1, tp_units(), hw, "fp64", 8)
    assert zero_tp_seconds(cfg, 1, hw)["step_s"] == pytest.approx(plain["step_s"], rel=1e-12)
    # with dp 3, stage 3's extra gathers cost time on top of stage 2's rings
    many = {z: zero_tp_seconds(dataclasses.replace(cfg, dp=3, zero=z), 3, hw)["step_s"] for z in (2, 3)}
    assert many[3] > many[2] > plain["step_s"]
