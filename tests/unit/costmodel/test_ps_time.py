"""costmodel/ps_time.py: the parameter server's buckets followed rank by rank, by hand. No MPI.

A link of alpha = 1 s and 1 byte/s (a message of n bytes is n seconds on the wire), no reduction cost
unless given. One bucket of 10 bytes on p = 3 ranks starting at 0: the two pushes come in one after
another (10, 20), all in at 21; the replies leave at 21 and 31: worker 1 is done at 32, worker 2 at 42
(= 2 alpha + 2 (p-1) W, ps_allreduce's critical path), the server at 41. A second bucket: worker 1
pushes at 32, worker 2 at 42: in by 52 (+1), replies at 53 and 63: ends 73 (server), 64, 74 -- not
the 84 that two critical paths in a row would give: worker 1's push overlapped worker 2's reply.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from simpar.costmodel.collectives import ps_allreduce
from simpar.costmodel.ps_time import ps_bucket_ends

LINK = SimpleNamespace(alpha=1.0, bw=1.0)


def test_one_bucket_is_the_critical_path_for_the_last_worker():
    assert ps_bucket_ends([[0.0]] * 3, [10], LINK, 0.0) == [41.0, 32.0, 42.0]
    path = ps_allreduce(10, 3, 2)
    assert 42.0 == path.rounds * LINK.alpha + path.round_elems / LINK.bw


def test_the_next_bucket_queues_behind_the_last_and_overlaps_it():
    assert ps_bucket_ends([[0.0, 0.0]] * 3, [10, 10], LINK, 0.0) == [73.0, 64.0, 74.0]


def test_two_ranks_chain_critical_paths():
    ends = ps_bucket_ends([[0.0, 0.0]] * 2, [10, 10], LINK, 0.0)
    assert ends == [43.0, 44.0] and ends[1] == 2 * (2 * LINK.alpha + 2 * 10)


def test_the_server_sums_on_its_stream_and_late_starts_wait():
    gamma = 0.5  # s per byte: the server's two sums of 10 bytes take 10 s
    assert ps_bucket_ends([[0.0]] * 3, [10], LINK, gamma)[2] == pytest.approx(2 + 40 + 10)
    # the server starting at 100 (its backward ran late): the pushes wait in its port, replies from 100
    assert ps_bucket_ends([[100.0], [0.0], [0.0]], [10], LINK, 0.0) == [120.0, 111.0, 121.0]
