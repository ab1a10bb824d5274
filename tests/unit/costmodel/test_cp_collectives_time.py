"""costmodel/cp_time.py prices the dp x cp gradient all-reduce by --collectives, as gpt_time.py prices
--dp's: ring and auto as NCCL runs them, the others alpha-beta (Thakur et al. 2005). No MPI.

Under --no-overlap the buckets run one after another once backward ends, so two algorithms' steps
differ by their all-reduces alone. One bucket of N = P elements over p = dp C ranks, bpe bytes, on
the dpcp group's link (latency alpha, beta seconds a byte; gamma 0 on a GPU, the sum inside the copy):
    tree          2 ceil(log2 p) rounds, 2 ceil(log2 p) N bpe on its critical path
    rabenseifner  2 log2 p rounds,       2 (p-1)/p N bpe
    ps            2 rounds,              2 (p-1) N bpe (everything through the server)
so for p = 2: tree - rabenseifner = N bpe beta and ps = tree; for p = 4: tree - rabenseifner
= (4 - 3/2) N bpe beta, ps - tree = (6 - 4) N bpe beta - 2 alpha.
"""

from __future__ import annotations

import pytest

from simpar.cli import build_parser
from simpar.cli.options import config_from_args
from simpar.costmodel import hardware
from simpar.costmodel.cp_time import cp_step_seconds
from simpar.costmodel.gpt import unit_sizes
from simpar.costmodel.hardware import group_link

L, H, A, S, V, BPE = 2, 16, 4, 8, 16, 8
P = (V + S) * H + L * (12 * H * H + 13 * H) + 2 * H + H * V
HW = hardware.load("dgx-h100")


def step(algo: str, dp: int) -> float:
    args = f"train --arch gpt --dataset copy --n-layers {L} --hidden {H} --heads {A} --seq-len {S} "
    args += f"--vocab {V} --batch 8 --cp 2 --dp {dp} --collectives {algo} --no-overlap --dtype float64"
    cfg = config_from_args(build_parser().parse_args(args.split()))
    return cp_step_seconds(cfg, dp, unit_sizes(L, H, S, V), HW, "fp64", BPE)["step_s"]


def test_two_ranks_tree_sends_twice_rabenseifners_bytes_and_ps_is_the_tree():
    beta = 1 / group_link(HW, "dp", 2, 1, 1).bw
    assert step("tree", 1) - step("rabenseifner", 1) == pytest.approx(P * BPE * beta, rel=1e-9)
    assert step("ps", 1) == pytest.approx(step("tree", 1), rel=1e-15)


def test_four_ranks_price_each_algorithms_critical_path():
    link = group_link(HW, "dp", 4, 1, 1)
    tree, rab, ps = (step(a, 2) for a in ("tree", "rabenseifner", "ps"))
    assert tree - rab == pytest.approx(2.5 * P * BPE / link.bw, rel=1e-9)
    assert ps - tree == pytest.approx(2 * P * BPE / link.bw - 2 * link.alpha, rel=1e-9)


def test_the_ring_is_priced_as_nccl_runs_it_not_alpha_beta():
    """On two ranks the ring and Rabenseifner both take 2 rounds of N/2 elements each way: alpha-beta
    prices them the same; NCCL's protocols (chunktime.op_time) price the ring apart."""
    assert step("ring", 1) != pytest.approx(step("rabenseifner", 1), rel=1e-6)
