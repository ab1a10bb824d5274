"""Kernel backends for the hot path: the linear layer (forward + backward) and the reduce-add.

A backend is an object with

    linear_act_forward(x, W, b, act)                      -> (z, y)      z = x@W + b, y = act(z)
    linear_act_backward(dy, x, W, z, y, act, need_dx)     -> (dx, dW, db)
    reduce_add(dst, src)                                  dst += src (in place; inside collectives)

`b` may be None (no bias). `act` is one of "relu", "tanh", "gelu", "none".

Backends: "numpy" (the readable reference; NumPy calls OpenBLAS), "numba" (kernels/cpu.py),
"cuda" (kernels/cuda.py). `use(name)` picks one for the whole process; `active()` returns it.
"""
from __future__ import annotations

import numpy as np


class NumpyKernels:
    """The reference: plain NumPy, written the way the math reads."""
    name = "numpy"

    @staticmethod
    def linear_act_forward(x, W, b, act):
        from simpar.model import ACTIVATIONS
        z = x @ W
        if b is not None:
            z += b
        y = ACTIVATIONS[act][0](z)
        return z, y

    @staticmethod
    def linear_act_backward(dy, x, W, z, y, act, need_dx):
        from simpar.model import ACTIVATIONS
        dz = ACTIVATIONS[act][1](dy, z, y)
        dx = dz @ W.T if need_dx else None
        return dx, x.T @ dz, dz.sum(axis=0)

    @staticmethod
    def reduce_add(dst, src):
        np.add(dst, src, out=dst)


_BACKENDS = {"numpy": NumpyKernels}
_active = NumpyKernels


def available() -> list[str]:
    return ["numpy", "numba", "cuda"]


def load(name: str):
    """The backend called `name` (imported on first use: numba compiles, cuda needs a GPU or the simulator)."""
    if name not in _BACKENDS:
        if name == "numba":
            from . import cpu
            _BACKENDS["numba"] = cpu.NumbaKernels
        elif name == "cuda":
            from . import cuda
            _BACKENDS["cuda"] = cuda.CudaKernels
        else:
            raise ValueError(f"unknown kernels {name!r}; choose from {', '.join(available())}")
    return _BACKENDS[name]


def use(name: str):
    """Make `name` the backend for this process (and the reduce inside simpar's collectives)."""
    global _active
    _active = load(name)
    try:
        from simpar import collectives
        collectives.set_reduce_kernel(_active.reduce_add)
    except ImportError:
        pass
    return _active


def active():
    return _active
