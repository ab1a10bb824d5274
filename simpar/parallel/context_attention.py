"""Attention when a rank holds only some of every sequence's tokens: ring and all-to-all (Ulysses).

Rank r of the cp group (C ranks) holds chunks r and 2C-1-r of the 2C chunks of m = s/(2C) tokens
(model/ring_attention.py), n = 2m = s/C tokens of each of its b sequences; its q, k, v are
(b, a, n, d). Everything is booked as `activation` traffic.

--cp-algo ring (Liu et al. 2023, "Ring Attention with Blockwise Transformers"; Megatron's CP): the K and
V of a rank -- one message of 2 x b x n x h elements -- go around the cp ring, rank r sending to r+1
and receiving from r-1; at hop t rank r holds rank (r-t)'s block and adds the causally needed parts of
it to its online softmax. The next block's receive and the current block's send are posted BEFORE the
block is computed (non-blocking), so each hop's transfer overlaps the block it computes.
    forward:  C-1 hops of K,V                           2 (C-1) b n h elements sent per rank
    backward: C-1 hops of K,V again, and dK,dV partial sums travelling with them: a block's partial
              sum starts on rank r+1 (rank r keeps its own part), visits r+2 .. r+C-1 and goes home
              from r+C-1 -- C-1 sends of 2 b n h               4 (C-1) b n h elements sent per rank
All under the op `cp-kv`, per block per step; nothing of the sort for C = 1.

--cp-algo ulysses (Jacobs et al. 2023, "DeepSpeed Ulysses"): an all-to-all over the cp group turns q, k
and v from (all a heads, my n tokens) into (my a/C heads, all s tokens), attention runs on whole
sequences for a/C heads (attention.py's core: the same numbers as serial), and an all-to-all turns the
output back. Backward: the same four in reverse (dO in; dQ, dK, dV back). Each all-to-all sends
(C-1)/C of the rank's b n h elements (collectives/alltoall.py, pairwise):
    forward 4 (C-1)/C b n h, backward 4 (C-1)/C b n h elements per rank, op `cp-alltoall`.
"""

from __future__ import annotations

import numpy as np

from ..collectives.alltoall import alltoall
from ..model.attention import attention_core_backward, attention_core_forward, merge_heads, split_heads
from ..model.mlp import wide
from ..model.ring_attention import OnlineSoftmax, block_backward, block_relation

CATEGORY = "activation"
TAG = 7301  # one constant tag: a pair's ring messages arrive in the order they were sent (MPI's rule)

# What the attention charges the simulated clock (--clock sim; costmodel/cp_time.py writes it again).
# A ring block is m query rows against m keys of every head: forward q k^T and P v (2 b m^2 h FLOPs
# each) and 6 sweeps over its b a m^2 scores (the serial softmax's, gpt.py); backward P rebuilt from
# the lse, dV, dP, dQ, dK (5 products) and 6 sweeps (exp(S - lse), dS = P (dP - D), the mask and
# scale). A diagonal block is computed whole, then masked: it costs what a full one does. Ulysses'
# core is the serial attention of a/C heads over all s tokens: 2 products and 6 sweeps forward, 4
# and 4 backward (gpt.charge_block's).
RING_FWD_PRODUCTS, RING_FWD_SWEEPS, RING_BWD_PRODUCTS, RING_BWD_SWEEPS = 2, 6, 5, 6
CORE_FWD_PRODUCTS, CORE_FWD_SWEEPS, CORE_BWD_PRODUCTS, CORE_BWD_SWEEPS = 2, 6, 4, 4


def _charge(comm, blocks: int, rows: int, h: int, keys: int, scores: int, products: int, sweeps: int, bpe):
    """`blocks` blocks of `rows` query rows x `keys` keys (every head: 2 rows h keys FLOPs a product),
    `scores` score elements each, on the simulated clock if one runs."""
    clock = comm.runtime.clock
    for _ in range(blocks if clock is not None else 0):
        for _ in range(products):
            clock.matmul(rows, h, keys)
        clock.stream(sweeps * scores * bpe)


