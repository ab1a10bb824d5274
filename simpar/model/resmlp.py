"""Residual MLP (--arch resmlp): pre-LayerNorm residual blocks between an input and an output projection.

    --layers 64,128,128,128,10 --arch resmlp:
        h0 = x @ Win + bin                               input projection, 64 -> 128 (no activation)
        h  = h + W2 act(W1 LN(h) + b1) + b2              one residual block per further 128
        logits = h @ Wout + bout                         output projection, 128 -> 10

The pre-LN block ("x + F(LN(x))", He et al. 2016 for the identity path; Xiong et al. 2020 for
normalising before the branch, as GPT-2 does) keeps a clean identity path from the loss to every
block, so gradients reach the first layers undiminished however deep the stack.

The model is a list of UNITS, each with one flat parameter vector: LinearUnit (W then b) for the
projections, BlockUnit (gamma, beta, W1, b1, W2, b2) for a block of width d (2d^2 + 4d parameters).
Data parallelism and ZeRO only need a unit's size, its forward and its backward on flat vectors, so
they run either architecture (parallel/zero.py, parallel/resstack.py). Tensor parallelism splits
each block's W1 by columns and W2 by rows, and --sp its rows (parallel/restensor.py). Pipeline
parallelism cuts the list of units into stages (parallel/partition.py) and sends the residual
stream, rows x d, between them; its zero-bubble schedule splits each unit's backward into a B half
(dL/dx) and a W half (the weight gradients): backward_input / backward_weight below.

LayerNorm (Ba et al. 2016) over the d features of each row, and its backward:
    mu = mean(x),  s = sqrt(var(x) + eps),  xh = (x - mu) / s,  y = gamma * xh + beta
    dbeta = sum_rows dy,   dgamma = sum_rows dy * xh,   g = dy * gamma
  xh depends on x through x itself, mu and s: dxh_j/dx_k = (delta_jk - 1/d - xh_j xh_k / d) / s
  (using dmu/dx_k = 1/d and ds/dx_k = xh_k / (d s)). Contracting with g:
    dx = (g - mean(g) - xh * mean(g * xh)) / s                 (means over the d features)
tests/unit/model/test_resmlp.py checks it, and the whole block, against finite differences.
"""

from __future__ import annotations

import math

import numpy as np

from ..runtime.context import PLAIN
from .mlp import (
    ACTIVATIONS,
    Linear,
    deferred_weight_grads,
    init_layer,
    layer_backward,
    layer_forward,
    pending_weight_passes,
    predict,
    wide,
)

EPS = 1e-5


def layernorm_forward(x, gamma, beta):
    """(y, (xh, s)). Half precision (--precision mixed-*): computed in float32 from the half inputs,
    every result rounded back once, as precision.HalfKernels does for the matmuls."""
    half = x.dtype
    x, gamma, beta = wide(x), wide(gamma), wide(beta)
    mu = x.mean(axis=1, keepdims=True)
    s = np.sqrt(x.var(axis=1, keepdims=True) + x.dtype.type(EPS))
    xh = (x - mu) / s
    return (gamma * xh + beta).astype(half, copy=False), (
        xh.astype(half, copy=False),
        s.astype(half, copy=False),
    )


def layernorm_backward(dy, cache, gamma):
    """(dx, dgamma, dbeta); the derivation is in the module docstring. Half: as layernorm_forward."""
    half = dy.dtype
    (xh, s), dy = map(wide, cache), wide(dy)
    g = dy * wide(gamma)
    dx = (g - g.mean(axis=1, keepdims=True) - xh * (g * xh).mean(axis=1, keepdims=True)) / s
    return tuple(a.astype(half, copy=False) for a in (dx, (dy * xh).sum(axis=0), dy.sum(axis=0)))


class LinearUnit:
    """A projection: layer i of the model as a unit (model.Linear on views of the flat vector)."""

    def __init__(self, index: int, fan_in: int, fan_out: int, act: str, rt=PLAIN):
        self.index, self.fi, self.fo, self.act = index, fan_in, fan_out, act
        self.size = fan_in * fan_out + fan_out
        self.rt = rt  # the run's kernels and clock (build_units)

    def views(self, flat):
        return flat[: self.fi * self.fo].reshape(self.fi, self.fo), flat[self.fi * self.fo :]

    def init(self, seed: int, dtype) -> np.ndarray:
        W, b = init_layer(seed, self.index, self.fi, self.fo, dtype)
        return np.concatenate((W.reshape(-1), b))

    def forward(self, flat, x):
        W, b = self.views(flat)
        return layer_forward(Linear(self.index, W, b, None, None, self.act, rt=self.rt), x)

    def backward(self, flat, gflat, ctx, dy, need_dx: bool):
        (W, b), (dW, db) = self.views(flat), self.views(gflat)
        return layer_backward(Linear(self.index, W, b, dW, db, self.act, rt=self.rt), ctx, dy, need_dx)

    def backward_input(self, flat, gflat, ctx, dy, need_dx: bool):
        """The B half (model.backward_input): (dx, the W half as a closure that adds dW, db)."""
        with deferred_weight_grads() as pending:
            dx = self.backward(flat, gflat, ctx, dy, need_dx)
        return dx, pending[0]

    def weights(self, flat):
        return tuple(v.copy() for v in self.views(flat))


