"""costmodel/zero_mesh.py (--zero 1 with --tp / --pp / --cp on gpt) against closed forms written here, on
shapes whose shards do NOT split evenly over the sharding group (so a chunk's rounding shows), with
nothing run: the layout's own prediction with its gradient all-reduce replaced by ZeRO-1's halves.

Per rank g of a sharding group of p ranks holding a store of n elements (Rajbhandari et al. 2020,
sec. 7.2.1), c(n, g) = np.array_split's g-th size:
    reduce-scatter n - c(n, g), all-gather n - c(n, g+1): over the group 2(p-1) n exactly, 2(p-1)/p n each
    optimizer state: c(n, g) of the layout's n -- summed over the group, the layout's without ZeRO
The MPI test (tests/mpi/parallel/test_zero_mesh.py) holds the real ledger to the same forms.
"""

from __future__ import annotations

import dataclasses

import pytest

from simpar.config import RunConfig
from simpar.costmodel import predict_from_config

SHAPE = dict(arch="gpt", dataset="copy", blocks=3, hidden=16, heads=4, seq_len=8, vocab=22, batch=12)
SHAPE |= dict(optimizer="adam", steps=1, dtype="float64")  # Adam: two moments per parameter, 8 bytes each


def split(n: int, p: int, g: int) -> int:
    return n // p + (1 if g % p < n % p else 0)


def tp_units(T: int) -> list[int]:
    h, s, V, L = SHAPE["hidden"], SHAPE["seq_len"], SHAPE["vocab"], SHAPE["blocks"]
    return [V * h // T + s * h] + [12 * h * h // T + 7 * h // T + 6 * h] * L + [2 * h + h * V // T]


# (pp, dp, cp, tp), extra config, the unit ranges of each stage's chunks
INTERLEAVED = dict(schedule="interleaved", virtual_stages=2, microbatches=2, stage_layers=[1, 2, 1, 1])
CASES = {
    "dp3xtp2": ((1, 3, 1, 2), {}, [[(0, 5)]]),
    "dp3xpp2-interleaved": ((2, 3, 1, 1), INTERLEAVED, [[(0, 1), (3, 4)], [(1, 3), (4, 5)]]),
    "dp3xcp2xtp2xpp2": ((2, 3, 2, 2), dict(stage_layers=[3, 2]), [[(0, 3)], [(3, 5)]]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_zero1_bytes_and_optimizer_state_per_rank(name):
    (S, D, C, T), extra, chunks = CASES[name]
    world, p, local = S * D * C * T, D * C, tp_units(T)
    cfg = RunConfig(**SHAPE, pp=S, dp=D, cp=C, tp=T, zero=1, **extra)
    pred = predict_from_config(cfg, world)
    plain = predict_from_config(dataclasses.replace(cfg, zero=0), world)
    opt_sum: dict = {}
    assert any(sum(local[lo:hi]) % p for ch in chunks for lo, hi in ch), "the shape must leave uneven chunks"
    for r in range(world):
        st, d, c = r // (D * C * T), (r // (C * T)) % D, (r // T) % C
        g, stores = d * C + c, [sum(local[lo:hi]) for lo, hi in chunks[st]]
        by_op = pred["comm"]["ranks"][r]["by_op"]
        assert "model/grad-allreduce" not in by_op
        assert by_op["model/grad-reduce-scatter"]["sent"] == sum(n - split(n, p, g) for n in stores) * 8
        assert by_op["model/param-all-gather"]["sent"] == sum(n - split(n, p, g + 1) for n in stores) * 8
        assert by_op["model/grad-reduce-scatter"]["messages"] == (p - 1) * len(stores)
        mem, base = pred["memory"]["ranks"][r], plain["memory"]["ranks"][r]
        assert mem["params"] == base["params"] == sum(stores) * 8
        assert mem["grads"] == base["grads"] and mem["activations_peak"] == base["activations_peak"]
        assert mem["optimizer"] == 2 * sum(split(n, p, g) for n in stores) * 8
        key = (st, r % T)
        opt_sum[key] = opt_sum.get(key, 0) + mem["optimizer"]
        # everything but ZeRO's two ops is the layout's own prediction
        assert {k: v for k, v in by_op.items() if not k.startswith("model/")} == {
            k: v for k, v in plain["comm"]["ranks"][r]["by_op"].items() if not k.startswith("model/")
        }
    for (st, j), total in opt_sum.items():  # the group's optimizer state = the layout's on one rank
        r = st * D * C * T + j
        assert total == plain["memory"]["ranks"][r]["optimizer"]


def test_zero1_group_total_is_two_p_minus_one_shards():
    """Summed over a dp group, ZeRO-1 moves exactly what the ring all-reduce of the shard moves."""
    cfg = RunConfig(**SHAPE, dp=3, tp=2, zero=1)
    pred = predict_from_config(cfg, 6)
    P_shard = sum(tp_units(2))
    for j in range(2):
        sent = sum(pred["comm"]["ranks"][d * 2 + j]["sent"]["model"] for d in range(3))
        assert sent == 2 * (3 - 1) * P_shard * 8
