"""The MoE predictors' shortcuts at scale (moe.EpAlltoalls, moe_rounds.pairwise_ends in numpy) against
the rules written here: a rank's four all-to-alls from an uneven kept matrix, and the pairwise rounds'
recurrence -- exactly, since a 512-rank plan must print what the per-block loop printed."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from simpar.costmodel.moe import EpAlltoalls
from simpar.costmodel.moe_rounds import pairwise_ends


@pytest.mark.parametrize("alltoall", ["pairwise", "bruck"])
def test_a_ranks_alltoalls_from_an_uneven_matrix(alltoall):
    """D = 8 ranks in ep groups of P = 4, E = 8 experts (2 per rank), h = 3: rank d sends its kept
    assignments to other ranks' experts (dispatch, combine-grad) and returns its experts' outputs to the
    group's other ranks (combine, dispatch-grad); every element crosses once either way."""
    D, P, E, h = 8, 4, 8, 3
    rnd = random.Random(7)
    kept = [[rnd.randint(0, 9) for _ in range(E)] for _ in range(D)]
    memo = EpAlltoalls(E, P, h, alltoall)
    for d in range(D):
        j, base, per = d % P, d - d % P, E // P
        mine = range(j * per, (j + 1) * per)
        out = sum(kept[d][e] for e in range(E) if e not in mine) * h
        back = sum(kept[s][e] for s in range(base, base + P) if s != d for e in mine) * h
        costs = memo(kept, d)
        sent = {op: c.sent for op, c in costs.items()}
        if alltoall == "pairwise":  # straight to the owner, P - 1 rounds
            assert sent == {
                "ep-dispatch": out,
                "ep-combine-grad": out,
                "ep-combine": back,
                "ep-dispatch-grad": back,
            }
        else:  # Bruck forwards: each piece once per set bit of its distance (1 or 2 of log2 P = 2 bits)
            assert out <= sent["ep-dispatch"] <= 2 * out and back <= sent["ep-combine"] <= 2 * back
        rounds = P - 1 if alltoall == "pairwise" else 2
        assert all(c.messages == rounds == c.rounds and c.round_elems == c.sent for c in costs.values())
        assert memo(kept, d) is costs  # the second block with this matrix: remembered, not recomputed
    other = [row[::-1] for row in kept]  # another matrix (alive beside the first): its own costs
    assert memo(other, 1) == EpAlltoalls(E, P, h, alltoall)(other, 1) != memo(kept, 1)


def loop_pairwise_ends(starts, rows, row_bytes, link):
    """The pairwise rounds one rank at a time: round r, q sends q + r and receives from q - r; its round
    ends when its own send has left and the other's has arrived."""
    P, t = len(starts), list(starts)
    for r in range(1, P):
        t = [
            max(
                t[q] + rows[q][(q + r) % P] * row_bytes / link.bw,
                t[(q - r) % P] + rows[(q - r) % P][q] * row_bytes / link.bw + link.alpha,
            )
            for q in range(P)
        ]
    return t


def test_pairwise_ends_is_the_round_by_round_recurrence_exactly():
    rnd = random.Random(3)
    for P in (1, 2, 3, 5, 8, 16):
        for _ in range(50):
            link = SimpleNamespace(bw=rnd.uniform(1e8, 1e12), alpha=rnd.uniform(0, 1e-4))
            starts = [rnd.uniform(0, 1e-3) for _ in range(P)]
            rows = [
                [rnd.choice([rnd.randint(0, 5000), rnd.uniform(0, 5000)]) for _ in range(P)] for _ in range(P)
            ]
            assert pairwise_ends(starts, rows, 2 * 12288, link) == loop_pairwise_ends(
                starts, rows, 2 * 12288, link
            )