class BlockContext:
    """What a block keeps for backward: its input, LayerNorm's xh and s, the branch's LN(x), z1, u."""

    def __init__(self, *arrays):
        self.arrays = arrays

    @property
    def x(self):  # the block's input (as model.Context's)
        return self.arrays[0]

    @property
    def h(self):  # LN(x), the branch's input (under --sp: all-gathered, more rows than x)
        return self.arrays[3]

    @property
    def z1(self):  # W1 LN(x) + b1
        return self.arrays[4]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)


class BlockUnit:
    """x + W2 act(W1 LN(x) + b1) + b2 on width d; flat parameters gamma, beta, W1, b1, W2, b2."""

    def __init__(self, index: int, d: int, act: str, rt=PLAIN):
        self.index, self.d, self.act = index, d, act
        self.size = 2 * d * d + 4 * d
        self.rt = rt  # the run's kernels and clock (build_units)

    def views(self, flat):
        d = self.d
        cuts = np.cumsum([d, d, d * d, d, d * d])
        g, beta, W1, b1, W2, b2 = np.split(flat, cuts)
        return g, beta, W1.reshape(d, d), b1, W2.reshape(d, d), b2

    def init(self, seed: int, dtype) -> np.ndarray:
        """gamma 1, beta 0; W1 He-normal; W2 scaled by 1/sqrt(d) more, so each block starts as a small
        correction to the identity path (as GPT-2 scales its residual projections down)."""
        d = self.d
        rng = np.random.default_rng([seed, self.index, 1])
        W1 = rng.standard_normal((d, d)) * math.sqrt(2.0 / d)
        W2 = rng.standard_normal((d, d)) * math.sqrt(1.0 / d) / math.sqrt(d)
        b1, b2 = rng.standard_normal(d) * 0.01, np.zeros(d)
        parts = (np.ones(d), np.zeros(d), W1.reshape(-1), b1, W2.reshape(-1), b2)
        return np.concatenate(parts).astype(dtype)

    def forward(self, flat, x):
        g, beta, W1, b1, W2, b2 = self.views(flat)
        h, (xh, s) = layernorm_forward(x, g, beta)
        k = self.rt.kernels
        z1, u = k.linear_act_forward(h, W1, b1, self.act)
        v, _ = k.linear_act_forward(u, W2, b2, "none")
        clock = self.rt.clock
        if clock is not None:  # LN ~8 passes over rows x d, two linear layers, the residual add 3
            r, bpe = x.shape[0], x.itemsize
            clock.matmul(r, self.d, self.d)
            clock.matmul(r, self.d, self.d)
            clock.stream((8 + 4 + 2 + 3) * r * self.d * bpe)
            clock.layer_call()
        return x + v, BlockContext(x, xh, s, h, z1, u)

    def rebuild_context(self, flat, x, z1) -> BlockContext:
        """What forward kept, from the block's input x and W1's output z1 (--recompute selective,
        parallel/resstack.py): LayerNorm and u = act(z1) again, ~8 + 2 passes over rows x d."""
        g, beta, *_ = self.views(flat)
        h, (xh, s) = layernorm_forward(x, g, beta)
        u = ACTIVATIONS[self.act][0](z1)
        clock = self.rt.clock
        if clock is not None:
            clock.stream((8 + 2) * x.shape[0] * self.d * x.itemsize)
        return BlockContext(x, xh, s, h, z1, u)

    def backward(self, flat, gflat, ctx, dy, need_dx: bool = True):
        """dx, with every parameter's gradient added into gflat. Inside model.deferred_weight_grads
        (a zero-bubble pipeline's B pass) only backward_input runs; its W half is queued there."""
        pending = pending_weight_passes()
        if pending is not None:
            dx, weight_pass = self.backward_input(flat, gflat, ctx, dy)
            pending.append(weight_pass)
            return dx
        g, beta, W1, b1, W2, b2 = self.views(flat)
        dg, dbeta, dW1, db1, dW2, db2 = self.views(gflat)
        x, xh, s, h, z1, u = ctx.arrays
        k = self.rt.kernels
        du, gW2, gb2 = k.linear_act_backward(dy, u, W2, dy, dy, "none", True)  # z, y unused
        dh, gW1, gb1 = k.linear_act_backward(du, h, W1, z1, u, self.act, True)
        dx, ggamma, gbeta = layernorm_backward(dh, (xh, s), g)
        for acc, new in ((dg, ggamma), (dbeta, gbeta), (dW1, gW1), (db1, gb1), (dW2, gW2), (db2, gb2)):
            acc += new  # += so grad-accum micro-steps add up
        clock = self.rt.clock
        if clock is not None:  # 4 matmuls; act', LN' (~10 passes), accumulating 2d^2 + 4d, residual 2
            r, bpe = dy.shape[0], dy.itemsize
            for _ in range(2):
                clock.matmul(self.d, r, self.d)
                clock.matmul(r, self.d, self.d)
            clock.stream(((3 + 10 + 2 + 2) * r * self.d + 3 * self.size) * bpe)
        return dy + dx  # the identity path carries dy straight through

    # -- the backward in two halves (zero-bubble pipelines, Qi et al. 2023, sec. 2) ------------------
    #   B: du = dy W2^T, dz1 = act'(du), dh = dz1 W1^T, LayerNorm's dx; dy + dx  (the critical path)
    #   W: dW2 += u^T dy, db2 += sum dy, dW1 += h^T dz1, db1 += sum dz1, dgamma += sum dh*xh,
    #      dbeta += sum dh                                                   (nobody waits for it)
    # Together the same arithmetic as backward, and the same clock charges (B: the two dx matmuls,
    # act' 3, LN's dx 8, residual 2 passes over rows x d; W: the two dW matmuls, four row sums 4,
    # accumulating 3 per parameter).
    def backward_input(self, flat, gflat, ctx, dy, need_dx: bool = True):
        """The B half: (dL/dx, the W half as a closure over what it needs: dy, dz1, dh). Half
        precision rounds du, dh and dx to half where the fused backward's kernels do, so B + W
        compute the same numbers."""
        g, _, W1, _, W2, _ = self.views(flat)
        x, xh, s, h, z1, u = map(wide, ctx.arrays)
        half = dy.dtype
        du = wide((wide(dy) @ wide(W2).T).astype(half, copy=False))
        dz1 = ACTIVATIONS[self.act][1](du, z1, u)
        dh = wide((dz1 @ wide(W1).T).astype(half, copy=False))
        gh = dh * wide(g)  # LayerNorm's dx (module docstring) without its dgamma, dbeta
        dx = (gh - gh.mean(axis=1, keepdims=True) - xh * (gh * xh).mean(axis=1, keepdims=True)) / s
        dx = dx.astype(half, copy=False)
        clock = self.rt.clock
        if clock is not None:
            r = dy.shape[0]
            clock.matmul(r, self.d, self.d)
            clock.matmul(r, self.d, self.d)
            clock.stream((3 + 8 + 2) * r * self.d * dy.itemsize)
        return dy + dx, lambda: self.backward_weight(gflat, ctx, dy, dz1, dh)

    def backward_weight(self, gflat, ctx, dy, dz1, dh) -> None:
        """The W half: add the six parameter gradients (+=: micro-batches add up)."""
        dg, dbeta, dW1, db1, dW2, db2 = self.views(gflat)
        x, xh, s, h, z1, u = map(wide, ctx.arrays)
        dy, half = wide(dy), gflat.dtype
        for acc, new in (
            (dW2, u.T @ dy),
            (db2, dy.sum(axis=0)),
            (dW1, h.T @ dz1),
            (db1, dz1.sum(axis=0)),
            (dg, (dh * xh).sum(axis=0)),
            (dbeta, dh.sum(axis=0)),
        ):
            acc += new.astype(half, copy=False)  # half: rounded once, as HalfKernels' dW, db
        clock = self.rt.clock
        if clock is not None:
            r = dy.shape[0]
            clock.matmul(self.d, r, self.d)
            clock.matmul(self.d, r, self.d)
            clock.stream((4 * r * self.d + 3 * self.size) * half.itemsize)

    def weights(self, flat):
        return (flat.copy(), np.empty(0, flat.dtype))  # one flat vector per block (b: empty)


