"""The reference operations, in plain NumPy, written the way the math reads.

Every backend (kernels/cpu.py, kernels/cuda.py) is tested against these; simpar's model (simpar/model.py)
builds its layers from them. Nothing here knows about ranks or layouts.

    y = act(x @ W + b)            x: (batch, fan_in)   W: (fan_in, fan_out)   b: (fan_out,)

Backward of one linear layer, given dL/dz for z = x @ W + b:
    dL/dx = dz @ W.T      dL/dW = x.T @ dz      dL/db = sum over the batch of dz
"""

from __future__ import annotations

import math

import numpy as np

# -- activations: forward(z) -> y, backward(dy, z, y) -> dz -------------------------------------


def relu(z):
    return np.maximum(z, 0)


def relu_backward(dy, z, y):
    return dy * (z > 0)


def tanh(z):
    return np.tanh(z)


def tanh_backward(dy, z, y):
    return dy * (1 - y * y)


# GELU, tanh approximation: the constants every backend uses (cpu.py and cuda.py import them).
GELU_C = math.sqrt(2.0 / math.pi)
GELU_A = 0.044715


def gelu(z):
    """GELU, tanh approximation (Hendrycks & Gimpel 2016, eq. in sec. 2)."""
    # z * z * z, not z**3: NumPy calls pow() for a float32 power, ~100x slower (measured: 90 ms vs 0.8 ms
    # on 2048 x 256), and a transformer MLP applies GELU to 4h features of every token
    return 0.5 * z * (1 + np.tanh(GELU_C * (z + GELU_A * (z * z * z))))


def gelu_backward(dy, z, y):
    inner = GELU_C * (z + GELU_A * (z * z * z))
    t = np.tanh(inner)
    dinner = GELU_C * (1 + 3 * GELU_A * z * z)
    return dy * (0.5 * (1 + t) + 0.5 * z * (1 - t * t) * dinner)


def identity(z):
    return z


def identity_backward(dy, z, y):
    return dy


ACTIVATIONS = {
    "relu": (relu, relu_backward),
    "tanh": (tanh, tanh_backward),
    "gelu": (gelu, gelu_backward),
    "none": (identity, identity_backward),
}


# -- linear layer ----------------------------------------------------------------------------------


def linear_forward(x, W, b=None):
    """z = x @ W + b (b=None: no bias -- a row-parallel shard adds its bias after the all-reduce)."""
    z = x @ W
    if b is not None:
        z += b  # in place: one temporary fewer than x @ W + b
    return z


def linear_backward(dz, x, W, need_dx=True):
    """(dx, dW, db) for z = x @ W + b. The first layer skips dx (nothing upstream wants it)."""
    dx = dz @ W.T if need_dx else None
    return dx, x.T @ dz, dz.sum(axis=0)


# -- optimizer updates (elementwise, in place; simpar/optim.py holds the state and calls these) --------


def sgd_update(w, g, v, lr, momentum):
    """SGD with heavy-ball momentum, as PyTorch's:  v <- mu*v + g ;  w <- w - lr*v  (v is None: w -= lr*g).
    Every constant is cast to w's dtype first, so float32 stays float32 (no silent float64 promotion)."""
    t = w.dtype.type
    if v is not None:
        v *= t(momentum)
        v += g
        g = v
    w -= t(lr) * g


def adam_update(w, g, m, v, lr, beta1, beta2, eps, m_scale, v_scale):
    """Adam (Kingma & Ba 2015, Algorithm 1): m, v moving averages of g and g^2; m_scale = 1/(1-beta1^t) and
    v_scale = 1/(1-beta2^t) the bias corrections;  w <- w - lr * m*m_scale / (sqrt(v*v_scale) + eps)."""
    t = w.dtype.type
    m *= t(beta1)
    m += t(1 - beta1) * g
    v *= t(beta2)
    v += t(1 - beta2) * (g * g)
    w -= t(lr) * (m * t(m_scale)) / (np.sqrt(v * t(v_scale)) + t(eps))


def optimizer_passes(name: str, momentum: bool) -> int:
    """Elements the two updates above read or write per parameter, one ufunc at a time (each reads
    its operands and writes its result; the simulated clock charges this, kernels/__init__.py):
    sgd_update: v *= mu (2), v += g (3), t = lr*v (2), w -= t (3) -- without momentum only the last
    two. adam_update: m *= b1 (2), t = c*g (2), m += t (3), v *= b2 (2), t = g*g (2), t = c*t (2),
    v += t (3), then w -= lr*(m*ms) / (sqrt(v*vs) + eps): five one-operand temporaries (2 each),
    the division (3) and the update (3) = 16; 32 in all."""
    return {"sgd": 10 if momentum else 5, "adam": 32}[name]
