"""Every op of --arch gpt against central finite differences in float64 (no MPI, a few seconds).

For an op y = f(inputs, params) and a fixed random upstream gradient G, the scalar l = sum(G * y) has
dl/dinput = the op's backward applied to G. Each check perturbs every element of a small input by
+-eps and compares (l(+) - l(-)) / 2 eps with the backward's number (float64: agreement ~1e-8).
"""

from __future__ import annotations

import numpy as np
import pytest

from simpar.model.attention import (
    attention_core_backward,
    attention_core_forward,
    causal_softmax,
    causal_softmax_backward,
    merge_heads,
    self_attention_backward,
    self_attention_forward,
    split_heads,
)
from simpar.model.gpt import BlockUnit, EmbeddingUnit, HeadUnit, gpt_logits
from simpar.model.gpt_build import gpt_units
from simpar.model.mlp import softmax_cross_entropy

B, S, H, A, V = 2, 5, 8, 2, 11
EPS = 1e-6


def numeric_grad(f, x):
    """d f / d x by central differences, element by element (x is perturbed in place, then restored)."""
    g = np.zeros_like(x)
    flat, gflat = x.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + EPS
        up = f()
        flat[i] = old - EPS
        down = f()
        flat[i] = old
        gflat[i] = (up - down) / (2 * EPS)
    return g


def close(analytic, numeric):
    scale = max(1.0, np.abs(numeric).max())
    np.testing.assert_allclose(analytic, numeric, rtol=0, atol=1e-7 * scale)


def rng(k=0):
    return np.random.default_rng(k)


