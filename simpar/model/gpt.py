"""A decoder-only transformer (--arch gpt) from scratch: GPT-2's shape (Radford et al. 2019), as units.

    --arch gpt --n-layers L --hidden h --heads a --seq-len s --vocab V, tokens t (batch, s):
        x = E[t] + Pos                                   token embedding (V, h) + learned positions (s, h)
        x = x + Attn(LN1(x))                             L pre-LayerNorm blocks: causal self-attention
        x = x + W2 gelu(W1 LN2(x) + b1) + b2               (attention.py), then the MLP h -> 4h -> h
        logits = LN_f(x) Wout                            final LayerNorm, LM head (h, V), no bias
        loss = mean over every token of the global batch of -log softmax(logits)[next token]

As resmlp.py, the model is a list of UNITS with one flat parameter vector each -- the embedding, L
blocks, the head -- so data parallelism and ZeRO 1-3 (parallel/data.py, parallel/zero.py) run it
through the interface resmlp uses: a unit's size, init, forward and backward on flat vectors.
Parameters: embedding (V + s) h; block 12h^2 + 13h (LayerNorms 4h, Wq Wk Wv Wo 4h^2 + 4h, MLP 8h^2 +
5h); head 2h + hV (Narayanan et al. 2021, eq. 2's count, plus the untied head and the final LN).

The LM head is UNTIED (its own h x V matrix, not E^T), at the price of V h parameters (GPT-2 and
GPT-3 tie them). Why: (1) a unit owns its parameters -- a tied matrix would belong to the first and
the last unit at once, and ZeRO's per-unit chunks, the buckets and the full-shape checkpoints would
need a special case; (2) with pipeline stages the embedding lives on the first stage and the head
on the last, and tying costs an extra all-reduce of the shared gradient between them every step
(Megatron-LM's "embedding group"); untied, each stage owns its matrix. (3) Vocabulary-parallel tp
shards either matrix by its V axis (E by rows, Wout by columns) the same way, so nothing is lost
there. The cost model counts both (costmodel/gpt.py: `tied=True` gives the papers' counts).

The residual stream is 2-D, (batch*s, h) rows of tokens, so every projection is one matmul of the
kernel backend (kernels/, --kernels, --precision mixed-* through precision.HalfKernels); attention
reshapes it per sequence. Initialisation as GPT-2: weights N(0, 0.02), the two projections that write
into the residual stream (Wo, W2) scaled by 1/sqrt(2L), LayerNorms gamma 1, beta 0, biases 0, drawn
from (seed, unit index) on the full shape like every simpar model.
The backward of each unit adds into its gradient vector (+=), so micro-steps add up.
"""

from __future__ import annotations

import math

import numpy as np

from ..runtime.context import PLAIN
from .attention import (
    attention_core_backward,
    merge_heads,
    self_attention_backward,
    self_attention_forward,
    split_heads,
)
from .gpt_split import split_backward
from .mlp import pending_weight_passes, wide
from .resmlp import layernorm_backward, layernorm_forward

INIT_STD = 0.02  # GPT-2's initializer range

# What a unit charges the simulated clock (--clock sim), besides its matmuls: memory-bound elements per
# token row, forward and backward, in the activations' type (costmodel/gpt_time.py writes them again).
#   embedding  forward 3h (gather E's rows, read Pos, write x); backward 4h (add.at's read and write, dPos)
#   block      forward 50h + 6as: LayerNorm 8h twice, q k v o biases 2h each, merging the heads 2h, the
#              MLP's bias + GELU 16h and bias 2h, two residual adds 3h each; the causal softmax ~6
#              sweeps over a s scores; backward 51h + 4as: LayerNorm' 10h twice, bias sums 9h, GELU' 12h,
#              merging dq dk dv 6h, residuals 4h; softmax' ~4 sweeps; + accumulating 3 per parameter
#   head       forward 8h (LayerNorm); backward 10h (LayerNorm') + accumulating 3 per parameter
BLOCK_FWD_ELEMS, BLOCK_FWD_SCORES, BLOCK_BWD_ELEMS, BLOCK_BWD_SCORES = 50, 6, 51, 4
EMBED_FWD_ELEMS, EMBED_BWD_ELEMS, HEAD_FWD_ELEMS, HEAD_BWD_ELEMS, ACCUMULATE = 3, 4, 8, 10, 3


