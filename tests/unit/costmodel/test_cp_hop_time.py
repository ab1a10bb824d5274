"""costmodel/cp_hop_time.py, no MPI: a cp group's ranks followed hop by hop when they reach a block at
different times (ZeRO's uneven rings under --cp --zero 2|3).

With equal starts every rank ends when cp_time.py's sum says. With rank 1 of a ring of C = 2 late by
delta, the hops are written here again from context_attention.py's messages (f, g a block's forward
and backward, w (u) the K/V (dK/dV) message on the wire, alpha the link's latency):
  forward   rank 0: max(3 f, delta + w + alpha) + 2 f       rank 1: max(delta + 3 f, w + alpha) + 2 f
  backward  hop 0 as forward with g; hop 1 each rank sends its partial sum home, d_r = c_r + 2 g + u,
            and ends at max(d_r, d_{r-1} + alpha)
  Ulysses (C = 2, one round per all-to-all): c_r <- max(c_r + piece, c_{1-r} + piece + alpha), four
  times, then the core.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from simpar.costmodel.cp_hop_time import attention_ends
from simpar.costmodel.cp_time import ring_seconds, ulysses_seconds

b, h, a, bpe, rate, stream = 2, 16, 4, 8, 1e9, 1e-10


def block(n: int, products: int) -> float:
    m = n // 2
    return products * 2 * b * m * h * m / rate + 6 * b * a * m * m * bpe * stream


@pytest.mark.parametrize("algo", ["ring", "ulysses"])
@pytest.mark.parametrize("C", [2, 3, 4])
@pytest.mark.parametrize("bandwidth", [1e15, 1e9, 1e6])  # blocks outlast the transfers, near, far less
def test_equal_starts_end_as_cp_time_sums(algo, C, bandwidth):
    n, link, start = 8, SimpleNamespace(alpha=1e-6, bw=bandwidth), 0.25
    seconds = ring_seconds if algo == "ring" else ulysses_seconds
    forward, backward, _ = seconds(b, n, h, a, C, bpe, rate, stream, link)
    for backward_pass, expected in ((False, forward), (True, backward)):
        ends = attention_ends(algo, [start] * C, b, n, h, a, bpe, rate, stream, link, backward_pass)
        assert ends == pytest.approx([start + expected] * C, rel=1e-12, abs=0)


@pytest.mark.parametrize("delta", [0.0, 3e-6, 1e-3])  # late by less than a transfer, by more than a hop
def test_a_late_neighbour_holds_the_ring_hop(delta):
    n, link = 8, SimpleNamespace(alpha=1e-6, bw=1e9)  # C = 2
    f, g = block(n, 2), block(n, 5)
    w = u = 2 * b * n * h * bpe / link.bw  # float64: the partial sums travel in the same type
    fwd = attention_ends("ring", [0.0, delta], b, n, h, a, bpe, rate, stream, link, False)
    assert fwd == pytest.approx(
        [max(3 * f, delta + w + link.alpha) + 2 * f, max(delta + 3 * f, w + link.alpha) + 2 * f], rel=1e-12
    )
    bwd = attention_ends("ring", [0.0, delta], b, n, h, a, bpe, rate, stream, link, True)
    hop0 = [max(3 * g, delta + w + link.alpha), max(delta + 3 * g, w + link.alpha)]
    d = [c + 2 * g + u for c in hop0]
    assert bwd == pytest.approx([max(d[0], d[1] + link.alpha), max(d[1], d[0] + link.alpha)], rel=1e-12)
    if delta == 1e-3:  # far later than a hop: rank 0 waits for its K/V, not its own blocks
        assert fwd[0] > 5 * f + delta / 2 and bwd[0] > 5 * g + delta / 2


def test_a_late_neighbour_holds_the_all_to_all():
    C, n, delta, link = 2, 8, 5e-6, SimpleNamespace(alpha=1e-6, bw=1e9)
    piece = b * n * h // C * bpe / link.bw
    s = n * C
    core_f = 2 * 2 * b * s * (h // C) * s / rate + 6 * b * (a // C) * s * s * bpe * stream
    c = [0.0, delta]
    for _ in range(4):
        c = [max(c[0] + piece, c[1] + piece + link.alpha), max(c[1] + piece, c[0] + piece + link.alpha)]
    ends = attention_ends("ulysses", [0.0, delta], b, n, h, a, bpe, rate, stream, link, False)
    assert ends == pytest.approx([x + core_f for x in c], rel=1e-12)


def test_every_hop_shifts_with_the_clocks():
    """The same delay added to every start delays every end by as much (cp_zero_time.py adds a unit's
    own work after its attention on that account)."""
    starts, link = [0.0, 2e-6, 1e-6, 5e-6], SimpleNamespace(alpha=1e-6, bw=1e9)
    for algo in ("ring", "ulysses"):
        for backward in (False, True):
            ends = attention_ends(algo, starts, b, 8, h, a, bpe, rate, stream, link, backward)
            later = attention_ends(
                algo, [t + 0.5 for t in starts], b, 8, h, a, bpe, rate, stream, link, backward
            )
            assert later == pytest.approx([t + 0.5 for t in ends], rel=1e-12)