def build_units(cfg, rt=PLAIN) -> list:
    """The model's units: [input projection, blocks..., output projection] for resmlp; for mlp, one
    LinearUnit per layer (hidden layers with the activation, the last with raw logits). `rt`: the
    run's runtime (kernels, clock), which every unit gets."""
    W, n = cfg.layers, cfg.n_layers
    if cfg.arch != "resmlp":
        units = [LinearUnit(i, W[i], W[i + 1], cfg.activation if i < n - 1 else "none") for i in range(n)]
    else:
        units = (
            [LinearUnit(0, W[0], W[1], "none")]
            + [BlockUnit(i, W[i], cfg.activation) for i in range(1, n - 1)]
            + [LinearUnit(n - 1, W[n - 1], W[n], "none")]
        )
    for unit in units:
        unit.rt = rt
    return units


def predict_logits(units, weights, x):
    """Logits from full weights: (W, b) per projection, (flat, empty) per block, as forward does."""
    for unit, (W, b) in zip(units, weights):
        if isinstance(unit, BlockUnit):
            g, beta, W1, b1, W2, b2 = unit.views(W)
            h, _ = layernorm_forward(x, g, beta)
            x = x + predict([(W1, b1), (W2, b2)], h, unit.act)
            continue
        x = predict([(W, b)], x, "none")
    return x
