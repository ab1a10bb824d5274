"""Every rank of a data-parallel group through every round of its gradient buckets' all-reduces.

steptime.dp_end prices one rank's buckets with that rank's own critical path (collectives.ALLREDUCE).
That is exact while the ranks are alike; it is not when p does not divide a bucket (np.array_split's
chunks differ by an element, so a ring round waits on the neighbour's bigger chunk), when the ranks'
backward passes end at different times (uneven rows), or when the algorithm's rounds are not the same
for every rank (a binomial tree on p = 3: the root takes in two messages through its one port in the
same round; the parameter server: ps_time.py). Then the closed form follows every rank, as
gpt_zero_time.py does for ZeRO's rings, with the simulated clock's rules written down again (nothing
imported from runtime/ or collectives/):

  * a collective starts on a rank when it was started there and the previous one on the group's
    stream has ended; each round's sends leave one after another through the rank's one outgoing
    port (bytes / bw each) and arrive alpha later; the messages a round receives come in one after
    another through its one incoming port, in the order they left (simclock.receive_round);
  * a round ends when its own sends have left and its receives have arrived; then what it received
    is added in (bytes x gamma; 0 on GPUs, where the copy reduces).

The rounds are the algorithms' own (collectives/tree.py, rabenseifner.py): tree_rounds and
rabenseifner_rounds below say which rank sends what to whom. The ring goes through
moe_rounds.ring_allreduce_ends (NCCL's protocol for the call on GPU profiles), the parameter server
through ps_time.ps_bucket_ends.
"""

from __future__ import annotations

from .collectives import chunk_offset
from .moe_rounds import ring_allreduce_ends
from .ps_time import ps_bucket_ends


def tree_rounds(p: int, r: int, nbytes: float) -> list:
    """Rank r's rounds of a binomial-tree all-reduce (collectives/tree.py), each (sends, receives,
    bytes added after it), a message as (peer, bytes): reduce towards rank 0 for d = 2^(ceil(log2 p)-1)
    .. 1 (rank r < d takes in r + d's subtree, d <= r < 2d sends its own to r - d), then the binomial
    broadcast back from rank 0 for d = 1, 2, .. (r < d sends on to r + d, d <= r < 2d receives)."""
    rounds, d = [], 1 << ((p - 1).bit_length() - 1)
    while d >= 1:
        if r < d and r + d < p:
            rounds.append(([], [(r + d, nbytes)], nbytes))
        elif d <= r < 2 * d:
            rounds.append(([(r - d, nbytes)], [], 0.0))
        d //= 2
    d = 1
    while d < p:
        if r < d and r + d < p:
            rounds.append(([(r + d, nbytes)], [], 0.0))
        elif d <= r < 2 * d:
            rounds.append(([], [(r - d, nbytes)], 0.0))
        d *= 2
    return rounds