def _charge_ring(comm, q, blocks: int, backward: bool) -> None:
    """This hop's causal blocks of m = n/2 query rows of q (b, a, n, d): charged after they are computed
    and before the hop's transfers are waited for, so the clock overlaps the two (module docstring)."""
    b, a, n, d = q.shape
    m = n // 2
    charges = (RING_BWD_PRODUCTS, RING_BWD_SWEEPS) if backward else (RING_FWD_PRODUCTS, RING_FWD_SWEEPS)
    _charge(comm, blocks, b * m, a * d, m, b * a * m * m, *charges, q.itemsize)


def _chunks(rank: int, C: int) -> tuple[int, int]:
    return rank, 2 * C - 1 - rank


def _hop(comm, send_buf, recv_like, op):
    """Post the receive from r-1 into a fresh buffer and the send to r+1; returns (requests, buffer)."""
    p, r = comm.size, comm.rank
    fresh = np.empty_like(recv_like)
    reqs = [
        comm.irecv(fresh, (r - 1) % p, CATEGORY, op, TAG),
        comm.isend(send_buf, (r + 1) % p, CATEGORY, op, TAG),
    ]
    return reqs, fresh


def ring_forward(comm, q, k, v):
    """(o (b, a, n, d), lse (b, a, n)): causal attention of this rank's queries over every rank's keys."""
    C, r = comm.size, comm.rank
    m = q.shape[2] // 2
    mine = _chunks(r, C)
    halves = [OnlineSoftmax(q[:, :, :m]), OnlineSoftmax(q[:, :, m:])]
    kv = np.ascontiguousarray(np.stack((k, v)))  # one message: K and V of both my chunks
    for t in range(C):
        reqs, nxt = _hop(comm, kv, kv, "cp-kv") if t < C - 1 else ([], None)
        theirs = _chunks((r - t) % C, C)
        blocks = 0
        for qi, state in enumerate(halves):
            for ki in range(2):
                relation = block_relation(mine[qi], theirs[ki])
                if relation is not None:
                    state.add_block(
                        kv[0][:, :, ki * m : (ki + 1) * m], kv[1][:, :, ki * m : (ki + 1) * m], relation
                    )
                    blocks += 1
        _charge_ring(comm, q, blocks, backward=False)  # the blocks, while the next K, V travel
        comm.waitall(reqs)
        kv = nxt
    outs = [state.finish(q.dtype) for state in halves]
    return np.concatenate([o for o, _ in outs], axis=2), np.concatenate([lse for _, lse in outs], axis=2)


def ring_backward(comm, do, q, k, v, o, lse):
    """(dq, dk, dv) of ring_forward, dK/dV partial sums sent around the ring and home (see the docstring)."""
    C, r = comm.size, comm.rank
    m = q.shape[2] // 2
    mine = _chunks(r, C)
    D = (wide(do) * wide(o)).sum(axis=-1)  # rowsum(dO * o) = rowsum(P * dP) over the whole row
    dq = np.zeros(q.shape, D.dtype)
    kv = np.ascontiguousarray(np.stack((k, v)))
    own = np.zeros((2, *k.shape), D.dtype)  # my block's dK, dV from my own queries
    dkv = own
    for t in range(C):
        reqs, nxt = _hop(comm, kv, kv, "cp-kv") if t < C - 1 else ([], None)
        recv_dkv = None
        if t >= 1:  # the partial sum for the next hop's block (or, at t = C-1, my own coming home)
            recv_dkv = np.empty_like(dkv)
            reqs.append(comm.irecv(recv_dkv, (r - 1) % C, CATEGORY, "cp-kv", TAG + 1))
        theirs = _chunks((r - t) % C, C)
        blocks = 0
        for qi in range(2):
            rows = slice(qi * m, (qi + 1) * m)
            for ki in range(2):
                relation = block_relation(mine[qi], theirs[ki])
                if relation is None:
                    continue
                blocks += 1
                cols = slice(ki * m, (ki + 1) * m)
                gq, gk, gv = block_backward(
                    q[:, :, rows],
                    kv[0][:, :, cols],
                    kv[1][:, :, cols],
                    do[:, :, rows],
                    lse[:, :, rows],
                    D[:, :, rows],
                    relation,
                )
                dq[:, :, rows] += gq
                dkv[0][:, :, cols] += gk
                dkv[1][:, :, cols] += gv
        _charge_ring(comm, q, blocks, backward=True)  # before the partial sum leaves: it waits for them
        if t >= 1:  # pass this block's partial sum on (at the last hop: to its owner, r+1)
            reqs.append(comm.isend(dkv, (r + 1) % C, CATEGORY, "cp-kv", TAG + 1))
        comm.waitall(reqs)
        kv = nxt
        dkv = recv_dkv if t >= 1 else np.zeros_like(own)
    if C > 1:
        own += dkv  # the others' contributions to my block, home after C-1 hops
    cast = q.dtype
    return dq.astype(cast, copy=False), own[0].astype(cast, copy=False), own[1].astype(cast, copy=False)


