"""costmodel/allreduce_ends.py against closed forms written here: each algorithm from late starts
(hand-followed rounds), from equal starts the dense cost model's critical path, and the round follower
against ps_time.py's own rule for the parameter server (many messages a round, one port each way).
(predict == simulate on real runs: tests/mpi/runtime/test_moe_simclock.py.)"""

from __future__ import annotations

import pytest

from simpar.costmodel.allreduce_ends import allreduce_ends, follow
from simpar.costmodel.chunktime import seconds
from simpar.costmodel.collectives import ALLREDUCE, to_bytes
from simpar.costmodel.hardware import Link
from simpar.costmodel.ps_time import ps_bucket_ends

A, BW, G = 1e-6, 1e9, 1e-10  # alpha, bytes/s, seconds per byte summed
LINK = Link("test", A, BW)


def test_tree_waits_for_a_late_leaf():
    """p = 4, rank 3 late by L; n elements of 4 bytes, W = one message's wire time. Reduce: 3 -> 1 at L,
    1 -> 0, (2 -> 0 long before); broadcast 0 -> 1, then 0 -> 2 and 1 -> 3: each arrival alpha after
    its last byte, each sum 4n gamma after its receive."""
    n, L = 1000, 1e-3
    W, g = 4 * n / BW, 4 * n * G
    ends = allreduce_ends("tree", n, 4, [0.0, 0.0, 0.0, L], LINK, G)
    r1 = L + A + W + g  # 1 got 3's sum
    r0 = r1 + W + A + g  # 0 got 1's sum
    want = [r0 + 2 * W, r0 + 2 * W + A, r0 + 2 * W + A, r0 + 2 * W + 2 * A]
    assert ends == pytest.approx(want, rel=1e-12)


def test_rabenseifner_halves_then_doubles_from_apart():
    """p = 2, rank 1 late by L, each half B bytes: the halving exchange ends for 0 when 1's half
    arrives, for 1 when its own send has left; then the doubling exchange."""
    n, L = 1000, 1e-3
    B = 4 * n / 2 / BW
    ends = allreduce_ends("rabenseifner", n, 4, [0.0, L], LINK, G)
    t0, t1 = L + B + A + 2000 * G, L + B + 2000 * G
    assert ends == pytest.approx([max(t0 + B, t1 + B + A), max(t1 + B, t0 + B + A)], rel=1e-12)


@pytest.mark.parametrize("algorithm", ["tree", "rabenseifner", "ps", "mpi"])
@pytest.mark.parametrize("p", [2, 4])
def test_from_together_the_last_rank_ends_on_the_critical_path(algorithm, p):
    n, t = 4000, 2e-3
    ends = allreduce_ends(algorithm, n, 4, [t] * p, LINK, G)
    path = seconds(to_bytes(ALLREDUCE[algorithm](n, p, 0), 4), LINK, G)
    assert max(ends) == pytest.approx(t + path, rel=1e-12)


def test_rabenseifner_folds_the_odd_rank_in_and_out():
    """p = 3: rank 1 hands its n elements to rank 0 and gets the sum back (the fold's two whole-buffer
    rounds); 0 and 2 run p = 2's halving and doubling on the sum: the path's 4 alpha, 2 (n/2 + n) x 4
    bytes on the wire and (n/2 + n) x 4 summed, ending on rank 1 (collectives.rabenseifner_allreduce)."""
    n = 4000
    ends = allreduce_ends("rabenseifner", n, 4, [0.0] * 3, LINK, G)
    assert ends[1] == pytest.approx(4 * A + 2 * (n // 2 + n) * 4 / BW + (n // 2 + n) * 4 * G, rel=1e-12)
    assert max(ends) == ends[1]


def test_mpi_is_each_ranks_own_closed_form():
    """Its messages are hidden: no waits, each rank from its own start; over 4 ranks MPICH's choice is
    Rabenseifner's 2 log2 4 rounds, 2 x 3/4 of the 4n bytes on the path and 3/4 of them summed."""
    n, starts = 1000, [0.0, 1e-3, 2e-3, 5e-4]
    T = 4 * A + 6 * n / BW + 3 * n * G
    assert allreduce_ends("mpi", n, 4, starts, LINK, G) == pytest.approx([s + T for s in starts], rel=1e-12)


def test_the_follower_queues_a_servers_messages_as_ps_time_does():
    """The parameter server as rounds (collectives/ps.py): workers push, then wait; the server takes
    every push in one round (its one incoming port), sums them, and replies in one round (its one
    outgoing port). From scattered starts `follow` must end each rank where ps_time.py's rule does."""
    p, nbytes = 4, 8000
    server = [
        ([], [(w, nbytes) for w in range(1, p)], (p - 1) * nbytes),
        ([(w, nbytes) for w in range(1, p)], [], 0),
    ]
    worker = [([(0, nbytes)], [], 0), ([], [(0, nbytes)], 0)]
    starts = [3e-6, 0.0, 7e-6, 1e-6]
    got = follow([server] + [worker] * (p - 1), starts, LINK, G)
    assert got == pytest.approx(ps_bucket_ends([[s] for s in starts], [nbytes], LINK, G), rel=1e-12)