def rabenseifner_rounds(p: int, r: int, n: int, bpe: int) -> list:
    """Rank r's rounds of Rabenseifner's all-reduce of n elements (collectives/rabenseifner.py): q the
    largest power of two <= p, e = p - q; odd ranks below 2e hand their data to the even one below and
    wait for the sum; the q others (renumbered m) halve their range of q blocks (np.array_split of n),
    exchanging with m XOR d for d = q/2 .. 1 and adding what they keep, then double it back."""
    q = 1 << (p.bit_length() - 1)
    e, whole = p - q, n * bpe
    if r < 2 * e and r % 2:
        return [([(r - 1, whole)], [], 0.0), ([], [(r - 1, whole)], 0.0)]
    rounds = [([], [(r + 1, whole)], whole)] if r < 2 * e else []
    m = r // 2 if r < 2 * e else r - e
    peer = lambda v: 2 * v if v < e else v + e  # noqa: E731  (renumbered rank -> rank in the group)
    size = lambda a, b: (chunk_offset(n, q, b) - chunk_offset(n, q, a)) * bpe  # noqa: E731  (blocks a..b)
    lo, hi, d = 0, q, q // 2
    while d >= 1:
        mid = (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if m & d == 0 else ((mid, hi), (lo, mid))
        rounds.append(([(peer(m ^ d), size(*give))], [(peer(m ^ d), size(*keep))], size(*keep)))
        (lo, hi), d = keep, d // 2
    d = 1
    while d < q:
        width = hi - lo
        other = lo + width if m & d == 0 else lo - width
        rounds.append(([(peer(m ^ d), size(lo, hi))], [(peer(m ^ d), size(other, other + width))], 0.0))
        lo, hi, d = min(lo, other), max(hi, other + width), d * 2
    if r < 2 * e:
        rounds.append(([(r + 1, whole)], [], 0.0))
    return rounds


def follow(plans: list, starts: list, link, gamma: float) -> list:
    """When each rank ends its rounds (`plans[r]`: tree_rounds' form), rank r starting at starts[r]
    (its outgoing port is free by then: each round waits for its own sends); the module docstring's rules."""
    p = len(plans)
    t, free, pos, posted = list(starts), list(starts), [0] * p, [False] * p
    wires: dict = {}  # (src, dst) -> [(transfer start, arrival), ...] in the order they were sent
    taken: dict = {}  # (src, dst) -> how many of them have been received
    while any(pos[r] < len(plans[r]) for r in range(p)):
        moved = False
        for r in range(p):
            while pos[r] < len(plans[r]):
                sends, receives, added = plans[r][pos[r]]
                if not posted[r]:  # the round's sends leave as it starts, before it waits for anything
                    left = []
                    for dst, nbytes in sends:
                        depart = max(t[r], free[r])
                        free[r] = depart + nbytes / link.bw
                        wires.setdefault((r, dst), []).append((depart, free[r] + link.alpha))
                        left.append(free[r])
                    posted[r], t[r], moved = True, max([t[r], *left]), True
                if any(len(wires.get((src, r), [])) <= taken.get((src, r), 0) for src, _ in receives):
                    break  # a peer has not sent yet: let the others move
                arrivals = []
                for src, _ in receives:
                    arrivals.append(wires[src, r][taken.get((src, r), 0)])
                    taken[src, r] = taken.get((src, r), 0) + 1
                data_end = float("-inf")
                for start, arrival in sorted(arrivals):  # one incoming port: in the order they left
                    wire = arrival - link.alpha - start
                    data_end = max(start + wire, data_end + wire)
                    t[r] = max(t[r], data_end + link.alpha)
                t[r] += added * gamma
                pos[r], posted[r], moved = pos[r] + 1, False, True
        if not moved:
            raise ValueError("rounds that wait on a message nobody sends")
    return t


def allreduce_ends(algorithm: str, n: int, bpe: int, starts: list, link, gamma: float) -> list:
    """When each rank of the group ends one blocking all-reduce of n elements it starts at starts[r]."""
    p = len(starts)
    if algorithm in ("ring", "auto"):  # auto: the ring's rounds, at the protocol NCCL's tuner picks
        return ring_allreduce_ends(n, bpe, starts, link, gamma, nvls=algorithm == "auto")
    if algorithm == "ps":
        return ps_bucket_ends([[s] for s in starts], [n * bpe], link, gamma)
    if algorithm == "tree":
        return follow([tree_rounds(p, r, n * bpe) for r in range(p)], starts, link, gamma)
    return follow([rabenseifner_rounds(p, r, n, bpe) for r in range(p)], starts, link, gamma)


def bucket_ends(algorithm: str, starts: list, bucket_elems: list, bpe: int, link, gamma: float) -> list:
    """Each rank's end of its last bucket's all-reduce: `starts[r][k]` when rank r may start bucket k
    (its layers' gradients are ready), one bucket after another on the dp stream (a bucket starts on a
    rank when the last one ended there: ps_time.py's rule too); `bucket_elems[k]`: its elements."""
    ends = [float("-inf")] * len(starts)
    for k, n in enumerate(bucket_elems):
        ends = allreduce_ends(algorithm, n, bpe, [max(s[k], e) for s, e in zip(starts, ends)], link, gamma)
    return ends


def ddp_steps(spec, hw, links: dict, stages_of: dict, timed: dict, starts: list) -> dict:
    """The MLP's step (steptime.step_time per dp index d: `timed[d]`, from `stages_of[d]`, data ready at
    `starts`) again, each stage's DDP buckets followed on every dp rank of the stage together
    (bucket_ends) instead of on each rank's own critical path. No ZeRO (its collectives block)."""
    from .chunktime import collective_gamma
    from .steptime import step_time

    streams = {d: [0.0] * spec.pp for d in timed}
    for s in range(spec.pp):
        elems = timed[0]["dp_elems"][s]
        if elems:
            ready = [timed[d]["dp_ready"][s] for d in range(spec.dp)]
            ends = bucket_ends(
                spec.collectives, ready, elems, spec.prec.grad, links["dp"], collective_gamma(hw)
            )
            for d in timed:
                streams[d][s] = ends[d]
    return {d: step_time(spec, hw, links, stages_of[d], 0.0, starts, streams[d]) for d in timed}
