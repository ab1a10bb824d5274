"""Each rank of a group through one blocking all-reduce of any --collectives algorithm, from its own
start: when each ends it, as the simulated clock (simclock.py, collectives/base.Pending) times it when
the ranks reach it apart (the MoE step's gradients: gpt_moe_time.MoEWork.allreduce).

Summing one rank's critical path (collectives.ALLREDUCE's Cost, gpt_time.py's rule) is exact only when
the ranks start together; an MoE step's ranks reach their gradient all-reduce apart (their experts got
different rows), and then who waits for whom depends on the algorithm's rounds. So each is followed:
  ring, auto    moe_rounds.ring_allreduce_ends (auto: NCCL's protocol with NVLink SHARP allowed)
  ps            ps_time.ps_bucket_ends with one bucket (the pushes queue at the server)
  mpi           its messages are hidden: each rank's own closed form on the stream (collectives/native.py:
                the ring's or Rabenseifner's alpha-beta-gamma time, collectives.mpi_allreduce), no waits
  tree          collectives/tree.py's rounds: binomial reduce to rank 0 (each parent adds what it got),
                binomial broadcast back
  rabenseifner  collectives/rabenseifner.py's rounds: the fold, recursive halving (adding the kept
                half), recursive doubling, the unfold
written again here as message lists (nothing imported from the runtime) and followed by `follow`, with
the clock's rules: a round's sends leave one after another from the rank's time (one outgoing port),
its receives arrive one after another (one incoming port: each message alpha after its last byte),
the round ends when both are done, then what was received is added in (bytes x gamma on the stream).
"""

from __future__ import annotations

from .chunktime import seconds
from .collectives import chunk_offset, mpi_allreduce, to_bytes
from .moe_rounds import ring_allreduce_ends
from .ps_time import ps_bucket_ends


def follow(programs: list, starts: list, link, gamma: float) -> list:
    """When each rank ends its rounds; programs[r]: [(sends, receives, reduced bytes after)] with sends
    and receives [(peer, bytes)], matched in order per (sender, receiver) pair (module docstring)."""
    p, bw, alpha = len(programs), link.bw, link.alpha
    t, free, pos = list(starts), list(starts), [0] * p
    posted: dict = {}  # rank -> its current round's send ends, once posted
    wires: dict = {}  # (sender, receiver) -> [(when its first byte left, bytes)] not yet received
    progress = True
    while progress:
        progress = False
        for r in range(p):
            while pos[r] < len(programs[r]):
                sends, receives, reduced = programs[r][pos[r]]
                if r not in posted:
                    ends = []
                    for peer, nbytes in sends:
                        depart = max(t[r], free[r])
                        free[r] = depart + nbytes / bw
                        wires.setdefault((r, peer), []).append((depart, nbytes))
                        ends.append(free[r])
                    posted[r] = ends
                waiting = [peer for peer, _ in receives]
                if any(len(wires.get((peer, r), ())) < waiting.count(peer) for peer in waiting):
                    break  # a peer has not sent yet: let the others move
                data_end = done = float("-inf")
                for start, nbytes in sorted(wires[(peer, r)].pop(0) for peer, _ in receives):
                    data_end = max(start + nbytes / bw, data_end + nbytes / bw)
                    done = max(done, data_end + alpha)
                t[r] = max([t[r], done, *posted.pop(r)]) + reduced * gamma
                pos[r] += 1
                progress = True
    return t


def tree_program(p: int, r: int, nbytes: float) -> list:
    """Rank r's rounds of collectives/tree.py: the binomial reduce to rank 0, then the broadcast."""
    rounds, d = [], 1 << ((p - 1).bit_length() - 1)
    while d >= 1:
        if r < d and r + d < p:
            rounds.append(([], [(r + d, nbytes)], nbytes))
        elif d <= r < 2 * d:
            rounds.append(([(r - d, nbytes)], [], 0))
        d //= 2
    d = 1
    while d < p:
        if r < d and r + d < p:
            rounds.append(([(r + d, nbytes)], [], 0))
        elif d <= r < 2 * d:
            rounds.append(([], [(r - d, nbytes)], 0))
        d *= 2
    return rounds


def rabenseifner_program(p: int, r: int, n: int, bpe: int) -> list:
    """Rank r's rounds of collectives/rabenseifner.py on n elements of bpe bytes (q = 2^floor(log2 p)
    blocks of np.array_split's sizes; the e = p - q first odd ranks fold into their even neighbours)."""
    q = 1 << (p.bit_length() - 1)
    e, whole = p - q, n * bpe
    if r < 2 * e and r % 2:  # an odd folding rank: hands its data over, gets the sum back
        return [([(r - 1, whole)], [], 0), ([], [(r - 1, whole)], 0)]
    size = lambda a, b: (chunk_offset(n, q, b) - chunk_offset(n, q, a)) * bpe  # noqa: E731  blocks a..b-1
    rank_of = lambda v: 2 * v if v < e else v + e  # noqa: E731
    rounds, m = ([([], [(r + 1, whole)], whole)], r // 2) if r < 2 * e else ([], r - e)
    lo, hi, d = 0, q, q // 2
    while d >= 1:  # halving: keep one half of [lo, hi), send the other, add in the kept half received
        mid = (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if m & d == 0 else ((mid, hi), (lo, mid))
        rounds.append(([(rank_of(m ^ d), size(*give))], [(rank_of(m ^ d), size(*keep))], size(*keep)))
        lo, hi = keep
        d //= 2
    d = 1
    while d < q:  # doubling: send the range held, get the sibling range
        width = hi - lo
        other = lo + width if m & d == 0 else lo - width
        rounds.append(([(rank_of(m ^ d), size(lo, hi))], [(rank_of(m ^ d), size(other, other + width))], 0))
        lo, hi = min(lo, other), max(hi, other + width)
        d *= 2
    if r < 2 * e:  # unfold
        rounds.append(([(r + 1, whole)], [], 0))
    return rounds


def allreduce_ends(algorithm: str, n: int, bpe: int, starts: list, link, gamma: float) -> list:
    """When each of the group's ranks ends a blocking all-reduce of n elements it starts at starts[r]."""
    p = len(starts)
    if p == 1:
        return list(starts)
    if algorithm in ("ring", "auto"):
        return ring_allreduce_ends(n, bpe, starts, link, gamma, nvls=algorithm == "auto")
    if algorithm == "ps":
        return ps_bucket_ends([[s] for s in starts], [n * bpe], link, gamma)
    if algorithm == "mpi":
        return [s + seconds(to_bytes(mpi_allreduce(n, p, r), bpe), link, gamma) for r, s in enumerate(starts)]
    if algorithm == "tree":
        return follow([tree_program(p, r, n * bpe) for r in range(p)], starts, link, gamma)
    return follow([rabenseifner_program(p, r, n, bpe) for r in range(p)], starts, link, gamma)