def charge_block(clock, rows: int, h: int, a: int, s: int, bpe: int, size: int, backward: bool) -> None:
    """A block's matmuls (q, k, v, o: h x h; scores q k^T and P v: 2 rows s h FLOPs each, over every
    head; the MLP h x 4h, 4h x h -- each twice in backward, dx and dW) and its memory passes."""
    times = 2 if backward else 1
    for _ in range(times):
        for _ in range(4):
            clock.matmul(rows, h, h)
        clock.matmul(rows, h, s)
        clock.matmul(rows, s, h)
        clock.matmul(rows, h, 4 * h)
        clock.matmul(rows, 4 * h, h)
    if backward:
        clock.stream((BLOCK_BWD_ELEMS * rows * h + BLOCK_BWD_SCORES * rows * a * s + ACCUMULATE * size) * bpe)
    else:
        clock.stream((BLOCK_FWD_ELEMS * rows * h + BLOCK_FWD_SCORES * rows * a * s) * bpe)
        clock.layer_call()


def charge_half(clock, rows: int, h: int, a: int, s: int, bpe: int, size: int, weights: bool) -> None:
    """A block's backward in the zero-bubble halves (gpt_split.py), charge_block's backward cut in two:
    B (weights=False) the dx matmuls -- q k v o, the MLP's two, the scores' four -- and every memory
    pass; W the dW matmuls of the six weight matrices and accumulating 3 per parameter."""
    for _ in range(4):
        clock.matmul(rows, h, h)
    for _ in range(0 if weights else 2):  # q k^T and P v, each for both inputs' gradients
        clock.matmul(rows, h, s)
        clock.matmul(rows, s, h)
    clock.matmul(rows, h, 4 * h)
    clock.matmul(rows, 4 * h, h)
    if weights:
        clock.stream(ACCUMULATE * size * bpe)
    else:
        clock.stream((BLOCK_BWD_ELEMS * rows * h + BLOCK_BWD_SCORES * rows * a * s) * bpe)


def _cut(flat, shapes):
    """Views of `flat` in the given shapes, one after the other."""
    out, offset = [], 0
    for shape in shapes:
        n = math.prod(shape)
        out.append(flat[offset : offset + n].reshape(shape))
        offset += n
    return out


class Kept:
    """A unit's context: the arrays it keeps for backward (their bytes are the activation memory)."""

    def __init__(self, **arrays):
        self.__dict__.update(arrays)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.__dict__.values())  # arrays, and attention's context


class EmbeddingUnit:
    """x = E[tokens] + Pos, out (batch*s, h). Keeps the token ids (int64) for backward.
    Under --tp, parallel/vocab_parallel.py holds rows v0..v1 of E per rank, looks up its ids, all-reduces."""

    rt = PLAIN  # the run's runtime (kernels): gpt_units gives each unit its run's

    def __init__(self, vocab: int, seq: int, hidden: int):
        self.index, self.V, self.s, self.h = 0, vocab, seq, hidden
        self.size = (vocab + seq) * hidden

    def views(self, flat):
        return _cut(flat, ((self.V, self.h), (self.s, self.h)))

    def init(self, seed: int, dtype) -> np.ndarray:
        rng = np.random.default_rng([seed, self.index, 1])
        return (rng.standard_normal(self.size) * INIT_STD).astype(dtype)

    def forward(self, flat, tokens):
        E, pos = self.views(flat)
        b, s = tokens.shape
        x = (E[tokens] + pos[:s]).reshape(b * s, self.h)
        clock = self.rt.clock
        if clock is not None:
            clock.stream(EMBED_FWD_ELEMS * x.size * x.itemsize)
            clock.layer_call()
        return x, Kept(tokens=tokens)

    def backward(self, flat, gflat, ctx, dy, need_dx: bool = False):
        """dE[v] += the rows of dy whose token is v (np.add.at: repeated tokens add up), dPos += the
        sum over the batch. No dx: tokens are integers."""
        pending = pending_weight_passes()
        if pending is not None:  # a zero-bubble pipeline's B pass: the W half waits (gpt_split.py)
            return split_backward(self, flat, gflat, ctx, dy, pending)
        dE, dpos = self.views(gflat)
        b, s = ctx.tokens.shape
        np.add.at(dE, ctx.tokens.reshape(-1), dy)
        dpos[:s] += dy.reshape(b, s, self.h).sum(axis=0)
        if self.rt.clock is not None:
            self.rt.clock.stream(EMBED_BWD_ELEMS * dy.size * dy.itemsize)
        return None

    def weights(self, flat):
        return flat.copy(), np.empty(0, flat.dtype)


