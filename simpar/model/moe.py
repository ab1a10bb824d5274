"""Mixture-of-experts layers (--experts E --top-k K --capacity-factor C --aux-loss-coef alpha).

Which layers: with `--arch mlp --layers w0,h1,...,h_{n-1},c` every layer whose input AND output are
hidden widths -- layers 1 .. n-2, i.e. all but the first (input -> hidden) and the last (hidden ->
logits) -- becomes an MoE layer. The default 64,128,128,128,10 has two: layers 1 and 2.

One MoE layer on N rows x (d_in wide), Shazeer et al. 2017 with Switch/GShard's capacity:
    router    p = softmax(x @ Wr)                      Wr: d_in x E, no bias           (Shazeer, eq. 3)
    top-k     T(x) = the K largest p_e(x) (ties: the lower expert), gates g_j = p_{T_j} / sum_i p_{T_i}
    experts   h_e(x) = act(x @ W_e + b_e)              E experts, each a Linear(d_in, d_out)
    output    y(x) = sum over KEPT j of g_j * h_{T_j}(x)
    capacity  cap = ceil(C * K * N / E) token slots per expert (N: the rows routed together, the global
              batch, or one --grad-accum micro-step's global rows); an expert takes its assignments in
              GLOBAL ROW ORDER of the batch (all rows of data-parallel rank 0, then rank 1, ...), so
              every layout drops exactly the tokens the serial run drops; a dropped assignment
              contributes 0 (a row with all K dropped outputs zeros: an MLP has no residual to fall
              back on). Drops are counted (metrics: moe.dropped).
    aux loss  L_aux = alpha * E * sum_e f_e * P_e        (Switch Transformer, Fedus et al. 2021, eq. 4)
              f_e = (assignments to e among the N*K top-k choices) / (N*K), before capacity (eq. 5,
              generalised to K choices so that sum_e f_e = 1); P_e = (1/N) sum_x p_e(x) (eq. 6).
              With --grad-accum each micro-step k has its own L_aux,k, weighted N_k / B (B: the global
              batch), so its K shares add up as the main loss's do (equal micro-steps: their mean).

Backward, for dL/dy given (every quantity per row x):
    experts   dL/dh_j = g_j * dy for each kept j; then the Linear+act backward (model.layer_backward)
    gates     dL/dg_j = dy . h_{T_j}(x) (0 for dropped j)
    renorm    g_j = p_{T_j} / S with S = sum_i p_{T_i}:  dL/dp_{T_m} = (dL/dg_m - sum_j g_j dL/dg_j) / S,
              and 0 for experts outside T(x) (top-k is piecewise constant: no gradient through the choice)
    aux       f_e does not depend on the parameters (a count); dL_aux/dp_e(x) = alpha * E * f_e / N
    softmax   dL/dlogit = p * (dL/dp - sum_e p_e dL/dp_e);  dWr = x^T dlogit;  dx += dlogit Wr^T
tests/unit/model/test_moe.py checks all of it, capacity drops included, against finite differences in float64.

Evaluation (validation accuracy) routes every row to its K experts with no capacity limit.
"""

from __future__ import annotations

import math

import numpy as np

from .mlp import ACTIVATIONS, Linear, layer_backward, layer_forward

# -- which layers, and their parameters --------------------------------------------------------------


def moe_layer_indices(n_layers: int) -> list[int]:
    """The layers that become MoE layers: hidden -> hidden, i.e. all but the first and the last."""
    return list(range(1, n_layers - 1))


def init_moe(seed: int, index: int, d_in: int, d_out: int, E: int, dtype):
    """(Wr, [(W_e, b_e) for each expert]) of MoE layer `index`, full shape, from (seed, layer, ...).
    Router: normal with std 1/sqrt(d_in) (logits of order 1: routing starts varied but not peaked);
    expert e: He-normal W and small normal b like a dense layer, from its own stream (seed, layer, e + 1)."""
    rng = np.random.default_rng([seed, index, 0])
    Wr = (rng.standard_normal((d_in, E)) / math.sqrt(d_in)).astype(dtype)
    experts = []
    for e in range(E):
        g = np.random.default_rng([seed, index, e + 1])
        W = g.standard_normal((d_in, d_out)) * math.sqrt(2.0 / d_in)
        experts.append((W.astype(dtype), (g.standard_normal(d_out) * 0.01).astype(dtype)))
    return Wr, experts


def expert_size(d_in: int, d_out: int) -> int:
    return d_in * d_out + d_out