# -- Ulysses: sequence shard <-> head shard ----------------------------------------------------------


def _exchange(comm, pieces):
    """All-to-all of equal pieces (any shape): piece j to rank j; returns the piece from each rank."""
    flat = [np.ascontiguousarray(p).reshape(1, -1) for p in pieces]
    ones = [[1] * comm.size for _ in range(comm.size)]
    got = alltoall(comm, flat, ones, CATEGORY, "cp-alltoall")
    return [g.reshape(pieces[0].shape) for g in got]


def seq_to_heads(comm, t, s: int):
    """(b, a, n, d) my tokens, all heads -> (b, a/C, s, d) all tokens, my heads (global order)."""
    C = comm.size
    b, a, n, d = t.shape
    g, m = a // C, n // 2
    got = _exchange(comm, [t[:, j * g : (j + 1) * g] for j in range(C)])
    out = np.empty((b, g, s, d), t.dtype)
    for j, piece in enumerate(got):
        for half, chunk in enumerate(_chunks(j, C)):
            out[:, :, chunk * m : (chunk + 1) * m] = piece[:, :, half * m : (half + 1) * m]
    return out


def heads_to_seq(comm, t):
    """(b, a/C, s, d) all tokens, my heads -> (b, a, n, d) my tokens, all heads; seq_to_heads' inverse."""
    C = comm.size
    b, g, s, d = t.shape
    m = s // (2 * C)
    pieces = [np.concatenate([t[:, :, c * m : (c + 1) * m] for c in _chunks(j, C)], axis=2) for j in range(C)]
    return np.concatenate(_exchange(comm, pieces), axis=1)


def _charge_core(comm, qh, products: int, sweeps: int) -> None:
    """The attention of my a/C heads over all s tokens, qh (b, a/C, s, d); its all-to-alls block."""
    b, g, s, d = qh.shape
    _charge(comm, 1, b * s, g * d, s, b * g * s * s, products, sweeps, qh.itemsize)


def ulysses_forward(comm, q, k, v, s: int):
    """(o (b, a, n, d), (qh, kh, vh, P)) -- attention on whole sequences for a/C heads."""
    qh, kh, vh = (seq_to_heads(comm, t, s) for t in (q, k, v))
    oh, probs = attention_core_forward(qh, kh, vh)
    _charge_core(comm, qh, CORE_FWD_PRODUCTS, CORE_FWD_SWEEPS)
    return heads_to_seq(comm, oh), (qh, kh, vh, probs)


def ulysses_backward(comm, do, saved, s: int):
    qh, kh, vh, probs = saved
    dqh, dkh, dvh = attention_core_backward(seq_to_heads(comm, do, s), qh, kh, vh, probs)
    _charge_core(comm, qh, CORE_BWD_PRODUCTS, CORE_BWD_SWEEPS)
    return tuple(heads_to_seq(comm, g) for g in (dqh, dkh, dvh))


# -- the attention layer around them: projections on my tokens, the core over the cp group ---------


