"""Kernel backends for the hot path: the linear layer (forward + backward) and the reduce-add.

A backend is an object with

    linear_act_forward(x, W, b, act)                      -> (z, y)      z = x@W + b, y = act(z)
    linear_act_backward(dy, x, W, z, y, act, need_dx)     -> (dx, dW, db)
    reduce_add(dst, src)                                  dst += src (in place; inside collectives)
    sgd_update(w, g, v, lr, momentum)                     the optimizers' elementwise updates, in place
    adam_update(w, g, m, v, lr, beta1, beta2, eps, m_scale, v_scale)   (reference.py has the math)

`b` may be None (no bias). `act` is one of "relu", "tanh", "gelu", "none".

And what those calls move through memory besides their GEMMs, as counted from the backend's source
(elements read or written: the simulated clock charges these, simpar/model.py and optim.py; the cost
model writes the same table again, simpar/costmodel/passes.py):

    forward_passes(bias, act)        per element of z: bias add and activation after the GEMM
    backward_passes(act)             per element of dy: act' and the bias gradient's row sum
    optimizer_passes(name, momentum) per updated parameter: "sgd" or "adam"

Backends: "numpy" (the readable reference in reference.py; NumPy calls OpenBLAS), "numba" (kernels/cpu.py),
"cuda" (kernels/cuda.py). `load(name)` returns one; a run keeps the one it uses in its runtime
(simpar/runtime/context.py) and hands it to its layers: there is no process-wide choice.
"""

from __future__ import annotations

import numpy as np

from .reference import ACTIVATIONS, adam_update, linear_backward, linear_forward, sgd_update
from .reference import optimizer_passes as reference_optimizer_passes


class NumpyKernels:
    """The reference: plain NumPy, written the way the math reads."""

    name = "numpy"

    @staticmethod
    def linear_act_forward(x, W, b, act):
        z = linear_forward(x, W, b)
        return z, ACTIVATIONS[act][0](z)

    @staticmethod
    def linear_act_backward(dy, x, W, z, y, act, need_dx):
        return linear_backward(ACTIVATIONS[act][1](dy, z, y), x, W, need_dx)

    @staticmethod
    def linear_act_backward_into(dy, x, W, z, y, act, need_dx, dW, db):
        """As linear_act_backward, but WRITES dW and db into the arrays given (views of the flat
        gradient buffer) and returns dx only: the same operations, so the same bits, no temporaries."""
        dz = ACTIVATIONS[act][1](dy, z, y)
        np.matmul(x.T, dz, out=dW)
        np.sum(dz, axis=0, out=db)
        return dz @ W.T if need_dx else None

    @staticmethod
    def reduce_add(dst, src):
        np.add(dst, src, out=dst)

    sgd_update = staticmethod(sgd_update)
    adam_update = staticmethod(adam_update)

    # What reference.py's lines move, one temporary at a time (a ufunc reads its operands and writes
    # its result: `z += b` reads z, writes z = 2; `w -= t` reads w, t, writes w = 3).
    @staticmethod
    def forward_passes(bias: bool, act: bool) -> int:
        """z += b (2), then y = act(z) (2: relu and tanh; gelu's temporaries are not counted)."""
        return 2 * bias + 2 * act

    @staticmethod
    def backward_passes(act: bool) -> int:
        """dz = act'(dy, z) reads dy and z (or y), writes dz (3); identity returns dy itself (0);
        then db = dz.sum(0) reads dz (1)."""
        return 3 * act + 1

    optimizer_passes = staticmethod(reference_optimizer_passes)


_BACKENDS = {"numpy": NumpyKernels}


def available() -> list[str]:
    return ["numpy", "numba", "cuda"]


def load(name: str):
    """The backend called `name` (imported on first use: numba compiles, cuda needs a GPU or the
    simulator)."""
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


AUTO_MAX_MACS = 1 << 14  # see choose_auto


def choose_auto(widths, batch, dtype) -> str:
    """The backend `--kernels auto` picks: "numba" for tiny layers, "numpy" for everything else.

    The rule: use "numba" when every layer does at most 16384 (2**14) multiply-adds per call, i.e.
    batch * fan_in * fan_out <= 16384 for each consecutive pair in `widths` (with `batch` the rows
    one kernel call sees: the rank's micro-batch); otherwise use "numpy".

    Why: at that size a layer takes only microseconds and the cost is dominated by calls, not
    arithmetic. The Numba backend then does the whole forward (matmul, bias, activation) in one
    call and the whole backward in one more, where NumPy makes several: 1.3-1.8x faster. Above it
    the Numba backend uses OpenBLAS for the GEMMs and Numba only for the fused epilogues (bias +
    activation in one sweep; act' + bias gradient in one sweep): still 1.0-1.3x faster per call at
    batch 64-256, widths 128-1024, but a layer's time is then mostly the same OpenBLAS GEMM, so
    the saving is a few percent of a step -- not enough to be worth loading Numba for (a one-off
    ~0.5 s per process; ~20 s the very first time, when the kernels are compiled and cached).
    Measured on an AMD EPYC (Zen 3) core, one thread per rank, for float32 and float64 alike;
    `dtype` is accepted so that a dtype-specific threshold can be added without changing callers.
    Never "cuda": a GPU is only used when asked for. Cheap: no measurement, no Numba import.
    """
    if np.dtype(dtype) not in (np.float32, np.float64):
        return "numpy"
    widths = [int(w) for w in widths]
    macs = [int(batch) * a * b for a, b in zip(widths[:-1], widths[1:])]
    return "numba" if macs and max(macs) <= AUTO_MAX_MACS else "numpy"
