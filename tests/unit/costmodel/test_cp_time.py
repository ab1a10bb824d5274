"""costmodel/cp_time.py's ring, no MPI: each hop lasts max(its blocks, its K/V transfer), written again here.

With f (g) one causal block's forward (backward) seconds, w the K/V message's seconds on the wire and
alpha the link's latency, a rank computes 3 blocks at hop 0 and 2 at each of the other C-1 hops:
  forward   sum over hops 0..C-2 of max(k_t f, w + alpha), + 2 f at the last hop (nothing left to send)
  backward  max(3 g, w + alpha); then max(2 g, w) + w + alpha per middle hop (the dK/dV partial sum is
            sent after the blocks that add to it); 2 g + w + alpha at the last (the sums go home)
Checked at the two ends (blocks far slower than the link, and far faster) and in between.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from simpar.costmodel.cp_time import ring_seconds, ulysses_seconds

b, h, a, bpe = 2, 16, 4, 8


def block_seconds(n: int, rate: float, stream: float, products: int) -> float:
    m = n // 2
    return products * 2 * b * m * h * m / rate + 6 * b * a * m * m * bpe * stream


def expected(C: int, n: int, rate: float, stream: float, link) -> tuple[float, float]:
    f, g = block_seconds(n, rate, stream, 2), block_seconds(n, rate, stream, 5)
    w = 2 * b * n * h * bpe / link.bw
    first, last = w + link.alpha, w + link.alpha  # hop 0's K/V transfer; the last hop's dK/dV one
    forward = max(3 * f, first) + (C - 2) * max(2 * f, w + link.alpha) + 2 * f
    backward = max(3 * g, first) + (C - 2) * (max(2 * g, w) + w + link.alpha) + 2 * g + last
    return forward, backward


@pytest.mark.parametrize("C", [2, 4, 8])
@pytest.mark.parametrize("bandwidth", [1e15, 1e9, 1e6])  # links far faster than the blocks, near, far slower
def test_each_ring_hop_lasts_the_longer_of_its_blocks_and_its_transfer(C, bandwidth):
    n, rate, stream = 64 // C, 1e9, 1e-10
    link = SimpleNamespace(alpha=1e-6, bw=bandwidth)
    forward, backward, compute = ring_seconds(b, n, h, a, C, bpe, rate, stream, link)
    assert (forward, backward) == pytest.approx(expected(C, n, rate, stream, link), rel=1e-12)
    blocks = 2 * C + 1  # every rank's share of the causal triangle (cp.ring_block_map)
    f, g = block_seconds(n, rate, stream, 2), block_seconds(n, rate, stream, 5)
    assert compute == pytest.approx(blocks * (f + g), rel=1e-12)
    if bandwidth == 1e15:  # the transfers hide entirely behind the blocks, forward
        assert forward == pytest.approx(blocks * f, rel=1e-9)


def test_ulysses_blocks_on_four_all_to_alls_each_way():
    C, n, rate, stream = 4, 8, 1e9, 1e-10
    link = SimpleNamespace(alpha=1e-6, bw=1e9)
    forward, backward, compute = ulysses_seconds(b, n, h, a, C, bpe, rate, stream, link)
    A = (C - 1) * (link.alpha + b * n * h // C * bpe / link.bw)  # pairwise: C-1 rounds of one piece
    s = n * C
    core_f = 2 * 2 * b * s * (h // C) * s / rate + 6 * b * (a // C) * s * s * bpe * stream
    core_b = 4 * 2 * b * s * (h // C) * s / rate + 4 * b * (a // C) * s * s * bpe * stream
    assert (forward, backward, compute) == pytest.approx((4 * A + core_f, 4 * A + core_b, core_f + core_b))
