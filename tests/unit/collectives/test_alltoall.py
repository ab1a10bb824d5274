"""The all-to-all closed forms (pairwise, Bruck) written here, and the cost model's, piece by piece.

The tests that launch real MPI jobs: tests/mpi/collectives/test_alltoall.py.
"""

from __future__ import annotations

import math

import numpy as np


def bruck_rows(rows: list[list[int]], p: int) -> tuple[list[int], list[int]]:
    """(rows each rank sends, rows each rank receives) over Bruck's rounds, by following every piece."""
    sent, received = [0] * p, [0] * p
    for s in range(p):
        for q in range(p):
            j = (q - s) % p
            for k in range(max(p - 1, 1).bit_length()):
                if j >> k & 1:
                    sent[(s + j % (1 << k)) % p] += rows[s][q]
                    received[(s + j % (1 << (k + 1))) % p] += rows[s][q]
    return sent, received


def pairwise_rows(rows: list[list[int]], p: int) -> tuple[list[int], list[int]]:
    return (
        [sum(rows[r][q] for q in range(p) if q != r) for r in range(p)],
        [sum(rows[q][r] for q in range(p) if q != r) for r in range(p)],
    )


def messages(alg: str, p: int) -> int:
    return p - 1 if alg == "pairwise" else math.ceil(math.log2(p)) if p > 1 else 0


def test_cost_model_formulas_follow_every_piece():
    from simpar.costmodel.collectives import ALLTOALL

    rng = np.random.default_rng(1)
    for p in range(1, 10):
        rows = rng.integers(0, 9, size=(p, p)).tolist()
        for alg, rule in (("pairwise", pairwise_rows), ("bruck", bruck_rows)):
            sent, _ = rule(rows, p)
            for r in range(p):
                c = ALLTOALL[alg](rows, p, r)
                assert (c.sent, c.messages, c.rounds) == (sent[r], messages(alg, p), messages(alg, p))
                assert c.round_elems == sent[r]  # every round's message, one after the other