def moe_param_count(widths: list[int], E: int) -> tuple[int, int]:
    """(parameters outside the experts, parameters of all experts) of the whole MoE model."""
    n, moe = len(widths) - 1, set(moe_layer_indices(len(widths) - 1))
    dense = sum(expert_size(widths[i], widths[i + 1]) for i in range(n) if i not in moe)
    routers = sum(widths[i] * E for i in moe)
    experts = sum(E * expert_size(widths[i], widths[i + 1]) for i in moe)
    return dense + routers, experts


def pack_flat(Wr, experts) -> np.ndarray:
    """An MoE layer's full weights as one flat vector (the weights file's W_i; b_i is empty):
    Wr, then W_0, b_0, W_1, b_1, ..."""
    return np.concatenate([Wr.reshape(-1)] + [a.reshape(-1) for W, b in experts for a in (W, b)])


def unpack_flat(flat, d_in: int, d_out: int, E: int):
    Wr = flat[: d_in * E].reshape(d_in, E)
    off, experts = d_in * E, []
    for _ in range(E):
        W = flat[off : off + d_in * d_out].reshape(d_in, d_out)
        b = flat[off + d_in * d_out : off + expert_size(d_in, d_out)]
        experts.append((W, b))
        off += expert_size(d_in, d_out)
    return Wr, experts


# -- routing ------------------------------------------------------------------------------------------


def router_dtype(dtype) -> np.dtype:
    """The router's arithmetic: float32 for a half-precision model (--precision mixed-*), as Switch's
    "selective precision" (Fedus et al. 2021, sec. 2.4: the router's input cast to float32, its softmax
    and gates kept in float32, only the combined outputs in bfloat16); the model's type otherwise."""
    return np.dtype(np.float32) if np.dtype(dtype).itemsize == 2 else np.dtype(dtype)


def route(x, Wr, K: int, clock=None):
    """(p, top, gates): router probabilities (n x E), the K chosen experts per row (largest first,
    ties to the lower index) and their renormalised gates (n x K, rows sum to 1), in router_dtype.
    `clock`: the run's simulated clock (its runtime's), or None."""
    f = router_dtype(x.dtype)
    logits = x.astype(f, copy=False) @ Wr.astype(f, copy=False)
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    top = np.argsort(-p, axis=1, kind="stable")[:, :K]
    chosen = np.take_along_axis(p, top, axis=1)
    if clock is not None:
        clock.matmul(x.shape[0], x.shape[1], Wr.shape[1])
    return p, top, chosen / chosen.sum(axis=1, keepdims=True)


def capacity(C: float, K: int, N: int, E: int) -> int:
    """Token slots per expert: ceil(C * K * N / E) (Fedus et al. 2021, eq. 3, with K choices)."""
    return math.ceil(C * K * N / E)


def micro_rows(B: int, G: int, k: int) -> int:
    """Global rows of grad-accum micro-step k of G: np.array_split of the global batch (data.micro_steps),
    the first B mod G micro-steps one row longer. Capacity is per micro-step: ceil(C K N_k / E)."""
    return B // G + (1 if k < B % G else 0)


def histogram(top, E: int) -> np.ndarray:
    """Assignments per expert among these rows' top-k choices (int64, length E)."""
    return np.bincount(top.reshape(-1), minlength=E).astype(np.int64)


def kept_counts(H, cap: int) -> np.ndarray:
    """H: assignments per (data-parallel rank, expert), ranks in global row order. Kept ones: an
    expert fills its cap slots from rank 0's rows on, so rank d keeps min(H[d,e], cap - before)."""
    before = np.cumsum(H, axis=0) - H
    return np.clip(cap - before, 0, H)


def keep_mask(top, E: int, cap: int, before) -> np.ndarray:
    """(n x K) bool: which of these rows' assignments fit, given `before[e]` assignments to e from
    rows earlier in the global batch. Each row picks an expert at most once, so row-major order of
    (row, choice) is row order within every expert."""
    flat = top.reshape(-1)
    onehot = flat[:, None] == np.arange(E)
    position = np.cumsum(onehot, axis=0)[np.arange(flat.size), flat] - 1 + before[flat]
    return (position < cap).reshape(top.shape)


def aux_loss(p, f, alpha: float, N: int) -> tuple[float, np.ndarray]:
    """These rows' share of L_aux = alpha E sum_e f_e P_e, and its gradient w.r.t. their p
    (the shares of all ranks add up to L_aux, as the main loss's do)."""
    E = p.shape[1]
    share = alpha * E * float(f @ p.sum(axis=0)) / N
    return share, np.broadcast_to((alpha * E / N) * f, p.shape).astype(p.dtype)


