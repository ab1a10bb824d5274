"""The backward of gpt.py's units in two halves, for the zero-bubble pipelines (--schedule zb-h1, zb-v).

Qi et al. 2023 ("Zero Bubble Pipeline Parallelism", sec. 2) split a layer's backward into B, the
gradient with respect to its input (the next stage down waits for it), and W, the gradients of its
weights (nobody waits: it fills the bubbles). For a linear map y = x W + b: B is dx = dy W^T, W is
dW = x^T dy, db = sum dy. A transformer block is a chain of them:

  B  du = dy W2^T, dz = gelu'(du), dh2 = dz W1^T, LN2's dx;  dx2 = dy + that (the residual)
     do = dx2 Wo^T, attention's dq dk dv (attention.attention_core_backward, the s^2 part), dh1 =
     dq Wq^T + dk Wk^T + dv Wv^T, LN1's dx;  returns dx2 + that
  W  dW2 += u^T dy, dW1 += h2^T dz, dWo += o^T dx2, dWq += h1^T dq (and k, v), their biases' row
     sums, LayerNorms' dgamma = sum dh * xh, dbeta = sum dh

The embedding has no B (its input is integer tokens): all of its backward is W. The head: B is LN_f's
dx from dhf = dlogits Wout^T, W is dWout = hf^T dlogits and LN_f's gamma, beta. Together the halves
compute what the fused backward (gpt.py) computes; under half precision each product is taken in
float32 from the half arrays and rounded back where the kernels round (precision.HalfKernels).
A block's attention core is its unit's attend_core_backward: the serial core here, the cp group's for
a cp block (parallel/context.py: the ring's K/V hops and dK/dV partial sums, or Ulysses' all-to-alls,
are on the path of dL/dx, so all of the cp traffic runs in B; W is the local products alone).
split_backward is called by a unit's backward inside model.mlp.deferred_weight_grads and queues ONE
closure per unit (the pipeline pairs W passes with its units).

The simulated clock (--clock sim) is charged for each half when it runs, the fused backward's charge
(gpt.py) cut in two: B the dx matmuls (a block's four h x h, its MLP's two, the attention's four score
matmuls; the head's dlogits Wout^T) and every memory pass; W the dW matmuls (the same shapes again) and
accumulating the gradients, 3 per parameter (the units' charge_half, gpt.py);
costmodel/gpt_pipeline_time.py writes the same split.
"""

from __future__ import annotations

from .mlp import ACTIVATIONS, wide


def _dot(a, b, half):
    """a @ b in float32 for half inputs (float64 stays float64), rounded to `half`."""
    return (wide(a) @ wide(b)).astype(half, copy=False)


def _layernorm_dx(dh, xh, r, gamma, half):
    """LayerNorm's dx alone (resmlp.layernorm_backward's first output)."""
    g = wide(dh) * wide(gamma)
    xh, r = wide(xh), wide(r)
    return ((g - g.mean(axis=1, keepdims=True) - xh * (g * xh).mean(axis=1, keepdims=True)) / r).astype(half)


def _add_weight_grads(pairs, half) -> None:
    """acc += x^T dz (or a row sum), each rounded to the gradient's type once."""
    for acc, new in pairs:
        acc += new.astype(half, copy=False)


def split_backward(unit, flat, gflat, ctx, dy, pending: list):
    """The B half now (its dx returned); the W half appended to `pending` as one closure."""
    kind = type(unit).__name__
    if kind == "EmbeddingUnit":
        pending.append(lambda: unit.backward(flat, gflat, ctx, dy))  # called outside the B pass: fused
        return None
    half = dy.dtype
    if kind == "HeadUnit":
        g, _, W = unit.views(flat)
        d2 = dy.reshape(-1, unit.V)
        dhf = _dot(d2, W.T, half)
        dx = _layernorm_dx(dhf, ctx.xh, ctx.r, g, half)
        unit.charge_half(d2.shape[0], dy.itemsize, weights=False)

        def head_w():
            dg, db, dW = unit.views(gflat)
            f = wide(dhf)
            _add_weight_grads(
                ((dW, wide(ctx.hf).T @ wide(d2)), (dg, (f * wide(ctx.xh)).sum(0)), (db, f.sum(0))), half
            )
            unit.charge_half(d2.shape[0], dy.itemsize, weights=True)

        pending.append(head_w)
        return dx
    g1, _, attn, g2, _, W1, _, W2, _ = unit.views(flat)
    Wq, _, Wk, _, Wv, _, Wo, _ = attn
    du = _dot(dy, W2.T, half)
    dz = ACTIVATIONS["gelu"][1](wide(du), wide(ctx.z), wide(ctx.u))
    dh2 = _dot(dz, W1.T, half)
    dx2 = dy + _layernorm_dx(dh2, ctx.xh2, ctx.r2, g2, half)
    a = ctx.attn
    do = _dot(dx2, Wo.T, half)
    dq, dk, dv = unit.attend_core_backward(do, a)  # a cp block's runs over the cp group (context.py)
    dh1 = _dot(dq, Wq.T, half) + _dot(dk, Wk.T, half) + _dot(dv, Wv.T, half)
    dx = dx2 + _layernorm_dx(dh1, ctx.xh1, ctx.r1, g1, half)
    unit.charge_half(dy.shape[0], dy.itemsize, weights=False)

    def block_w():
        dg1, db1, dattn, dg2, db2, dW1, dc1, dW2, dc2 = unit.views(gflat)
        dWq, dbq, dWk, dbk, dWv, dbv, dWo, dbo = dattn
        f2, f1, fz, fdy, fdx2 = wide(dh2), wide(dh1), wide(dz), wide(dy), wide(dx2)
        pairs = [(dW2, wide(ctx.u).T @ fdy), (dc2, fdy.sum(0)), (dW1, wide(ctx.h2).T @ fz), (dc1, fz.sum(0))]
        pairs += [(dg2, (f2 * wide(ctx.xh2)).sum(0)), (db2, f2.sum(0))]
        pairs += [(dWo, wide(a.o).T @ fdx2), (dbo, fdx2.sum(0))]
        for dW, db, dpart in ((dWq, dbq, dq), (dWk, dbk, dk), (dWv, dbv, dv)):
            pairs += [(dW, wide(a.x).T @ wide(dpart)), (db, wide(dpart).sum(0))]
        pairs += [(dg1, (f1 * wide(ctx.xh1)).sum(0)), (db1, f1.sum(0))]
        _add_weight_grads(pairs, half)
        unit.charge_half(dy.shape[0], dy.itemsize, weights=True)

    pending.append(block_w)
    return dx
