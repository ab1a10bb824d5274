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


# What `--kernels auto` runs on a CPU: NumPy's (OpenBLAS) kernels, whatever the shapes. Never "cuda":
# a GPU is used only when asked for. Numba's kernels are there to read and to ask for (--kernels numba),
# not chosen by default, because they did not repay their start-up at the sizes the old rule gave them
# (<= 16,384 multiply-adds a kernel call, where one fused call stands in for NumPy's several). Measured
# by `python benchmarks/auto_kernels.py` (one rank, one thread, NumPy the peer in the same run;
# three runs on this 2-core machine, 2026-12-08):
#   - start: every process of a run takes 0.53-0.60 s longer with them (importing Numba, its
#     compiler's set-up, each kernel from the on-disk cache; about 20 s the very first time);
#   - step: an MLP 8-32-32-4 on 16 rows 0.98-1.26x NumPy's step (at best repaid after ~360,000
#     steps); a GPT of 2 blocks, h = 16, on 16 token rows 1.07-1.10x (slower: never repaid).
# Above that size the GEMMs are OpenBLAS's either way and the fused epilogues save a few percent of a
# step (docs/performance.md): not enough either.
AUTO = "numpy"
