"""Memory passes per kernel backend: the elements each backend's layer and optimizer calls read or
write besides their GEMMs -- written down again here, as a table, from each backend's source
(kernels/reference.py for numpy, kernels/cpu.py for numba, kernels/cuda.py for cuda).

The simulated clock reads the same counts from the backend object that ran (kernels/__init__.py:
forward_passes, backward_passes, optimizer_passes); the cost model may not import kernels/
(tests/unit/test_layers.py), so it keeps its own copy, and tests/unit/costmodel/test_passes.py holds
the two equal for every backend, optimizer and momentum. Why the counts differ:

  numpy  one ufunc per operation, each a pass: z += b (read z, write z: 2), y = act(z) (2); in
         backward act' (read dy, z; write dz: 3) and db = dz.sum(0) (1). SGD with momentum 10, without
         5; Adam 32 (the temporaries of its one-line update included).
  numba  the "GEMM + fused epilogue" design: one sweep reads z, writes z += b and y (3); in backward
         one sweep reads dy (and z), writes dz and sums db on the way (2 + act). The optimizers are
         single fused loops: SGD 3 (5 with momentum: v too), Adam 7 (read w, g, m, v; write m, v, w).
  cuda   the bias and activation ride in the tiled matmul's epilogue: only y is one more write (act);
         backward: act_backward (2 + act) and column_sum reading dz again (1). The optimizer is NumPy's
         on the host, so numpy's counts. Host <-> device copies are not counted: a GPU profile models
         tensors that stay on the device, as a real framework keeps them.

`auto` is numpy's, as a run resolves it (kernels.AUTO); a run predicts with the backend it resolved
(report/postrun.py). GELU's extra NumPy temporaries are not counted (relu and tanh: 2 per pass as
above).
"""

from __future__ import annotations

BACKENDS = ("numpy", "numba", "cuda")  # the kernel backends whose passes this table knows


def backend(spec) -> str:
    """The backend whose passes apply: the run's, or numpy for `auto` and unknown names."""
    return spec.kernels if spec.kernels in ("numba", "cuda") else "numpy"


def forward_passes(name: str, bias: bool, act: bool) -> int:
    """Per element of z: the bias add and the activation after the GEMM."""
    if name == "numba":
        return (1 if bias or act else 0) + bias + act
    if name == "cuda":
        return int(act)
    return 2 * bias + 2 * act


def backward_passes(name: str, act: bool) -> int:
    """Per element of dy: the activation's derivative and the bias gradient's row sum."""
    return {"numba": 2 + act, "cuda": 3 + act}.get(name, 3 * act + 1)


def optimizer_passes(name: str, optimizer: str, momentum: bool) -> int:
    """Per updated parameter, one optimizer step (zeroing the gradients is not part of it)."""
    if name == "numba":
        return {"sgd": 5 if momentum else 3, "adam": 7}[optimizer]
    return {"sgd": 10 if momentum else 5, "adam": 32}[optimizer]


def backward_backend(spec) -> str:
    """Whose backward passes apply: the zero-bubble schedules split every backward into NumPy's own
    B and W halves (model.backward_input, backward_weight) whatever the kernels, so numpy's there."""
    return "numpy" if spec.pp > 1 and spec.schedule in ("zb-h1", "zb-v") else backend(spec)