class BlockUnit:
    """x + Attn(LN1(x)), then + MLP(LN2(.)): one pre-LN transformer block of width h with a heads."""

    rt = PLAIN  # the run's runtime (kernels): gpt_units gives each unit its run's
    # The keys each query's scores span in charge_block. Context parallelism's attention charges its
    # score work itself, block by block between its transfers (context_attention.py): 0 there.
    charged_keys = None  # None: self.s, the whole sequence

    def __init__(self, index: int, hidden: int, heads: int, seq: int, n_blocks: int):
        self.index, self.h, self.a, self.s, self.L = index, hidden, heads, seq, n_blocks
        self.size = 12 * hidden * hidden + 13 * hidden

    def views(self, flat):
        """g1, b1, (Wq, bq, Wk, bk, Wv, bv, Wo, bo), g2, b2, W1, c1, W2, c2."""
        h = self.h
        v = _cut(
            flat,
            [(h,), (h,)] + [(h, h), (h,)] * 4 + [(h,), (h,), (h, 4 * h), (4 * h,), (4 * h, h), (h,)],
        )
        return v[0], v[1], tuple(v[2:10]), v[10], v[11], v[12], v[13], v[14], v[15]

    def init(self, seed: int, dtype) -> np.ndarray:
        rng = np.random.default_rng([seed, self.index, 1])
        flat = np.zeros(self.size)
        g1, _, attn, g2, _, W1, _, W2, _ = self.views(flat)
        g1[...] = g2[...] = 1.0
        out_scale = 1 / math.sqrt(2 * self.L)  # GPT-2: the residual writes, so the stream does not grow
        for W, scale in ((attn[0], 1), (attn[2], 1), (attn[4], 1), (attn[6], out_scale), (W1, 1)):
            W[...] = rng.standard_normal(W.shape) * INIT_STD * scale
        W2[...] = rng.standard_normal(W2.shape) * INIT_STD * out_scale
        return flat.astype(dtype)

    # The attention's forward and backward: whole sequences here; context parallelism (parallel/
    # context.py) swaps in its own for a rank that holds only some of every sequence's tokens.
    def attend(self, x, attn, batch):
        return self_attention_forward(x, attn, batch, self.s, self.a, self.rt.kernels)

    def attend_backward(self, dy, actx, attn, dattn):
        return self_attention_backward(dy, actx, attn, dattn, self.rt.kernels)

    def forward(self, flat, x):
        g1, b1, attn, g2, b2, W1, c1, W2, c2 = self.views(flat)
        rows = x.shape[0]
        batch = rows // self.s
        h1, (xh1, r1) = layernorm_forward(x, g1, b1)
        y, actx = self.attend(h1, attn, batch)
        x2 = x + y
        h2, (xh2, r2) = layernorm_forward(x2, g2, b2)
        k = self.rt.kernels
        z, u = k.linear_act_forward(h2, W1, c1, "gelu")
        m, _ = k.linear_act_forward(u, W2, c2, "none")
        ctx = Kept(xh1=xh1, r1=r1, attn=actx, xh2=xh2, r2=r2, h2=h2, z=z, u=u)
        if self.rt.clock is not None:
            charge_block(self.rt.clock, rows, self.h, self.a, self._keys(), x.itemsize, self.size, False)
        return x2 + m, ctx

    def backward(self, flat, gflat, ctx, dy, need_dx: bool = True):
        pending = pending_weight_passes()
        if pending is not None:  # a zero-bubble pipeline's B pass: the W half waits (gpt_split.py)
            return split_backward(self, flat, gflat, ctx, dy, pending)
        g1, _, attn, g2, _, W1, _, W2, _ = self.views(flat)
        dg1, db1, dattn, dg2, db2, dW1, dc1, dW2, dc2 = self.views(gflat)
        k = self.rt.kernels
        du, gW2, gc2 = k.linear_act_backward(dy, ctx.u, W2, dy, dy, "none", True)
        dh2, gW1, gc1 = k.linear_act_backward(du, ctx.h2, W1, ctx.z, ctx.u, "gelu", True)
        dx2, gg2, gb2 = layernorm_backward(dh2, (ctx.xh2, ctx.r2), g2)
        dx2 = dy + dx2  # the residual path around the MLP
        dh1 = self.attend_backward(dx2, ctx.attn, attn, dattn)
        dx, gg1, gb1 = layernorm_backward(dh1, (ctx.xh1, ctx.r1), g1)
        for acc, new in ((dg1, gg1), (db1, gb1), (dg2, gg2), (db2, gb2), (dW1, gW1), (dc1, gc1)):
            acc += new
        dW2 += gW2
        dc2 += gc2
        if self.rt.clock is not None:
            charge_block(
                self.rt.clock, dy.shape[0], self.h, self.a, self._keys(), dy.itemsize, self.size, True
            )
        return dx2 + dx  # the residual path around attention

    def charge_half(self, rows: int, bpe: int, weights: bool) -> None:
        """--clock sim: one zero-bubble half of this block's backward (gpt_split.py)."""
        if self.rt.clock is not None:
            charge_half(self.rt.clock, rows, self.h, self.a, self._keys(), bpe, self.size, weights)

    def attend_core_backward(self, do, actx):
        """(dq, dk, dv) merged, from do: the attention core's backward alone (gpt_split.py's B pass)."""
        b, heads, s, _ = actx.q.shape
        grads = attention_core_backward(split_heads(do, b, s, heads), actx.q, actx.k, actx.v, actx.probs)
        return tuple(merge_heads(g) for g in grads)

    def weights(self, flat):
        return flat.copy(), np.empty(0, flat.dtype)

    def _keys(self) -> int:
        return self.s if self.charged_keys is None else self.charged_keys


