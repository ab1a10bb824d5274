"""Each rank through each round of the blocking collectives of an MoE step, as the simulated clock
(simclock.py, collectives/base.Pending) times them when the ranks reach them apart: the all-to-alls
(pairwise, Bruck) and the ring all-reduce; and the link of a group given by its members. Shared by
gpt_moe_time.py (the MoE transformer's step); ring_time.py does the same for ZeRO's rings.

A message of n bytes posted at t leaves its last byte at t + n / bw and arrives alpha later; the link
it leaves on is always free by then here (each round waits for its own send), so a rank's round ends
at max(its own send's end, its peer's arrival):
  pairwise (collectives/alltoall.py)  round r = 1..P-1: q sends q + r, receives from q - r
  Bruck (collectives/bruck.py)        round k: q sends q + 2^k, in one message, the pieces it holds at
                                      positions j with bit k set (their sizes followed round by round)
  ring all-reduce (collectives/ring.py) reduce-scatter then all-gather in one call: on GPU profiles
                                      NCCL's protocol chosen once for it (simclock.collective_timing),
                                      its base latency once; on the CPU the reduction's bytes x gamma.
The all-to-alls carry no NCCL protocol: they are point-to-point messages on the group's own link.
"""

from __future__ import annotations

import numpy as np

from .collectives import chunk


def pairwise_ends(starts: list, rows: list, row_bytes: int, link) -> list:
    """When each of P ranks ends a pairwise all-to-all started at starts[q]; rows[a][b]: rows a sends b.
    Round r: q's send ends at left[q] = t[q] + rows[q][q+r] bytes / bw, and what q - r sent it arrives at
    left[q - r] + alpha (numpy over the ranks: the same float64 operations in the same order as a loop)."""
    P, t = len(starts), np.array(starts, dtype=float)
    secs = np.array(rows, dtype=float).reshape(P, P) * row_bytes / link.bw
    q = np.arange(P)
    for r in range(1, P):
        left = t + secs[q, (q + r) % P]
        t = np.maximum(left, left[(q - r) % P] + link.alpha)
    return t.tolist()


def bruck_ends(starts: list, rows: list, row_bytes: int, link) -> list:
    """The same for Bruck's all-to-all: in round k rank q sends q + 2^k, in one message, the pieces
    it holds at positions j with bit k set (collectives/bruck.py; their sizes followed round by round)."""
    P, t = len(starts), list(starts)
    held = [[rows[q][(q + j) % P] for j in range(P)] for q in range(P)]
    for k in range((P - 1).bit_length()):
        hop = 1 << k
        moving = [j for j in range(1, P) if j & hop]
        out = [sum(held[q][j] for j in moving) * row_bytes for q in range(P)]
        t = [
            max(t[q] + out[q] / link.bw, t[(q - hop) % P] + out[(q - hop) % P] / link.bw + link.alpha)
            for q in range(P)
        ]
        held = [[held[(q - hop) % P][j] if j in moving else held[q][j] for j in range(P)] for q in range(P)]
    return t


ALLTOALL_ENDS = {"pairwise": pairwise_ends, "bruck": bruck_ends}


def ring_allreduce_ends(n: int, bpe: int, starts: list, link, gamma: float, nvls: bool = False) -> list:
    """When each of p ranks ends a blocking ring all-reduce (reduce-scatter then all-gather, one call:
    collectives/ring.py) of n elements started at starts[r]; ring_time.ring_ends' round rule. `nvls`:
    NVLink SHARP is among the tuner's choices (--collectives auto)."""
    p = len(starts)
    if p == 1:
        return list(starts)
    sizes = np.array([chunk(n, p, i) * bpe for i in range(p)], dtype=float)
    alpha, bw, cursor = link.alpha, link.bw, np.array(starts, dtype=float)
    tuning = getattr(link, "tuning", None)
    if tuning is not None and tuning.proto:  # NCCL's protocol for this call (simclock.collective_timing)
        timing = tuning.choose("all-reduce", -(-n // p) * bpe, nvls=nvls)
        alpha, bw, cursor = timing.hop, timing.bw, cursor + timing.base
    ranks = np.arange(p)
    for scatter in (True, False):
        for k in range(p - 1):
            sent = (ranks - k - 1) % p if scatter else (ranks - k) % p
            left = cursor + sizes[sent] / bw
            cursor = np.maximum(left, np.roll(left + alpha, 1))
            if scatter:
                cursor = cursor + sizes[np.roll(sent, 1)] * gamma
    return cursor.tolist()


def members_link(hw, members: list):
    """hardware.group_link's rule for a group given by its world ranks (the edpcp group under --cp is
    no single stride): intra-node when on one node, else the node's NICs shared by G / m flows, m the
    group's members on a node (an even spread assumed, as group_link does)."""
    from . import nccl
    from .hardware import Link, tuning

    G, size = hw.devices_per_node, len(members)
    on_node: dict = {}
    for w in members:
        on_node[w // G] = on_node.get(w // G, 0) + 1
    if len(on_node) == 1 or hw.nics_per_node <= 0:
        return Link(
            hw.intra_name, hw.intra_alpha, hw.intra_bw, tuning(hw, size, 1, hw.intra_bw, hw.intra_alpha)
        )
    m = max(on_node.values())
    flows = max(1, G // m)
    if hw.ring_proto:
        per_flow = nccl.rail_bandwidth(hw.intra_bw, hw.nic_bw, hw.nics_per_node, m, flows)
    else:
        per_flow = min(hw.nic_bw, hw.nics_per_node * hw.nic_bw / flows)
    return Link(
        hw.inter_name, hw.inter_alpha, per_flow, tuning(hw, size, len(on_node), per_flow, hw.inter_alpha)
    )
