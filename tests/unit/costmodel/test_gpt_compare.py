"""`plan --arch gpt --compare --world N`: every dp x cp x tp x pp split, ranked (costmodel/gpt_compare.py).

The splits kept are those the rules written HERE allow: tp divides the heads, pp <= the blocks, cp cuts
the sequence into 2 cp equal chunks (Ulysses: and divides a tp rank's a/tp heads), the batch splits into
whole sequences over dp x micro-batches. At 131k tokens GPT-3 175B does not fit 80 GB without cp (its
activations of one sequence per micro-batch, Korthikanti's per-layer bytes, are 657 GB on the first
stage of tp 8, pp 16, docs/context.md), so the fastest split that fits must use cp.
"""

from __future__ import annotations

import io
from contextlib import redirect_stdout

import pytest

from simpar.cli.plan import plan_main
from simpar.config import SimparError
from simpar.costmodel import gpt as cg
from simpar.costmodel import hardware
from simpar.costmodel.gpt_compare import gpt_factorizations, rank_gpt_layouts

Q = dict(sp=True, zero=0, microbatches=4, recompute="selective", precision="mixed", optimizer="adam")
Q |= dict(grad_accum=1, cp_algo="ring")


def expected_splits(world: int, shape, batch: int, q: dict) -> set:
    out = set()
    for dp in range(1, world + 1):
        for cp in range(1, world + 1):
            for tp in range(1, world + 1):
                if world % (dp * cp * tp):
                    continue
                pp = world // (dp * cp * tp)
                M = q["microbatches"] if pp > 1 else 1
                ok = shape.heads % tp == 0 and pp <= shape.layers and batch % (dp * M) == 0
                ok = ok and (cp == 1 or shape.seq % (2 * cp) == 0)
                ok = ok and (q["cp_algo"] != "ulysses" or (shape.heads // tp) % cp == 0)
                if ok:
                    out.add((dp, cp, tp, pp))
    return out


def test_factorizations_are_every_ordered_split():
    assert len(gpt_factorizations(8)) == 20  # 2^3 into 4 ordered factors: C(3 + 3, 3)
    assert all(dp * cp * tp * pp == 12 for dp, cp, tp, pp in gpt_factorizations(12))


@pytest.mark.parametrize("algo", ["ring", "ulysses"])
def test_the_splits_kept_are_the_ones_the_rules_allow(algo):
    shape = cg.Shape(layers=4, hidden=64, heads=4, seq=24, vocab=100, source="test")
    q = dict(Q, cp_algo=algo)
    ranked, invalid = rank_gpt_layouts(shape, 8, hardware.load("dgx-h100"), 16, None, q)
    got = {tuple(p["layout"][k] for k in ("dp", "cp", "tp", "pp")) for p in ranked}
    assert got == expected_splits(16, shape, 8, q)
    assert invalid == len(gpt_factorizations(16)) - len(got)
    steps = [p["time"]["step_s"] for p in ranked]
    assert steps == sorted(steps)  # no limit: by step time


def test_a_131k_token_run_needs_cp_to_fit():
    shape = cg.PRESETS["gpt3-175b"]
    shape = cg.Shape(**dict(shape.__dict__, seq=131072))
    hw = hardware.load("dgx-h100")
    q = dict(Q, microbatches=16)
    ranked, _ = rank_gpt_layouts(shape, 16, hw, 2048, hw.memory_bytes, q)
    fitting = [p for p in ranked if p["memory_per_gpu"]["total"] <= hw.memory_bytes]
    assert fitting and ranked[0] is fitting[0]
    assert all(p["layout"]["cp"] > 1 for p in fitting)  # nothing without cp fits 80 GB
    assert any(p["layout"]["cp"] == 1 for p in ranked)  # though such splits were planned


def test_the_command_prints_the_ranking_and_refuses_a_missing_world():
    argv = ["--arch", "gpt", "--model", "gpt3-175b", "--seq-len", "131072", "--batch", "16"]
    argv += ["--microbatches", "16", "--sp", "--recompute", "selective", "--hardware", "dgx-h100"]
    out = io.StringIO()
    with redirect_stdout(out):
        assert plan_main([*argv, "--compare", "--world", "2048"]) == 0
    text = out.getvalue()
    assert "splits of 2048 GPUs into dp x cp x tp x pp" in text and "fastest that fits: " in text
    assert text.splitlines()[-1].split(",")[0].split()[-1].count("cp") == 1  # the winner uses cp
    with pytest.raises(SimparError, match="--compare needs --world N"):
        plan_main([*argv, "--compare"])
