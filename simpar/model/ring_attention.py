"""Attention one block of keys at a time: the math of ring attention, no MPI (parallel/context.py moves
the blocks).

Context parallelism (--cp C) cuts every sequence of s tokens into 2C chunks of m = s/(2C) and gives
rank r chunks r and 2C-1-r (an early and a late one, so that every rank has the same causal work: the
split Megatron's CP and Llama 3 use). A rank's queries then meet keys that live on other ranks, one
block (a chunk's K and V) at a time, and the softmax over a row must be built without ever holding the
row whole. The online softmax does it (Milakov & Gimelshein 2018, "Online normalizer calculation for
softmax"; FlashAttention, Dao et al. 2022, Algorithm 1; ring attention, Liu et al. 2023): per query row
keep the running maximum M, the running sum l of exp(S - M) and the unnormalised output A; a new block
of scores S_b with values V_b updates them as

    M' = max(M, rowmax S_b);   c = exp(M - M');   P_b = exp(S_b - M')
    l' = c l + rowsum P_b;     A' = c A + P_b V_b

(the rescale by c is what keeps the earlier blocks' terms right when the maximum grows). At the end
o = A / l and the log-sum-exp lse = M + log l, which is all backward needs of the softmax: for any
block, P_b = exp(S_b - lse) again, and with D = rowsum(dO * o) (= rowsum(P * dP) of the whole row)

    dV_b = P_b^T dO,   dP_b = dO V_b^T,   dS_b = P_b * (dP_b - D),   dQ += dS_b K_b / sqrt(d),
    dK_b = dS_b^T Q / sqrt(d)

the same products as attention.py's, one block at a time (FlashAttention-2, Dao 2023, Algorithm 2).
Only the blocks the causal mask needs are computed: a key chunk after the query chunk is skipped, the
chunk itself is masked above its diagonal, an earlier chunk is used whole.

Numbers: every product in the inputs' wide type (float32 for half inputs, float64 for float64), the
results rounded back as attention.py does.
"""

from __future__ import annotations

import math

import numpy as np

from .mlp import wide


def block_relation(q_chunk: int, k_chunk: int) -> str | None:
    """'full' (the key chunk is earlier), 'diagonal' (the same chunk: causal mask) or None (later: skip)."""
    if k_chunk < q_chunk:
        return "full"
    return "diagonal" if k_chunk == q_chunk else None


def _scores(q, k, relation: str):
    """Scaled scores (b, a, n, n) of one block, -inf above the diagonal of a 'diagonal' block."""
    scores = (q @ k.transpose(0, 1, 3, 2)) * q.dtype.type(1 / math.sqrt(q.shape[-1]))
    if relation == "diagonal":
        n = scores.shape[-1]
        scores = np.where(np.triu(np.ones((n, n), dtype=bool), k=1), -np.inf, scores)
    return scores


class OnlineSoftmax:
    """The running (M, l, A) of one chunk of query rows, q (b, a, n, d) in its wide type."""

    def __init__(self, q):
        self.q = wide(q)
        shape = q.shape[:-1]
        self.M = np.full(shape, -np.inf, self.q.dtype)
        self.l = np.zeros(shape, self.q.dtype)
        self.A = np.zeros(q.shape, self.q.dtype)

    def add_block(self, k, v, relation: str) -> None:
        scores = _scores(self.q, wide(k), relation)
        M_new = np.maximum(self.M, scores.max(axis=-1))
        rescale = np.exp(self.M - M_new)  # exp(-inf) = 0 before the first block: nothing to rescale
        P = np.exp(scores - M_new[..., None])
        self.l = rescale * self.l + P.sum(axis=-1)
        self.A = rescale[..., None] * self.A + P @ wide(v)
        self.M = M_new

    def finish(self, dtype):
        """(o in `dtype`, lse in the wide type): every row saw at least its own diagonal block."""
        o = self.A / self.l[..., None]
        return o.astype(dtype, copy=False), self.M + np.log(self.l)


def block_backward(q, k, v, do, lse, D, relation: str):
    """(dq, dk, dv) contributions of one block, in the wide type: P rebuilt from the saved lse."""
    qf, kf, vf, dof = map(wide, (q, k, v, do))
    P = np.exp(_scores(qf, kf, relation) - lse[..., None])  # masked entries: exp(-inf) = 0
    scale = qf.dtype.type(1 / math.sqrt(q.shape[-1]))
    dv = P.transpose(0, 1, 3, 2) @ dof
    dS = P * (dof @ vf.transpose(0, 1, 3, 2) - D[..., None]) * scale
    return dS @ kf, dS.transpose(0, 1, 3, 2) @ qf, dv


def chunk_positions(rank: int, C: int, s: int) -> np.ndarray:
    """Global positions of rank `rank`'s tokens: chunk rank, then chunk 2C-1-rank, m = s/(2C) each."""
    m = s // (2 * C)
    return np.r_[rank * m : (rank + 1) * m, (2 * C - 1 - rank) * m : (2 * C - rank) * m]
