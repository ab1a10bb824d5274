"""costmodel/rounds_time.py: every rank of a dp group through every round of its buckets, by hand. No MPI.

A link of alpha = 10 s and 1 byte/s (n bytes are n seconds on the wire); all ranks start at 0.

Binomial tree on p = 3, one bucket of n = 4 bytes, reduction g = 0.5 s per byte. Reduce: rank 2 sends
to rank 0 (round d = 2), rank 1 sends to rank 0 (d = 1); both leave at 0 and arrive at 14, in different
rounds of rank 0, so they do not queue: rank 0 adds one at 14 (+2), the other at 16 (+2): 18. Broadcast:
rank 0 sends to 1 (leaves 22, arrives 32), then to 2 (leaves 26, arrives 36). Ends 26, 32, 36 -- where
the critical path (4 rounds of alpha + n, and 2 n g: collectives.tree_allreduce) says 60.

Rabenseifner on p = 3 (q = 2, e = 1), one bucket of 3 one-byte elements, no reduction cost: rank 1 folds
into rank 0 (3 bytes: arrives 13); ranks 0 and 2 (m = 0, 1) halve the 2 blocks (2 and 1 bytes): rank 2
sends block 0 at 0 (arrives 12), rank 0 block 1 at 13 (leaves 14, arrives 24): rank 0 at 14, rank 2 at 24;
doubling: rank 0 sends block 0 at 14 (leaves 16, arrives 26), rank 2 block 1 at 24 (leaves 25, arrives
35): rank 0 at 35, rank 2 at 26; rank 0 unfolds 3 bytes to rank 1 at 35: leaves 38, arrives 48.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from simpar.costmodel.allreduce_ends import rabenseifner_program, tree_program
from simpar.costmodel.collectives import tree_allreduce
from simpar.costmodel.rounds_time import bucket_ends

LINK = SimpleNamespace(alpha=10.0, bw=1.0, tuning=None)


def test_a_tree_on_three_ranks_ends_each_rank_apart():
    assert bucket_ends("tree", [[0.0]] * 3, [4], 1, LINK, 0.5) == [26.0, 32.0, 36.0]
    path = tree_allreduce(4, 3, 0)  # the critical path one rank's own cost gives
    assert path.rounds * LINK.alpha + path.round_elems / LINK.bw + path.reduced * 0.5 == 60.0


def test_rabenseifner_on_three_ranks_folds_halves_doubles_unfolds():
    assert bucket_ends("rabenseifner", [[0.0]] * 3, [3], 1, LINK, 0.0) == [38.0, 48.0, 26.0]


def test_the_next_bucket_starts_when_the_last_one_ended_on_that_rank():
    # the tree's second bucket, ready at 0 everywhere: rank r starts it when its first one ended.
    # Reduce: rank 2 sends at 36 (arrives 50), rank 1 at 32 (arrives 46); rank 0 (free at 26) adds
    # 2's at 50 (52), 1's (long there) at 54; broadcast: to 1 leaves 58 (arrives 68), to 2 leaves 62
    # (arrives 72)
    assert bucket_ends("tree", [[0.0, 0.0]] * 3, [4, 4], 1, LINK, 0.5) == [62.0, 68.0, 72.0]


@pytest.mark.parametrize("p", [2, 3, 4, 5, 6, 7, 8])
def test_every_message_sent_is_received_and_the_ledger_volumes_hold(p):
    """The rounds are the algorithms' own: what rank r sends to s, r's plan lists as s's receive from r;
    the tree moves 2 (p - 1) n bytes in all, Rabenseifner 2 (p - 1) n (Thakur et al. 2005)."""
    n = 7
    for plans in (
        [tree_program(p, r, n) for r in range(p)],
        [rabenseifner_program(p, r, n, 1) for r in range(p)],
    ):
        sent = sorted((r, dst, b) for r in range(p) for sends, _, _ in plans[r] for dst, b in sends)
        got = sorted((src, r, b) for r in range(p) for _, recvs, _ in plans[r] for src, b in recvs)
        assert sent == got
        assert sum(b for _, _, b in sent) == 2 * (p - 1) * n
