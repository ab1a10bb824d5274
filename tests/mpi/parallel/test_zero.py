"""ZeRO-1/2/3 against the serial model, the ledger against the ZeRO paper's volumes (Rajbhandari et
al. 2020, sec. 7), and the measured memory against the shard sizes (sec. 5).

Every run is a real `mpiexec` job; results are cached (per module, the serial references per session
in tests/conftest.py) so each layout runs once and all its checks (losses, weights, bytes, memory)
read the same metrics. The default digits model
(64,128,128,128,10; P = 42,634) does not divide by 3 or 4, nor do its layers: uneven chunks.
"""

from __future__ import annotations

import pytest

from tests.conftest import assert_same_model, layer_sizes, split_sizes, train_json

LAYERS = [64, 128, 128, 128, 10]
SIZES = layer_sizes(LAYERS)  # n_l, flat (W, b) per layer
P = sum(SIZES)
STEPS = 4
BASE = ["--steps", str(STEPS), "--batch", "64"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """run(n, *args) -> metrics; each distinct (n, args) trains once per module."""
    cache: dict = {}

    def run(n: int, *args: str) -> dict:
        key = (n, args)
        if key not in cache:
            cache[key] = train_json(n, [*BASE, *args], tmp_path_factory.mktemp("zero"), timeout=120)
        return cache[key]

    return run


def chunk(n: int, p: int, r: int) -> int:
    """Rank r's chunk of n elements: np.array_split's rule, written out (tests/conftest.py)."""
    return split_sizes(n, p)[r]


def shard(p: int, r: int) -> int:
    """S: elements rank r owns in stages 2/3 (its chunk of every layer)."""
    return sum(chunk(n, p, r) for n in SIZES)


def expected_sent(stage: int, p: int, r: int, accum: int = 1) -> int:
    """Exact model elements rank r sends per step. Ring reduce-scatter: everything but chunk r;
    ring all-gather: everything but chunk r+1 (mod p)."""
    nxt = (r + 1) % p
    if stage == 1:
        return (P - chunk(P, p, r)) + (P - chunk(P, p, nxt))
    rs = sum(n - chunk(n, p, r) for n in SIZES)
    ag = sum(n - chunk(n, p, nxt) for n in SIZES)
    return rs + ag if stage == 2 else accum * (rs + 2 * ag)


def expected_memory(stage: int, p: int, r: int, bpe: int, k_opt: int, accum: int = 1) -> dict:
    """Stage 3's params: the shard S plus the largest layer, gathered in full while it computes
    (one layer at a time); its grads: S plus that layer's gradient buffer while it is reduce-scattered."""
    S, n_max = shard(p, r), max(SIZES)
    if stage == 1:
        return {"params": P * bpe, "grads": P * bpe, "optimizer": k_opt * chunk(P, p, r) * bpe}
    grads = S + (P if stage == 2 and accum > 1 else n_max)
    params = P if stage == 2 else S + n_max
    return {"params": params * bpe, "grads": grads * bpe, "optimizer": k_opt * S * bpe}


def check_ledger(m: dict, stage: int, p: int, bpe: int, accum: int = 1) -> None:
    ranks = m["comm"]["ranks"]
    factor = 2 if stage < 3 else 3 * accum
    # All ranks together: exactly factor * (p-1) * P elements per step.
    assert m["comm"]["total_sent"]["model"] == STEPS * factor * (p - 1) * P * bpe
    assert sum(r["received"]["model"] for r in ranks) == m["comm"]["total_sent"]["model"]
    for r in ranks:
        rank = r["rank"]
        assert r["sent"]["data"] == 0 and r["sent"]["activation"] == 0
        assert r["sent"]["model"] == STEPS * expected_sent(stage, p, rank, accum) * bpe
        # ... and each rank within a few elements (one per layer per collective) of the formula.
        per_step = r["sent"]["model"] / STEPS / bpe
        slack = factor * (1 if stage == 1 else len(SIZES))
        assert abs(per_step - factor * (p - 1) / p * P) <= slack
        ops = {k for k in r["by_op"] if k.startswith("model/")}
        assert ops == {"model/grad-reduce-scatter", "model/param-all-gather"}


def check_memory(m: dict, stage: int, p: int, bpe: int, k_opt: int, accum: int = 1) -> None:
    for rank, mem in enumerate(m["memory"]["ranks"]):
        want = expected_memory(stage, p, rank, bpe, k_opt, accum)
        assert {k: mem[k] for k in want} == want, f"rank {rank}"
        assert mem["activations_peak"] > 0


MATRIX = [(dp, stage) for dp in (2, 3, 4) for stage in (1, 2, 3)]


@pytest.mark.parametrize("dp,stage", MATRIX)
def test_sgd_float64_matches_serial(runs, serial, dp, stage):
    ref = serial([*BASE, "--dtype", "float64"])
    m = runs(dp, "--dtype", "float64", "--zero", str(stage))
    assert m["mesh"]["dp"] == dp
    assert_same_model(m, ref, 1e-12)
    check_ledger(m, stage, dp, 8)
    check_memory(m, stage, dp, 8, k_opt=1)


@pytest.mark.parametrize("dp,stage", [(2, 3), (3, 1), (4, 2)])
def test_adam_float64_matches_serial(runs, serial, dp, stage):
    ref = serial([*BASE, "--dtype", "float64", "--optimizer", "adam", "--lr", "0.005"])
    m = runs(dp, "--dtype", "float64", "--optimizer", "adam", "--lr", "0.005", "--zero", str(stage))
    assert_same_model(m, ref, 1e-12)
    check_memory(m, stage, dp, 8, k_opt=2)  # Adam: two moments per owned element


def test_float32_matches_serial(runs, serial):
    ref = serial([*BASE, "--dtype", "float32"])
    m = runs(4, "--dtype", "float32", "--zero", "3")
    assert_same_model(m, ref, 1e-5)
    check_ledger(m, 3, 4, 4)
    check_memory(m, 3, 4, 4, k_opt=1)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_grad_accumulation(runs, serial, stage):
    """Stages 1/2 reduce-scatter once per step (stage 2 pays a full accumulation buffer for it);
    stage 3 gathers and reduce-scatters on every micro-step: 3K(p-1)/p * P."""
    ref = serial([*BASE, "--dtype", "float64", "--grad-accum", "2"])
    m = runs(3, "--dtype", "float64", "--grad-accum", "2", "--zero", str(stage))
    assert_same_model(m, ref, 1e-12)
    check_ledger(m, stage, 3, 8, accum=2)
    check_memory(m, stage, 3, 8, k_opt=1, accum=2)


def test_memory_shrinks_with_p(runs):
    """ZeRO's point (sec. 5): what a stage shards falls like 1/p; what it keeps does not. Stage 3's
    params also hold the one layer gathered at a time: on this small model the largest layer is 39%
    of P, so the shard falls like 1/p but shard + layer stays above P/3 -- the saving grows with the
    number of layers."""
    for stage, sharded in (
        (1, ["optimizer"]),
        (2, ["optimizer", "grads"]),
        (3, ["optimizer", "params", "grads"]),
    ):
        mx = [runs(dp, "--dtype", "float64", "--zero", str(stage))["memory"]["max"] for dp in (2, 3, 4)]
        for key in sharded:
            assert mx[0][key] > mx[1][key] > mx[2][key], (stage, key)
        assert mx[2]["optimizer"] <= (P // 4 + len(SIZES)) * 8
    full = P * 8
    assert runs(4, "--dtype", "float64", "--zero", "1")["memory"]["max"]["params"] == full
    zero3 = runs(4, "--dtype", "float64", "--zero", "3")["memory"]["max"]["params"]
    assert zero3 == max(shard(4, r) + max(SIZES) for r in range(4)) * 8 < full
