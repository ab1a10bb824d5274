"""costmodel/tp_group_time.py: tp's blocking collectives followed rank by rank, by hand. No MPI.

A link of alpha = 1 s and 1 byte/s (a message of n bytes is n seconds on the wire), no reduction cost
unless given; all-reduces of n = 10 bytes (W = 10 s).
  tree p = 2 from 0: rank 1's message is in at 11, rank 0 sends the sum back 11..21: it is done at 21,
         rank 1 at 22 (= 2 alpha + 2 W, tree_allreduce's critical path).
  tree p = 4 from 0: level 2 (2 -> 0, 3 -> 1) in at 11; level 1 (1 -> 0, 11..21) in at 22; the
         broadcast 0 -> 1 (22..32, in at 33), then 0 -> 2 (32..42, in at 43) and 1 -> 3 (33..43, in
         at 44): ends 42, 43, 43, 44 -- the last rank on the critical path 4 alpha + 4 W, rank 0 two
         alphas ahead of it.
  ring all-gather (--sp's, the loss's: ring_time.ring_ends whatever --collectives says) p = 2 of 10
         one-byte elements (chunks of 5) from 0 and 3: rank 0 waits for rank 1's chunk (3 + 5 + 1 = 9);
         rank 1 is done when its own chunk has left (8): rank 0's came in at 6. Priced alone from its
         start, rank 1's all-gather would end at 3 + alpha + 5 = 9.
  ring reduce-scatter p = 3 of 9 (chunks of 3), gamma 0.5 s/byte: each of 2 steps max(3, 3 + 1) + 1.5:
         5.5, 11 (= 2 alpha + 6 + 6 x 0.5: ring_reduce_scatter's critical path).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from simpar.costmodel.collectives import ring_reduce_scatter, tree_allreduce
from simpar.costmodel.tp_group_time import group_ends

LINK = SimpleNamespace(alpha=1.0, bw=1.0, tuning=None)


def tree_ends(starts: list, n: int, link, gamma: float) -> list:
    return group_ends(("all-reduce", n, 1), starts, "tree", link, gamma)


def ps_ends(starts: list, n: int, link, gamma: float) -> list:
    return group_ends(("all-reduce", n, 1), starts, "ps", link, gamma)


def critical_path(cost, gamma: float = 0.0) -> float:
    return cost.rounds * LINK.alpha + cost.round_elems / LINK.bw + cost.reduced * gamma


def test_a_tree_of_two_leaves_the_root_alpha_early():
    assert tree_ends([0.0, 0.0], 10, LINK, 0.0) == [21.0, 22.0]
    assert critical_path(tree_allreduce(10, 2, 1)) == 22.0


def test_a_tree_of_four_ends_its_last_rank_on_the_critical_path():
    assert tree_ends([0.0] * 4, 10, LINK, 0.0) == [42.0, 43.0, 43.0, 44.0]
    assert critical_path(tree_allreduce(10, 4, 3)) == 44.0
    # the sums: rank 0 adds twice (levels 2 and 1), 10 bytes each, before the broadcast
    assert tree_ends([0.0] * 4, 10, LINK, 0.5)[3] == pytest.approx(44.0 + 2 * 10 * 0.5)


def test_a_late_rank_delays_the_tree_by_its_lateness():
    assert tree_ends([0.0, 100.0], 10, LINK, 0.0) == [121.0, 122.0]


def test_the_parameter_server_replies_worker_by_worker():
    assert ps_ends([0.0] * 3, 10, LINK, 0.0) == [41.0, 32.0, 42.0]  # test_ps_time.py's one bucket


def test_a_ring_all_gather_lets_the_late_rank_catch_up():
    assert group_ends(("all-gather", 10, 1), [0.0, 3.0], "tree", LINK, 0.0) == [9.0, 8.0]


def test_a_ring_reduce_scatter_adds_what_comes_in():
    ends = group_ends(("reduce-scatter", 9, 1), [0.0] * 3, "tree", LINK, 0.5)
    assert ends == [11.0] * 3
    assert critical_path(ring_reduce_scatter(9, 3, 0), 0.5) == 11.0


def test_a_gpu_ring_pays_its_protocols_base_once_and_its_hop_per_step():
    chosen = SimpleNamespace(base=10.0, hop=0.5, bw=2.0)
    asked = []
    tuning = SimpleNamespace(proto=("Simple",), choose=lambda *a, **k: asked.append(a) or chosen)
    link = SimpleNamespace(alpha=1.0, bw=1.0, tuning=tuning)
    # chunks of 5 bytes at 2 B/s: 2.5 s on the wire, in 0.5 s later: 10 + 2.5 + 0.5
    assert group_ends(("all-gather", 10, 1), [0.0, 0.0], "ps", link, 0.0) == [13.0, 13.0]
    assert asked == [("all-gather", 5)]  # chosen by the bytes of one step, as the clock's tuner


def test_group_ends_runs_the_algorithm_for_all_reduces_and_the_ring_otherwise():
    assert group_ends(("all-reduce", 5, 2), [0.0] * 4, "tree", LINK, 0.0) == [42.0, 43.0, 43.0, 44.0]
    assert group_ends(("all-reduce", 10, 1), [0.0] * 3, "ps", LINK, 0.0) == [41.0, 32.0, 42.0]
