"""ZeRO's step in closed form, every rank through every ring round (costmodel/ring_time.py, zero_time.py).

In-process: the closed forms against formulas written here. The end-to-end check against the simulated
clock (the real run) is tests/mpi/runtime/test_simclock.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from simpar import costmodel as cm
from simpar.costmodel import hardware
from simpar.costmodel.ring_time import ring_ends

LINK = SimpleNamespace(alpha=3e-6, bw=2e9, tuning=None)  # a CPU-style link: no NCCL protocol table


@pytest.mark.parametrize("kind", ["all-gather", "reduce-scatter"])
def test_a_ring_of_equal_chunks_from_a_common_start_is_the_textbook_formula(kind):
    """p ranks, n/p elements each, all starting at t0: (p-1) rounds of alpha + (n/p) bpe / bw, plus
    (reduce-scatter) the received chunk added each round, (n/p) bpe gamma."""
    p, n, bpe, gamma, t0 = 4, 1032, 8, 1e-10, 5e-6
    link_free = [0.0] * p
    ends = ring_ends(kind, n, bpe, [t0] * p, link_free, LINK, gamma)
    chunk_bytes = n // p * bpe
    add = chunk_bytes * gamma if kind == "reduce-scatter" else 0.0
    expected = t0 + (p - 1) * (LINK.alpha + chunk_bytes / LINK.bw + add)
    assert ends == pytest.approx([expected] * p, rel=1e-12)
    # the last send left one latency (and the last chunk's addition) before the end
    assert link_free == pytest.approx([expected - LINK.alpha - add] * p, rel=1e-12)


def test_a_late_rank_holds_up_the_ring_one_neighbour_a_round():
    """Rank 1 starts `late`: its own p-1 sends go out back to back (it never waits: its left neighbour
    sent long ago), and the lateness reaches rank 1+j after j rounds, each a whole alpha + chunk / bw:
    rank 1+j ends at late + j (alpha + c/bw) + (p-1-j) c/bw."""
    p, n, bpe, late = 4, 1032, 8, 1e-3
    ends = ring_ends("all-gather", n, bpe, [0.0, late, 0.0, 0.0], [0.0] * p, LINK, 0.0)
    wire = n // p * bpe / LINK.bw
    for j in range(p):
        expected = late + j * (LINK.alpha + wire) + (p - 1 - j) * wire
        assert ends[(1 + j) % p] == pytest.approx(expected, rel=1e-12)


def _spec(widths, zero):
    return cm.Spec(widths=widths, batch=64, dp=4, zero=zero, precision="fp64")


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_equal_chunks_give_one_ranks_sum_and_uneven_ones_do_not(zero):
    """When dp divides every unit (and the rows), the ranks never wait on each other: following all 4
    ranks (predict with every rank) gives exactly one rank's collectives summed (predict with rank 0
    alone falls back to that sum). With a last layer of 1,290 parameters (323/323/322/322) stages 2 and
    3 differ: the ranks drift apart between their per-unit rings (stage 1's one ring of P does not)."""
    hw = hardware.load("dgx-h100")
    even = _spec([64, 128, 128, 8], zero)  # units of 8320, 16512, 1032 elements: all divisible by 4
    every, one = (cm.predict(even, hw, ranks=r)["time"]["step_s"] for r in ([0, 1, 2, 3], [0]))
    assert every == pytest.approx(one, rel=1e-12)
    uneven = _spec([64, 128, 128, 10], zero)
    every, one = (cm.predict(uneven, hw, ranks=r)["time"]["step_s"] for r in ([0, 1, 2, 3], [0]))
    assert abs(every / one - 1) > (1e-7 if zero > 1 else -1)
