"""Causal multi-head self-attention, every step an explicit forward and backward (Vaswani et al. 2017).

For one sequence of s tokens of width h, with a heads of size d = h / a:

    q = x Wq + bq,  k = x Wk + bk,  v = x Wv + bv          (s, h) each; head j is columns j*d .. (j+1)*d
    S = q_j k_j^T / sqrt(d)                                (s, s) per head: the scores
    P = softmax(S + M)                                     M = -inf above the diagonal: token t sees 0..t
    o_j = P v_j                                            (s, d) per head; the heads side by side: o (s, h)
    y = o Wo + bo

Backward, given dy (G = dL/dS, dP = dL/dP):
    do = dy Wo^T,  dWo = o^T dy,  dbo = sum dy
    dP = do_j v_j^T,  dv_j = P^T do_j
    dS = P * (dP - rowsum(P * dP))                         the softmax's Jacobian contracted with dP
    dq_j = dS k_j / sqrt(d),  dk_j = dS^T q_j / sqrt(d)
    dx = dq Wq^T + dk Wk^T + dv Wv^T  (and dW, db of the three projections as for any linear layer)
Masked entries have P = 0, so dS is 0 there without any further masking.

Why Q, K and V are three matrices and not one (h, 3h): tensor parallelism (Megatron-LM, Shoeybi et
al. 2019, sec. 3) gives each of t ranks a/t WHOLE heads -- columns j*d .. (j+a/t)*d of Wq, Wk and Wv,
and the same rows of Wo -- and attention needs no communication inside a head. With the three kept
apart a rank's share is one column slice of each; `attention_core_*` works on however many heads it
is handed (parallel/tensor_gpt.py).

Precision (--precision mixed-*): the projections run through the kernel backend like every linear
layer (half in, float32 inside, half out); the scores, the softmax and its backward are computed in
float32 from the half q, k, v (exp of half numbers overflows at 11.1 and loses the small
probabilities), and P is kept for backward rounded to half, as Megatron keeps it in its compute type.
tests/unit/model/test_gpt_ops.py checks each function against finite differences in float64.
"""

from __future__ import annotations

import math

import numpy as np

from ..runtime.context import PLAIN
from .mlp import wide


def split_heads(t: np.ndarray, batch: int, seq: int, heads: int) -> np.ndarray:
    """(batch*seq, heads*d) -> (batch, heads, seq, d): head j is columns j*d .. (j+1)*d."""
    d = t.shape[1] // heads
    return t.reshape(batch, seq, heads, d).transpose(0, 2, 1, 3)


def merge_heads(t: np.ndarray) -> np.ndarray:
    """(batch, heads, seq, d) -> (batch*seq, heads*d), the inverse of split_heads (a fresh array)."""
    b, a, s, d = t.shape
    return np.ascontiguousarray(t.transpose(0, 2, 1, 3)).reshape(b * s, a * d)


def causal_softmax(scores: np.ndarray) -> np.ndarray:
    """Row-wise softmax of (..., s, s) scores with every position after the row's own masked out.
    Subtracting the row's maximum first keeps exp from overflowing (the result is unchanged)."""
    s = scores.shape[-1]
    future = np.triu(np.ones((s, s), dtype=bool), k=1)
    masked = np.where(future, -np.inf, scores)
    e = np.exp(masked - masked.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def causal_softmax_backward(dprobs: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """dL/dscores = P * (dP - rowsum(P * dP)); masked entries have P = 0 and get 0."""
    return probs * (dprobs - (probs * dprobs).sum(axis=-1, keepdims=True))


def attention_core_forward(q, k, v):
    """(o, P) for per-head q, k, v of shape (batch, heads, s, d). Half inputs: float32 inside, P and o
    rounded back to the input's type."""
    half = q.dtype
    qf, kf, vf = wide(q), wide(k), wide(v)
    scale = qf.dtype.type(1 / math.sqrt(q.shape[-1]))
    probs = causal_softmax((qf @ kf.transpose(0, 1, 3, 2)) * scale).astype(half, copy=False)
    o = (wide(probs) @ vf).astype(half, copy=False)
    return o, probs


def attention_core_backward(do, q, k, v, probs):
    """(dq, dk, dv) from dL/do; every product in float32 for half inputs, the results rounded back."""
    half = do.dtype
    dof, qf, kf, vf, pf = map(wide, (do, q, k, v, probs))
    scale = qf.dtype.type(1 / math.sqrt(q.shape[-1]))
    dv = pf.transpose(0, 1, 3, 2) @ dof
    dscores = causal_softmax_backward(dof @ vf.transpose(0, 1, 3, 2), pf) * scale
    dq = dscores @ kf
    dk = dscores.transpose(0, 1, 3, 2) @ qf
    return tuple(a.astype(half, copy=False) for a in (dq, dk, dv))


class AttentionContext:
    """What forward keeps for backward: the projections' input x, the per-head q, k, v, the softmax
    output P and the merged heads o (Wo's input). In Korthikanti et al. 2022's terms (Table 1's
    attention block, less their dropout): x, q, k, v and o are sbh elements each, P is a s^2 b."""

    def __init__(self, x, q, k, v, probs, o):
        self.x, self.q, self.k, self.v, self.probs, self.o = x, q, k, v, probs, o

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.x, self.q, self.k, self.v, self.probs, self.o))


def self_attention_forward(x, params, batch: int, seq: int, heads: int, kern=None):
    """y = attention(x) for x (batch*seq, h); params = (Wq, bq, Wk, bk, Wv, bv, Wo, bo) holding
    `heads` heads (all of them, or a tensor-parallel rank's share). Returns (y, AttentionContext)."""
    Wq, bq, Wk, bk, Wv, bv, Wo, bo = params
    k_ = kern or PLAIN.kernels  # the run's kernels (gpt.py's units pass them)
    q, k, v = (
        split_heads(k_.linear_act_forward(x, W, b, "none")[0], batch, seq, heads)
        for W, b in ((Wq, bq), (Wk, bk), (Wv, bv))
    )
    o, probs = attention_core_forward(q, k, v)
    o = merge_heads(o)
    y, _ = k_.linear_act_forward(o, Wo, bo, "none")
    return y, AttentionContext(x, q, k, v, probs, o)


def self_attention_backward(dy, ctx: AttentionContext, params, grads, kern=None):
    """dL/dx, with dWq, dbq, ..., dWo, dbo ADDED into `grads` (same order as params: micro-steps add up)."""
    Wq, bq, Wk, bk, Wv, bv, Wo, bo = params
    k_ = kern or PLAIN.kernels  # the run's kernels (gpt.py's units pass them)
    do, gWo, gbo = k_.linear_act_backward(dy, ctx.o, Wo, dy, dy, "none", True)  # z, y: unused for "none"
    b, a, s, d = ctx.q.shape
    dq, dk, dv = attention_core_backward(split_heads(do, b, s, a), ctx.q, ctx.k, ctx.v, ctx.probs)
    dx = None
    new = [None] * 6
    for j, (W, dh) in enumerate(((Wq, dq), (Wk, dk), (Wv, dv))):
        dz = merge_heads(dh)
        dpart, new[2 * j], new[2 * j + 1] = k_.linear_act_backward(dz, ctx.x, W, dz, dz, "none", True)
        dx = dpart if dx is None else dx + dpart
    for acc, g in zip(grads, (*new, gWo, gbo)):
        acc += g
    return dx
