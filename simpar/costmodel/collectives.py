"""Per-algorithm cost formulas: what ONE rank sends in ONE collective, counted in elements.

Part of the cost model (costmodel/__init__.py says how its files fit together).
`ALLREDUCE[name](n, p, r)` is rank r's Cost of an all-reduce of n elements over p ranks, for each
algorithm `--collectives` can pick (the algorithms themselves: simpar/collectives/);
ring_reduce_scatter and ring_allgather are the halves ZeRO uses on their own. Who runs which
collective, on how many elements, how often: rank.py.

Chunks are cut by np.array_split, so chunk i of N split p ways has N//p + (i < N%p) elements
(the np.array_split rule):

  ring reduce-scatter  rank r sends every chunk but its own:            N - c_r
  ring all-gather      rank r sends every chunk but chunk r+1:          N - c_(r+1)
  ring all-reduce      both:  2N - c_r - c_(r+1) = 2(p-1)/p * N (+-1 per chunk)   (Patarasuk & Yuan 2009)

Besides what the rank sends, a Cost carries the collective's critical path (rounds, elements through
the slowest link, elements reduced) for the alpha-beta-gamma time model in costmodel.predict.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# -- collective volumes (elements), per rank --------------------------------------------------------


def chunk(n: int, p: int, i: int) -> int:
    """Elements in chunk i of n split p ways (np.array_split)."""
    base, extra = divmod(n, p)
    return base + (1 if i % p < extra else 0)


def chunk_offset(n: int, p: int, i: int) -> int:
    """Start of chunk i of n split p ways (collectives.chunk_bounds[i])."""
    base, extra = divmod(n, p)
    return i * base + min(i, extra)


@dataclass
class Cost:
    """One rank's part of one collective. `sent` and `messages` are what THIS rank sends (the ledger
    must agree exactly); `rounds`, `round_elems` and `reduced` describe the collective's critical
    path for the time model (Thakur et al. 2005): sequential rounds (alpha each), elements through
    the slowest link over all rounds (beta each), elements reduced along the way (gamma each)."""

    sent: int = 0
    messages: int = 0
    reduced: int = 0
    rounds: int = 0
    round_elems: int = 0
    # the calls summed into this Cost once in bytes (to_bytes): (rounds, round bytes, reduced bytes,
    # how many such calls) each -- so that a time model that prices each call by its size (NCCL's
    # protocols, chunktime.op_time) can, after a step's calls of different sizes were added up
    calls: tuple = field(default=(), compare=False)

    def __add__(self, o: "Cost") -> "Cost":
        return Cost(
            self.sent + o.sent,
            self.messages + o.messages,
            self.reduced + o.reduced,
            self.rounds + o.rounds,
            self.round_elems + o.round_elems,
            self.calls + o.calls,
        )


def ring_reduce_scatter(n: int, p: int, r: int) -> Cost:
    if p == 1:
        return Cost()
    big = -(-n // p)
    return Cost(n - chunk(n, p, r), p - 1, (p - 1) * big, p - 1, (p - 1) * big)


def ring_allgather(n: int, p: int, r: int) -> Cost:
    if p == 1:
        return Cost()
    return Cost(n - chunk(n, p, r + 1), p - 1, 0, p - 1, (p - 1) * -(-n // p))


def ring_allreduce(n: int, p: int, r: int) -> Cost:
    return ring_reduce_scatter(n, p, r) + ring_allgather(n, p, r)


def rabenseifner_allreduce(n: int, p: int, r: int) -> Cost:
    """Recursive halving reduce-scatter + recursive doubling all-gather over q = 2^floor(log2 p)
    ranks, the e = p - q extra ranks folded in first and out last (collectives/rabenseifner.py; Rabenseifner
    2004; Thakur et al. 2005 sec. 4.4). Blocks: np.array_split(n, q). Rank m of the q sends, at
    halving step d, the half of its block range it gives away; at doubling step d, all it holds."""
    if p == 1:
        return Cost()
    q = 1 << (p.bit_length() - 1)
    e, L = p - q, q.bit_length() - 1
    fold = 2 if e else 0
    block = -(-n // q)
    path = dict(
        rounds=2 * L + fold,
        round_elems=2 * (q - 1) * block + fold * n,
        reduced=(q - 1) * block + fold // 2 * n,
    )
    if r < 2 * e and r % 2:  # odd folding rank: sends its data once, gets the sum
        return Cost(n, 1, **path)
    m = r // 2 if r < 2 * e else r - e
    size = lambda a, b: chunk_offset(n, q, b) - chunk_offset(n, q, a)
    sent, lo, hi, d = 0, 0, q, q // 2
    while d >= 1:  # halving: keep one half of [lo, hi), send the other
        mid = (lo + hi) // 2
        (lo, hi), give = ((lo, mid), (mid, hi)) if m & d == 0 else ((mid, hi), (lo, mid))
        sent += size(*give)
        d //= 2
    d = 1
    while d < q:  # doubling: send everything held, get the sibling range
        sent += size(lo, hi)
        width = hi - lo
        other = lo + width if m & d == 0 else lo - width
        lo, hi = min(lo, other), max(hi, other + width)
        d *= 2
    extra = 1 if r < 2 * e else 0  # even folding rank: sends the result up at the end
    return Cost(sent + extra * n, 2 * L + extra, **path)


def tree_allreduce(n: int, p: int, r: int) -> Cost:
    """Binomial reduce to rank 0, binomial broadcast back (collectives/tree.py; Thakur et al. 2005,
    sec. 4): rank r sends the whole buffer to its parent (r != 0) and to each of its c(r) children,
    c(r) = #{k : 2^k > r and r + 2^k < p}. Rank 0 sends ceil(log2 p) * n: the bottleneck."""
    if p == 1:
        return Cost()
    children = sum(1 for k in range(p.bit_length()) if (1 << k) > r and r + (1 << k) < p)
    depth = (p - 1).bit_length()  # ceil(log2 p) rounds each way
    own = (1 if r else 0) + children
    return Cost(own * n, own, reduced=depth * n, rounds=2 * depth, round_elems=2 * depth * n)


