"""costmodel/moe_tp_rounds.py: the ops it follows a tp group through are the collectives
gpt_time.tp_collectives and MoEWork.tp_block price (with and without --sp), and where the algorithm is
asymmetric the group's ranks leave apart. (predict == simulate on real runs:
tests/mpi/runtime/test_moe_simclock.py, its gpipe (ps) and zb-v (tree) pipelines.)"""

from __future__ import annotations

import pytest

from simpar.config import RunConfig
from simpar.costmodel import hardware
from simpar.costmodel.gpt_moe_time import MoEWork
from simpar.costmodel.moe_tp_rounds import own_seconds, sp_sums, tp_sync

WHICH = ["embed-forward", "head-forward", "head-forward-loss", "embed-backward", "head-backward", "block"]


def work_of(collectives: str, sp: bool, tp: int = 2) -> MoEWork:
    cfg = RunConfig(arch="gpt", dataset="copy", blocks=2, hidden=16, heads=4, seq_len=8, vocab=16, batch=8)
    cfg.experts, cfg.tp, cfg.sp, cfg.collectives = 4, tp, sp, collectives
    return MoEWork(cfg, 1, hardware.load("local"), 4, tp)


@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("which", WHICH)
def test_a_symmetric_group_followed_ends_at_each_ranks_own_price(which, sp):
    """Rabenseifner over tp 2 is symmetric: followed from equal starts, each rank ends at its own
    price -- the ops followed are the collectives gpt_time.tp_collectives prices, in the same sizes."""
    work = work_of("rabenseifner", sp)
    ms = work.micro_step(8, [])
    now = [1e-3] * 2
    tp_sync(work, now, ms, which)
    assert now == pytest.approx([1e-3 + own_seconds(ms, w, which) for w in range(2)], rel=1e-12)


def test_the_parameter_server_ends_alpha_ahead_of_its_worker():
    """ps over tp 2: the worker gets the sum alpha after the server sent its last byte, so the server
    is alpha ahead (its own price, the critical path, is the worker's: added, both would end there);
    the next all-reduce starts from there, and ends on the worker's chain again."""
    work = work_of("ps", False)
    ms, alpha = work.micro_step(8, []), work.lay.links["tp"].alpha
    own = own_seconds(ms, 1, "block")
    now = [0.0, 0.0]
    for k in (1, 2):
        tp_sync(work, now, ms, "block")
        assert now == pytest.approx([k * own - alpha, k * own], rel=1e-12)


@pytest.mark.parametrize("tp", [2, 4])
def test_sp_sums_are_each_blocks_and_the_heads_all_reduce(tp):
    """--sp: L blocks' 4h and the head's 2h, each one all-reduce over tp (MoEWork.tp_allreduce)."""
    work = work_of("ring", True, tp)
    now = [0.0] * tp
    sp_sums(work, now, 0, 4)
    want = [2 * work.tp_allreduce(64, k) + work.tp_allreduce(32, k) for k in range(tp)]
    assert now == pytest.approx(want, rel=1e-12)