def cp_core_backward(comm, algo: str, do, ctx, heads: int, s: int):
    """(dq, dk, dv) merged to (b n, h) from do = dL/do (b n, h): the attention core's backward over the
    cp group -- the ring's K/V hops and dK/dV partial sums, or Ulysses' four all-to-alls. The zero-
    bubble B pass calls it alone (model/gpt_split.py): all of the cp traffic belongs to B."""
    b = ctx.saved[0].shape[0]  # q (ring) or my heads' q (Ulysses): (b, ., ., d)
    n = ctx.x.shape[0] // b
    if algo == "ring":
        q, k, v, lse = ctx.saved
        o = split_heads(ctx.o, b, n, heads)
        grads = ring_backward(comm, split_heads(do, b, n, heads), q, k, v, o, lse)
    else:
        grads = ulysses_backward(comm, split_heads(do, b, n, heads), ctx.saved, s)
    return tuple(merge_heads(g) for g in grads)


class CPAttentionContext:
    """Kept for backward: the input x, the merged output o (Wo's input), and the core's own:
    ring (q, k, v, lse) -- no score matrix at all; ulysses (q, k, v of my heads on all tokens, P)."""

    def __init__(self, x, saved, o):
        self.x, self.saved, self.o = x, saved, o

    @property
    def nbytes(self) -> int:
        return self.x.nbytes + self.o.nbytes + sum(a.nbytes for a in self.saved)

    def drop_softmax(self) -> None:
        """--recompute selective: drop the softmax's part (ring: the log-sum-exp, a n per sequence in
        the wide type; Ulysses: P of my heads, a s n), keep every per-token array (rebuild_softmax)."""
        *kept, stats = self.saved
        self.saved = (*kept, np.empty(0, stats.dtype))


def rebuild_softmax(comm, algo: str, ctx: CPAttentionContext) -> None:
    """What drop_softmax dropped, again, before the block's backward. The ring has no score matrix to
    rebuild alone: its lse needs every key block, so the ring's forward runs again from the kept q, k,
    v -- its C-1 K/V hops are sent (and booked, `cp-kv`) again, its blocks charged again; the o it
    returns equals the kept one (same inputs, same order) and is let go. Ulysses keeps its heads' q
    and k on all s tokens, so P = softmax(q k^T) is rebuilt locally, no message (gpt_recompute.py)."""
    if algo == "ring":
        q, k, v, _ = ctx.saved
        ctx.saved = (q, k, v, ring_forward(comm, q, k, v)[1])
        return
    from .pipeline.gpt_recompute import softmax_probs  # the forward's own P, bit for bit

    qh, kh, vh, _ = ctx.saved
    ctx.saved = (qh, kh, vh, softmax_probs(qh, kh))
    clock = comm.runtime.clock
    if clock is not None:  # q k^T per head of mine: (s x d) @ (d x s), b * a/C of them
        b, g, s, d = qh.shape
        for _ in range(b * g):
            clock.matmul(s, d, s)


def cp_attention_forward(comm, algo: str, x, params, batch: int, n: int, heads: int, s: int, kern):
    Wq, bq, Wk, bk, Wv, bv, Wo, bo = params
    q, k, v = (
        split_heads(kern.linear_act_forward(x, W, b, "none")[0], batch, n, heads)
        for W, b in ((Wq, bq), (Wk, bk), (Wv, bv))
    )
    if algo == "ring":
        oh, lse = ring_forward(comm, q, k, v)
        saved = (q, k, v, lse)
    else:
        oh, saved = ulysses_forward(comm, q, k, v, s)
    o = merge_heads(oh)
    y, _ = kern.linear_act_forward(o, Wo, bo, "none")
    return y, CPAttentionContext(x, saved, o)


def cp_attention_backward(
    comm, algo: str, dy, ctx: CPAttentionContext, params, grads, heads: int, s: int, kern
):
    Wq, bq, Wk, bk, Wv, bv, Wo, bo = params
    do, gWo, gbo = kern.linear_act_backward(dy, ctx.o, Wo, dy, dy, "none", True)
    dx, new = None, []
    for W, dz in zip((Wq, Wk, Wv), cp_core_backward(comm, algo, do, ctx, heads, s)):
        dpart, gW, gb = kern.linear_act_backward(dz, ctx.x, W, dz, dz, "none", True)
        new += [gW, gb]
        dx = dpart if dx is None else dx + dpart
    for acc, g in zip(grads, (*new, gWo, gbo)):
        acc += g
    return dx