class HeadUnit:
    """logits = LN_f(x) Wout, shaped (batch, s, V) for the loss. Under --tp a rank holds columns
    v0..v1 of Wout and the loss never gathers the logits (parallel/vocab_parallel.py)."""

    rt = PLAIN  # the run's runtime (kernels): gpt_units gives each unit its run's

    def __init__(self, index: int, hidden: int, vocab: int, seq: int):
        self.index, self.h, self.V, self.s = index, hidden, vocab, seq
        self.size = 2 * hidden + hidden * vocab

    def views(self, flat):
        return _cut(flat, ((self.h,), (self.h,), (self.h, self.V)))

    def init(self, seed: int, dtype) -> np.ndarray:
        rng = np.random.default_rng([seed, self.index, 1])
        g, b, W = self.views(np.zeros(self.size))
        g[...] = 1.0
        W[...] = rng.standard_normal(W.shape) * INIT_STD
        return np.concatenate((g, b, W.reshape(-1))).astype(dtype)

    def forward(self, flat, x):
        g, b, W = self.views(flat)
        hf, (xh, r) = layernorm_forward(x, g, b)
        logits, _ = self.rt.kernels.linear_act_forward(hf, W, None, "none")
        clock = self.rt.clock
        if clock is not None:
            clock.matmul(x.shape[0], self.h, self.V)
            clock.stream(HEAD_FWD_ELEMS * x.size * x.itemsize)
            clock.layer_call()
        return logits.reshape(-1, self.s, self.V), Kept(xh=xh, r=r, hf=hf)

    def backward(self, flat, gflat, ctx, dlogits, need_dx: bool = True):
        pending = pending_weight_passes()
        if pending is not None:  # a zero-bubble pipeline's B pass: the W half waits (gpt_split.py)
            return split_backward(self, flat, gflat, ctx, dlogits, pending)
        g, _, W = self.views(flat)
        dg, db, dW = self.views(gflat)
        d2 = dlogits.reshape(-1, self.V)
        dhf, gW, _ = self.rt.kernels.linear_act_backward(d2, ctx.hf, W, d2, d2, "none", True)
        dx, gg, gb = layernorm_backward(dhf, (ctx.xh, ctx.r), g)
        dW += gW
        dg += gg
        db += gb
        clock = self.rt.clock
        if clock is not None:
            clock.matmul(dx.shape[0], self.h, self.V)
            clock.matmul(dx.shape[0], self.h, self.V)
            clock.stream((HEAD_BWD_ELEMS * dx.size + ACCUMULATE * self.size) * dx.itemsize)
        return dx

    def charge_half(self, rows: int, bpe: int, weights: bool) -> None:
        """--clock sim: one zero-bubble half of the head's backward (gpt_split.py): B dlogits Wout^T and
        LN_f's backward, W dWout and accumulating 3 per parameter."""
        clock = self.rt.clock
        if clock is not None:
            clock.matmul(rows, self.h, self.V)
            clock.stream((ACCUMULATE * self.size if weights else HEAD_BWD_ELEMS * rows * self.h) * bpe)

    def weights(self, flat):
        return flat.copy(), np.empty(0, flat.dtype)


def gpt_logits(units, weights, tokens):
    """Logits (batch, s, V) from full weights [(flat, empty) per unit], as forward computes them."""
    x = tokens
    for unit, (flat, _) in zip(units, weights):
        x, _ = unit.forward(flat, x)
    return x


def token_accuracy(logits, labels, mask=None) -> float:
    """Fraction of next tokens predicted right (argmax), over the positions `mask` marks (all if None)."""
    right = np.argmax(wide(logits), axis=-1) == labels
    return float(right.mean() if mask is None else right[mask].mean())
