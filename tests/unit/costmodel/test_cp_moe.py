"""Capacity under dp x cp (parallel/context_expert.py, costmodel/cp_moe.py): the per-segment rule
drops exactly the tokens the serial model drops.

Serial: one micro-step of B rows x s tokens routed top-K, an expert keeps its first cap assignments in
row-major token order (model/moe.keep_mask with nothing before). dp x cp: rank (d, c) holds rows
start_d .. of np.array_split(B, D) and, of each, the tokens chunk_positions(c, C, s) (chunks c and
2C-1-c). Written here: which of the serial run's kept assignments land on each rank.
"""

from __future__ import annotations

import numpy as np
import pytest

from simpar.costmodel.cp_moe import kept_by_rank, segments_of
from simpar.model.moe import capacity, histogram, keep_mask
from simpar.model.ring_attention import chunk_positions
from simpar.parallel.context_expert import CpMoEFFN, segment_order

E, K, CF = 4, 2, 1.0


def serial_keep(rng, B: int, s: int):
    """(top, keep) of B s tokens in global order; routing skewed so that capacity drops."""
    top = np.stack([rng.choice(E, K, replace=False, p=[0.55, 0.25, 0.15, 0.05]) for _ in range(B * s)])
    cap = capacity(CF, K, B * s, E)
    return top.reshape(B, s, K), keep_mask(top, E, cap, np.zeros(E, np.int64)).reshape(B, s, K), cap


def rank_tokens(B: int, s: int, D: int, C: int, d: int, c: int):
    starts = np.cumsum([0] + [len(a) for a in np.array_split(np.arange(B), D)])
    return slice(starts[d], starts[d + 1]), chunk_positions(c, C, s)


@pytest.mark.parametrize("B,s,D,C", [(3, 8, 2, 2), (5, 12, 2, 3), (4, 8, 1, 4), (6, 4, 3, 1)])
def test_costmodel_keeps_per_rank_what_serial_keeps(B, s, D, C):
    rng = np.random.default_rng(B * 100 + s)
    top, keep, cap = serial_keep(rng, B, s)
    m = s // (2 * C)
    T = [histogram(top[g, q * m : (q + 1) * m], E).tolist() for g in range(B) for q in range(2 * C)]
    kept = kept_by_rank(T, cap, D, C)
    assert sum(map(sum, T)) - sum(sum(map(sum, k)) for k in kept) > 0  # something drops
    for d in range(D):
        for c in range(C):
            rows, pos = rank_tokens(B, s, D, C, d, c)
            t, k = top[rows][:, pos], keep[rows][:, pos]
            assert kept[c][d] == [int(((t == e) & k).sum()) for e in range(E)], (d, c)
            assert segment_order(B, D, C)[d * C + c] == segments_of(B, D, C, d, c)


class TableExchange:
    """What CpEpExchange hands CpMoEFFN.plan after its all-gather, from the whole table (no MPI here:
    tests/mpi/parallel/test_context_expert.py runs the real one)."""

    P, j = 1, 0

    def __init__(self, T, B, D, C, d, c, m):
        self.T, self.B, self.D, self.C, self.d, self.c, self.m = T, B, D, C, d, c, m

    def segment_table(self, counts):
        mine = segment_order(self.B, self.D, self.C)[self.d * self.C + self.c]
        assert (self.T[mine] == counts).all()  # the rank counted its own segments right
        return self.T, mine

    def by_rank(self, table):
        order = segment_order(self.B, self.D, self.C)
        return np.stack([table[order[d * self.C + self.c]].sum(axis=0) for d in range(self.D)])


def test_plan_keeps_the_serial_tokens_on_every_rank():
    """CpMoEFFN.plan's keep mask on each rank's tokens = the serial keep mask on the same tokens; the
    dp-only plan (capacity in rank order) would not be (the bug this guards against)."""
    B, s, D, C = 3, 8, 2, 2
    top, keep, cap = serial_keep(np.random.default_rng(7), B, s)
    m = s // (2 * C)
    T = np.array([histogram(top[g, q * m : (q + 1) * m], E) for g in range(B) for q in range(2 * C)])
    wrong = 0
    for d in range(D):
        for c in range(C):
            rows, pos = rank_tokens(B, s, D, C, d, c)
            mine = top[rows][:, pos].reshape(-1, K)
            ffn = CpMoEFFN(8, E, K, CF, 0.0, {}, TableExchange(T, B, D, C, d, c, m))
            _, kept, got, _ = ffn.plan(mine, cap)
            assert (got == keep[rows][:, pos].reshape(-1, K)).all(), (d, c)
            assert kept.tolist() == [
                [int(((top[r][:, pos] == e) & keep[r][:, pos]).sum()) for e in range(E)]
                for r in (rank_tokens(B, s, D, C, q, c)[0] for q in range(D))
            ]
            before = np.cumsum(T, axis=0)[2 * C * rows.start - 1] if rows.start else np.zeros(E, np.int64)
            wrong += int((keep_mask(mine, E, cap, before) != got).sum())  # rows-before-mine, as dp's
    assert wrong > 0