def ps_allreduce(n: int, p: int, r: int) -> Cost:
    """Parameter server (Li et al. 2014): workers push n to rank 0 and get n back; rank 0 receives
    and sends (p-1) n through its one link -- the critical path for everybody."""
    if p == 1:
        return Cost()
    path = dict(reduced=(p - 1) * n, rounds=2, round_elems=2 * (p - 1) * n)
    return Cost((p - 1) * n, p - 1, **path) if r == 0 else Cost(n, 1, **path)


def mpi_allreduce(n: int, p: int, r: int) -> Cost:
    """MPI_Allreduce hides its messages; simpar books what the ring would send (marked "modeled").
    For time we take the better of ring and Rabenseifner, as MPICH picks by message size."""
    ring, rab = ring_allreduce(n, p, r), rabenseifner_allreduce(n, p, 0)
    best = rab if rab.rounds < ring.rounds and rab.round_elems <= ring.round_elems else ring
    return Cost(ring.sent, ring.messages, best.reduced, best.rounds, best.round_elems)


ALLREDUCE = {
    "ring": ring_allreduce,
    "rabenseifner": rabenseifner_allreduce,
    "tree": tree_allreduce,
    "ps": ps_allreduce,
    "mpi": mpi_allreduce,
    "auto": ring_allreduce,  # the ring's bytes; its time as NCCL's tuner picks (chunktime.op_time, nccl.py)
}


# -- all-to-alls of pieces of any size (expert parallelism) ------------------------------------------------
# m[s][q]: elements rank s sends rank q, for every s, q of the group (in expert parallelism every rank
# knows them all from the routing histograms). Time: one round after the other, each alpha + its one
# message's bytes x beta, so round_elems is everything the rank sends (simclock charges each message so).


def pairwise_alltoall(m: list[list[float]], p: int, r: int) -> Cost:
    """Pairwise exchange (Thakur et al. 2005, sec. 3.4): round j = 1..p-1 sends m[r][(r+j) % p]
    straight to its owner: sum over q != r of m[r][q], in p-1 messages and rounds."""
    sent = sum(m[r][q] for q in range(p) if q != r)
    return Cost(sent, p - 1, 0, p - 1, sent)


def bruck_alltoall(m: list[list[float]], p: int, r: int) -> Cost:
    """Bruck et al. 1997 (the index algorithm, radix 2): ceil(log2 p) rounds; in round k rank r sends
    rank r + 2^k every piece whose relative destination j (1..p-1) has bit k set. Such a piece has
    made the moves of j's lower bits already, so it left s = r - (j mod 2^k) for s + j (mod p):

        sent = sum_k sum_{j: bit k of j} m[s][(s + j) % p],   s = (r - j mod 2^k) mod p

    Equal pieces m: sum_j popcount(j) m = (p/2) log2 p m for p a power of two (pairwise: (p-1) m)."""
    sent, rounds = 0, 0
    while (1 << rounds) < p:
        hop = 1 << rounds
        for j in range(1, p):
            if j & hop:
                s = (r - j % hop) % p
                sent += m[s][(s + j) % p]
        rounds += 1
    return Cost(sent, rounds, 0, rounds, sent)


ALLTOALL = {"pairwise": pairwise_alltoall, "bruck": bruck_alltoall}


def to_bytes(cost: Cost, elem_bytes: int, times: int = 1) -> Cost:
    """Elements -> bytes (messages and rounds stay counts), `times` repetitions."""
    k = times * elem_bytes
    one = ((cost.rounds, cost.round_elems, cost.reduced, 1),) if cost.rounds else ()
    calls = tuple((r, b * elem_bytes, red * elem_bytes, n * times) for r, b, red, n in cost.calls or one)
    return Cost(
        cost.sent * k,
        cost.messages * times,
        cost.reduced * k,
        cost.rounds * times,
        cost.round_elems * k,
        calls,
    )
