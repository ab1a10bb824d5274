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
    with pytest.raises(SimparError, match="--zero with --pp"):  # train's own rules reach the plan
        ask("--experts", "4", "--dp", "2", "--zero", "1", "--pp", "2")
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


@pytest.mark.parametrize("C, T", [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_zero_shards_the_states_as_the_zero_paper_counts_them(C, T):
    """--zero 0-3 (with --cp C and --tp T too), mixed precision Adam: 2 + 2 + 12 bytes per parameter
    (Rajbhandari et al. 2020, sec. 3.1), the dense parameters M sharded over the D C ranks of dp x cp,
    the rank's experts X over the D/P C ranks of edp x cp (every unit divides evenly here, so the shard
    is M/(D C) + X/(D/P C)); under --tp the dense part is the rank's tp share (attention's and the
    vocabulary's columns split T ways), sharded the same way; a sharded stage keeps one unit whole
    besides (U: the largest block, gathered or reduced one at a time). Memory per rank falls stage by
    stage; activations and all-to-alls do not change."""
    L, h, s, V, E, P, D = 2, 16, 8, 16, 4, 2, 4
    # dense, per tp rank: embedding, blocks (Wq Wk Wv Wo and their biases split T ways), head
    units = [V * h // T + s * h] + [4 * h * h // T + 3 * h // T + 5 * h + h * E] * L + [2 * h + h * V // T]
    M, X = sum(units), L * E // P * (8 * h * h + 5 * h)  # X: this rank's E/P experts of every block
    U = max(units) + E // P * (8 * h * h + 5 * h)  # a block whole: its dense part and its experts
    Nd, Ne = D * C, D // P * C
    assert all(n % Nd == 0 for n in units) and (X // L) % Ne == 0  # chunks without rounding
    S = M // Nd + X // Ne  # this rank's shard
    want = {  # (params, grads, optimizer) in bytes, stage by stage
        0: (2 * (M + X), 2 * (M + X), 12 * (M + X)),
        1: (2 * (M + X), 2 * (M + X), 12 * S),
        2: (2 * (M + X), 2 * (S + U), 12 * S),
        3: (2 * (S + U), 2 * (S + U), 12 * S),
    }
    # gradient traffic per rank: ring all-reduce 2 (N-1)/N n; ZeRO 1-2 its reduce-scatter and all-gather
    # halves, the same bytes; ZeRO-3 one reduce-scatter and two all-gathers: 3 (N-1)/N n (2-byte halves)
    ring = 2 * ((Nd - 1) * M // Nd + (Ne - 1) * X // Ne)
    traffic = {0: 2 * ring, 1: 2 * ring, 2: 2 * ring, 3: 3 * ring}
    totals, first = [], None
    for zero in range(4):
        args = ["--experts", str(E), "--ep", str(P), "--dp", str(D), "--cp", str(C), "--tp", str(T)]
        args += ["--zero", str(zero)]
        cfg = ask(*args, "--batch", "8", "--precision", "mixed", "--optimizer", "adam")
        p = plan_gpt_moe(cfg, hardware.load("dgx-h100"))
        mem = p["memory"]["max"]
        assert (mem["params"], mem["grads"], mem["optimizer"]) == want[zero]
        assert p["model_per_rank_per_step"] == traffic[zero]
        ops = set(p["model_by_op_per_rank_per_step"])
        assert ops == (
            {"grad-allreduce", "expert-grad-allreduce"}
            if zero == 0
            else {
                "grad-reduce-scatter",
                "param-all-gather",
                "expert-grad-reduce-scatter",
                "expert-param-all-gather",
            }
        )
        assert p["zero_groups"] == ({"non_expert": Nd, "experts": Ne} if zero else {})
        first = first or p
        assert mem["activations_peak"] == first["memory"]["max"]["activations_peak"]
        assert p["alltoall_per_rank_per_step"] == first["alltoall_per_rank_per_step"]
        totals.append(sum(want[zero]) + mem["activations_peak"])
    assert totals == sorted(totals, reverse=True) and len(set(totals)) == 4  # each stage saves more


def test_zero_where_the_run_refuses_it_plan_refuses_it():
    """expert_zero.py (expert_zero_tp.py with --tp) shards no pipeline stage: --zero with --pp is
    refused in train's line, as a simulated run would be."""
    with pytest.raises(SimparError, match="not yet with --zero with --pp"):
        ask("--experts", "4", "--ep", "2", "--dp", "2", "--pp", "2", "--zero", "1")


def test_the_printed_zero_plan_names_its_shards(capsys):
    args = ["--experts", "4", "--ep", "2", "--dp", "4", "--zero", "3", "--hardware", "dgx-h100"]
    assert plan_main([*SMALL, *args]) == 0
    out = capsys.readouterr().out
    assert "ranks on dgx-h100, ZeRO-3;" in out
    assert "(ZeRO-3: optimizer state, grads, params sharded over the 4 dp ranks)" in out
    assert "the experts' over their 2 edp ranks" in out and "replicated" not in out
    assert "param-all-gather" in out and "expert-grad-reduce-scatter" in out