def test_heads_split_and_merge_are_inverse():
    x = rng().standard_normal((B * S, H))
    heads = split_heads(x, B, S, A)
    assert heads.shape == (B, A, S, H // A)
    np.testing.assert_array_equal(heads[1, 1, 3], x[1 * S + 3, H // A :])  # head 1 is columns d..2d
    np.testing.assert_array_equal(merge_heads(heads), x)


def test_causal_softmax_forward_and_backward():
    scores = rng(1).standard_normal((B, A, S, S))
    P = causal_softmax(scores)
    above = np.triu_indices(S, 1)
    assert np.allclose(P.sum(-1), 1) and np.all(P[..., above[0], above[1]] == 0)
    G = rng(2).standard_normal(P.shape)
    close(causal_softmax_backward(G, P), numeric_grad(lambda: (G * causal_softmax(scores)).sum(), scores))


def test_attention_core_backward():
    q, k, v = (rng(i).standard_normal((B, A, S, H // A)) for i in (3, 4, 5))
    G = rng(6).standard_normal((B, A, S, H // A))
    o, P = attention_core_forward(q, k, v)
    dq, dk, dv = attention_core_backward(G, q, k, v, P)
    loss = lambda: (G * attention_core_forward(q, k, v)[0]).sum()  # noqa: E731
    for analytic, x in ((dq, q), (dk, k), (dv, v)):
        close(analytic, numeric_grad(loss, x))


def test_attention_is_causal():
    """Changing token t's key and value changes no output before t."""
    q, k, v = (rng(i).standard_normal((1, A, S, H // A)) for i in (7, 8, 9))
    o, _ = attention_core_forward(q, k, v)
    k2, v2 = k.copy(), v.copy()
    k2[:, :, 3] += 1.0
    v2[:, :, 3] -= 1.0
    o2, _ = attention_core_forward(q, k2, v2)
    np.testing.assert_array_equal(o2[:, :, :3], o[:, :, :3])
    assert not np.allclose(o2[:, :, 3:], o[:, :, 3:])


def test_softmax_is_float32_under_half_precision():
    """Scores of 20 overflow float16's exp (max 65504 = e^11.1); the float32 softmax does not."""
    q = np.full((1, 1, 3, 4), 3.0, np.float16)
    o, P = attention_core_forward(q, q, q)
    assert P.dtype == np.float16 and o.dtype == np.float16
    assert np.all(np.isfinite(P)) and np.allclose(P.astype(np.float32).sum(-1), 1, atol=1e-3)


def attention_params(k=10):
    r = rng(k)
    return tuple(r.standard_normal((H, H) if i % 2 == 0 else H) * 0.5 for i in range(8))


def test_self_attention_backward():
    x = rng(11).standard_normal((B * S, H))
    params = attention_params()
    G = rng(12).standard_normal((B * S, H))
    y, ctx = self_attention_forward(x, params, B, S, A)
    grads = tuple(np.zeros_like(p) for p in params)
    dx = self_attention_backward(G, ctx, params, grads)
    loss = lambda: (G * self_attention_forward(x, params, B, S, A)[0]).sum()  # noqa: E731
    close(dx, numeric_grad(loss, x))
    for analytic, p in zip(grads, params):
        close(analytic, numeric_grad(loss, p))


def unit_check(unit, x, seed=13, input_grad=True):
    """The unit's backward against finite differences: dx (if any) and every parameter, the flat
    gradient ADDED to what was there (micro-steps accumulate)."""
    flat = unit.init(0, np.float64)
    flat += rng(seed).standard_normal(flat.size) * 0.05  # LayerNorm gammas and biases away from 1, 0
    y, ctx = unit.forward(flat, x)
    G = rng(seed + 1).standard_normal(y.shape)
    gflat = np.full(flat.size, 0.5)
    dx = unit.backward(flat, gflat, ctx, G)
    loss = lambda: (G * unit.forward(flat, x)[0]).sum()  # noqa: E731
    close(gflat - 0.5, numeric_grad(loss, flat))
    if input_grad:
        close(dx, numeric_grad(loss, x))
    return ctx


def test_embedding_unit_backward():
    tokens = rng(14).integers(0, V, (B, S))
    tokens[0, :2] = tokens[1, 3]  # a repeated token: its gradient rows must add up
    unit_check(EmbeddingUnit(V, S, H), tokens, input_grad=False)


def test_block_unit_backward():
    unit_check(BlockUnit(1, H, A, S, n_blocks=2), rng(15).standard_normal((B * S, H)))


def test_head_unit_backward():
    unit_check(HeadUnit(3, H, V, S), rng(16).standard_normal((B * S, H)))


def test_sequence_cross_entropy_backward():
    """Loss of (rows, s, V) logits: the mean over rows*s tokens of the global batch, and its gradient."""
    logits = rng(17).standard_normal((B, S, V))
    labels = rng(18).integers(0, V, (B, S))
    loss, d = softmax_cross_entropy(logits, labels, global_batch=4)  # this shard: 2 of 4 sequences
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    by_hand = -np.log(np.take_along_axis(p, labels[..., None], -1)).sum() / (4 * S)
    assert loss == pytest.approx(by_hand, rel=1e-12)
    close(d, numeric_grad(lambda: softmax_cross_entropy(logits, labels, 4)[0], logits))


class Cfg:
    blocks, hidden, heads, seq_len, vocab = 2, H, A, S, V


def test_whole_model_backward():
    """Embedding, two blocks, head and loss chained: d loss / d every parameter of every unit."""
    units = gpt_units(Cfg)
    flats = [u.init(3, np.float64) for u in units]
    tokens = rng(19).integers(0, V, (B, S))
    labels = rng(20).integers(0, V, (B, S))

    def loss():
        return softmax_cross_entropy(gpt_logits(units, [(f, None) for f in flats], tokens), labels, B)[0]

    x, ctxs = tokens, []
    for u, f in zip(units, flats):
        x, c = u.forward(f, x)
        ctxs.append(c)
    _, g = softmax_cross_entropy(x, labels, B)
    grads = [np.zeros_like(f) for f in flats]
    for u, f, gf, c in zip(reversed(units), reversed(flats), reversed(grads), reversed(ctxs)):
        g = u.backward(f, gf, c, g, need_dx=u.index > 0)
    for gf, f in zip(grads, flats):
        close(gf, numeric_grad(loss, f))