def router_dlogits(dgates, dp_aux, p, top, gates):
    """dL/d(router logits), in p's type: the module docstring's renorm, aux and softmax lines."""
    S = np.take_along_axis(p, top, axis=1).sum(axis=1, keepdims=True)
    dchosen = (dgates - (dgates * gates).sum(axis=1, keepdims=True)) / S
    dp = dp_aux.copy()
    np.put_along_axis(dp, top, np.take_along_axis(dp, top, axis=1) + dchosen, axis=1)
    return p * (dp - (p * dp).sum(axis=1, keepdims=True))


def router_backward(dgates, dp_aux, p, top, gates, x, Wr, dWr, clock=None):
    """dL/dx through the router (the module docstring's renorm, aux and softmax lines); dWr += x^T dlogit.
    Computed in p's type (router_dtype); dWr gets the result rounded to its own type, dx is in p's."""
    dlogits = router_dlogits(dgates, dp_aux, p, top, gates)
    x, Wr = x.astype(p.dtype, copy=False), Wr.astype(p.dtype, copy=False)
    dWr += (x.T @ dlogits).astype(dWr.dtype, copy=False)
    if clock is not None:
        clock.matmul(x.shape[1], x.shape[0], Wr.shape[1])
        clock.matmul(x.shape[0], Wr.shape[1], x.shape[1])
    return dlogits @ Wr.T


# -- a serial reference: all experts on one process --------------------------------------------------


def serial_forward(x, Wr, experts, K, C, alpha, act, N=None):
    """y, aux loss share and a context, all E experts here (N: rows of the global batch)."""
    N = x.shape[0] if N is None else N
    E = Wr.shape[1]
    p, top, gates = route(x, Wr, K)
    H = histogram(top, E)
    keep = keep_mask(top, E, capacity(C, K, N, E), np.zeros(E, np.int64))
    aux, dp_aux = aux_loss(p, H / (N * K), alpha, N)
    y = np.zeros((x.shape[0], experts[0][0].shape[1]), x.dtype)
    parts = []
    for e, (W, b) in enumerate(experts):
        rows, slots = np.nonzero((top == e) & keep)
        h, ctx = layer_forward(Linear(0, W, b, None, None, act), x[rows])
        y[rows] += gates[rows, slots][:, None] * h
        parts.append((rows, slots, h, ctx))
    return y, aux, (x, p, top, gates, dp_aux, parts)


def serial_backward(dy, ctx, Wr, experts, act):
    """(dx, dWr, [(dW_e, db_e)]) of serial_forward."""
    x, p, top, gates, dp_aux, parts = ctx
    dx, dgates, dWr, grads = np.zeros_like(x), np.zeros(top.shape, x.dtype), np.zeros_like(Wr), []
    for (W, b), (rows, slots, h, c) in zip(experts, parts):
        dgates[rows, slots] = (dy[rows] * h).sum(axis=1)
        layer = Linear(0, W, b, np.zeros_like(W), np.zeros_like(b), act)
        dx[rows] += layer_backward(layer, c, gates[rows, slots][:, None] * dy[rows])
        grads.append((layer.dW, layer.db))
    dx += router_backward(dgates, dp_aux, p, top, gates, x, Wr, dWr)
    return dx, dWr, grads


def predict_logits(cfg, weights, x):
    """Logits from full weights: (W, b) per dense layer, (pack_flat, empty) per MoE layer; MoE
    layers route every row to its K experts with no capacity limit."""
    n, moe = len(weights), set(moe_layer_indices(len(weights)))
    for i, (W, b) in enumerate(weights):
        act = "none" if i == n - 1 else cfg.activation
        if i not in moe:
            x = ACTIVATIONS[act][0](x @ W + b)
            continue
        Wr, experts = unpack_flat(W, cfg.layers[i], cfg.layers[i + 1], cfg.experts)
        _, top, gates = route(x, Wr, cfg.top_k)
        y = np.zeros((x.shape[0], cfg.layers[i + 1]), x.dtype)
        for e, (We, be) in enumerate(experts):
            rows, slots = np.nonzero(top == e)
            y[rows] += gates[rows, slots][:, None] * ACTIVATIONS[act][0](x[rows] @ We + be)
        x = y
    return x
