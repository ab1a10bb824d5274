"""`plan --arch gpt --experts E --ep P --dp D` (report/plan_gpt_moe.py) against closed forms written here:
memory per rank (the non-expert parameters replicated, E/P experts per block), FLOPs (top-K experts
per token plus the router), all-to-all bytes for a balanced router, and the refusals."""

from __future__ import annotations

import pytest

from simpar.cli.plan import build_parser, plan_main
from simpar.config import SimparError
from simpar.costmodel import gpt as cg
from simpar.costmodel import hardware
from simpar.report.plan_gpt import shape_from_args
from simpar.report.plan_gpt_moe import moe_config, plan_gpt_moe

SMALL = [
    "--arch",
    "gpt",
    "--n-layers",
    "2",
    "--hidden",
    "16",
    "--heads",
    "4",
    "--seq-len",
    "8",
    "--vocab",
    "16",
]


def ask(*extra):
    a = build_parser().parse_args([*SMALL, *extra])
    return moe_config(a, shape_from_args(a))


@pytest.mark.parametrize("P, D, precision, bpe", [(2, 4, "fp32", 4), (4, 4, "mixed", 2), (1, 2, "fp32", 4)])
def test_memory_flops_and_alltoall_bytes(P, D, precision, bpe):
    L, h, s, V, E, K, B = 2, 16, 8, 16, 4, 2, 8
    cfg = ask("--experts", "4", "--ep", str(P), "--dp", str(D), "--batch", "8", "--precision", precision)
    p = plan_gpt_moe(cfg, hardware.load("dgx-h100"))
    M = (V + s) * h + L * (4 * h * h + 8 * h + h * E) + 2 * h + h * V  # embedding, blocks' dense part, head
    mine = L * E // P * (8 * h * h + 5 * h)
    assert p["params_per_rank"] == {"non_expert": M, "experts": mine}
    assert p["memory"]["max"]["params"] == (M + mine) * bpe
    assert p["params_total"] == M + L * E * (8 * h * h + 5 * h)
    dense = cg.flops_per_step(B, s, L, h, V)  # the MLP once per token; K - 1 more, and the router
    assert p["flops_per_step"] == dense + (K - 1) * 48 * B * s * L * h * h + 6 * B * s * L * h * E
    n = B * s // D  # tokens per rank; balanced: (P - 1) / P of its n K assignments leave, 4 times a block
    assert p["alltoall_per_rank_per_step"] == pytest.approx(4 * L * (P - 1) / P * n * K * h * bpe)
    causal = cg.model_flops_per_step(B, s, L, h, V) + (K - 1) * 48 * B * s * L * h * h + 6 * B * s * L * h * E
    assert p["model_flops_per_step"] == causal  # MFU's numerator: the scores' causal half, as plan --arch gpt
    world = D * hardware.load("dgx-h100").peak_rate("mixed" if precision == "mixed" else "fp32")
    assert p["mfu"] == pytest.approx(causal / (p["time"]["step_s"] * world), rel=1e-12)


def test_what_it_does_not_plan_is_one_line():
    with pytest.raises(SimparError, match="--clock sim with --sp and --cp"):  # --sp reaches the rules
        ask("--experts", "4", "--tp", "2", "--sp", "--cp", "2")
    with pytest.raises(SimparError, match="--clock sim with --collectives tree"):
        ask("--experts", "4", "--collectives", "tree")
    with pytest.raises(SimparError, match="--tp 3"):  # train's own rules: whole heads per tp rank
        ask("--experts", "4", "--tp", "3")
    with pytest.raises(SimparError, match="--ep 3 must divide --dp 4"):
        ask("--experts", "6", "--ep", "3", "--dp", "4")
    with pytest.raises(SimparError, match="--compare and --sweep"):
        plan_main([*SMALL, "--experts", "4", "--compare", "--world", "4"])


def test_pp_plans_the_fullest_stage():
    """--pp 2 over 4 blocks: each stage holds part of the units; the plan names the fuller one's."""
    cfg = ask(
        "--experts", "4", "--ep", "2", "--dp", "2", "--pp", "2", "--n-layers", "4", "--microbatches", "4"
    )
    p = plan_gpt_moe(cfg, hardware.load("dgx-h100"))
    h, s, V, E, P = 16, 8, 16, 4, 2
    dense = [(V + s) * h] + [4 * h * h + 8 * h + h * E] * 4 + [2 * h + h * V]
    experts = [0] + [E // P * (8 * h * h + 5 * h)] * 4 + [0]
    stages = [range(0, 3), range(3, 6)]  # balanced by the full units' sizes: embedding + 2 blocks, 2 + head
    fullest = max(stages, key=lambda r: sum(dense[u] + experts[u] for u in r))
    assert p["params_per_rank"] == {
        "non_expert": sum(dense[u] for u in fullest),
        "experts": sum(experts[u] for u in fullest),
    }
    assert p["world"] == 4 and p["time"]["step_s"] > 0  # dp 2 (ep inside it) x pp 2


@pytest.mark.parametrize("axis", ["--tp", "--cp"])
def test_tp_and_cp_split_the_dense_part_or_the_tokens(axis):
    """--tp 2: the attention's and vocabulary's shards per rank (the experts whole); --cp 2: half the
    tokens per rank, so half the all-to-all bytes; the same FLOPs either way."""
    base = plan_gpt_moe(ask("--experts", "4", "--ep", "2", "--dp", "2"), hardware.load("dgx-h100"))
    p = plan_gpt_moe(ask("--experts", "4", "--ep", "2", "--dp", "2", axis, "2"), hardware.load("dgx-h100"))
    assert p["world"] == 4 and p["flops_per_step"] == base["flops_per_step"]
    assert p["params_per_rank"]["experts"] == base["params_per_rank"]["experts"]
    L, h, s, V, E = 2, 16, 8, 16, 4
    if axis == "--tp":  # Wq Wk Wv Wo and their biases h/2 wide, the vocabulary's V/2 rows
        block = 4 * h * h // 2 + 3 * h // 2 + 5 * h + h * E
        assert p["params_per_rank"]["non_expert"] == V * h // 2 + s * h + L * block + 2 * h + h * V // 2
        assert p["alltoall_per_rank_per_step"] == base["alltoall_per_rank_per_step"]
    else:
        assert p["params_per_rank"] == base["params_per_rank"]
        assert p["alltoall_per_rank_per_step"] == pytest.approx(base["alltoall_per_rank_per_step"] / 2)
    assert 0 < p["time"]["step_s"]


def test_the_printed_plan_says_balanced(capsys):
    assert plan_main([*SMALL, "--experts", "4", "--ep", "2", "--dp", "2", "--hardware", "dgx-h100"]) == 0
    out = capsys.readouterr().out
    assert "balanced router" in out and "all-to-all per rank per step" in out and "MFU" in out
