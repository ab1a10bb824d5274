"""Memory passes per kernel backend: the simulated clock charges what the backend that ran moves
(kernels/: forward_passes, backward_passes, optimizer_passes), the cost model writes the same table
again without importing kernels/ (costmodel/passes.py); the two must agree, and a run on the Numba
kernels is predicted exactly as it is simulated.
"""

from __future__ import annotations

import io
import itertools
import json
from contextlib import redirect_stdout

import numpy as np
import pytest

import kernels
from simpar import costmodel as cm
from simpar.costmodel import hardware, passes, work
from simpar.model import optim
from simpar.model.precision import HalfKernels
from simpar.runtime.context import Runtime

BACKENDS = ["numpy", "numba", "cuda"]


@pytest.mark.parametrize("name", BACKENDS)
def test_the_cost_models_table_is_the_kernels_own(name):
    backend = kernels.load(name)
    for kern in (backend, HalfKernels(backend, np.float16)):  # mixed precision: the inner backend's
        for bias, act in itertools.product((False, True), repeat=2):
            assert kern.forward_passes(bias, act) == passes.forward_passes(name, bias, act), (bias, act)
        for act in (False, True):
            assert kern.backward_passes(act) == passes.backward_passes(name, act), act
        for optimizer, momentum in (("sgd", False), ("sgd", True), ("adam", False), ("adam", True)):
            spec = cm.Spec([4, 8, 2], 8, optimizer=optimizer, momentum=0.9 * momentum, kernels=name)
            expected = kern.optimizer_passes(optimizer, momentum)
            assert work.optimizer_passes(spec) == expected, (optimizer, momentum)
    # `auto` without a run (plan, the tour's table) is the reference's
    assert work.optimizer_passes(cm.Spec([4, 8, 2], 8, kernels="auto")) == 10


class Recorder:
    """A stand-in clock: the bytes the optimizer streams."""

    def __init__(self):
        self.bytes = 0

    def stream(self, nbytes):
        self.bytes += nbytes


def charged(name: str, make) -> int:
    clock = Recorder()
    optimizer = make(Runtime(clock=clock, kernels=kernels.load(name)))  # the run's kernels and clock
    w = [np.ones(1000, np.float32), np.ones(24, np.float32)]
    optimizer.step(w, [np.full_like(a, 0.5) for a in w])
    return clock.bytes


@pytest.mark.parametrize(
    "make, numpy_passes, numba_passes",
    [
        # NumPy: t = lr*g (read g, write t), w -= t (read w, t; write w). Numba: read w, g; write w.
        (lambda rt: optim.SGD(0.1, 0.0, rt), 2 + 3, 2 + 1),
        # NumPy: v *= mu (2), v += g (3), then as above (5). Numba: read w, g, v; write v, w.
        (lambda rt: optim.SGD(0.1, 0.9, rt), 2 + 3 + 2 + 3, 3 + 2),
        # NumPy: m's two lines 2 + 2 + 3, v's 2 + 2 + 2 + 3, the update's five one-operand temporaries
        # 5 x 2, the division 3 and w -= 3. Numba: read w, g, m, v; write m, v, w.
        (lambda rt: optim.Adam(0.1, rt=rt), 7 + 9 + 10 + 3 + 3, 4 + 3),
    ],
)
def test_optimizer_charges_differ_between_numpy_and_numba_by_the_passes(make, numpy_passes, numba_passes):
    nbytes = (1000 + 24) * 4
    assert charged("numpy", make) == numpy_passes * nbytes
    assert charged("numba", make) == numba_passes * nbytes
    assert charged("numpy", make) - charged("numba", make) == (numpy_passes - numba_passes) * nbytes


def test_plan_charges_the_kernels_asked_for():
    """plan --kernels: the default is the reference; numba's fused sweeps make the same step cheaper by
    exactly its passes (SGD with momentum: 10 - 5 per parameter; forward 4 - 3 and backward 4 - 3 per
    hidden element, the logits' 2 - 2 and 1 - 2), in the step's compute."""
    from simpar.cli.plan import plan_main
    from simpar.errors import SimparError

    def step(*extra) -> float:
        out = io.StringIO()
        with redirect_stdout(out):
            assert (
                plan_main(["--layers", "6,8,4", "--batch", "16", "--json", "--hardware", "dgx-h100", *extra])
                == 0
            )
        return json.loads(out.getvalue())["time"]["step_s"]

    assert step() == step("--kernels", "numpy")
    P, rows, hidden, logits = 6 * 8 + 8 + 8 * 4 + 4, 16, 8, 4
    saved = (10 - 5) * P * 4 + rows * (
        (4 - 3) * hidden + (4 - 3) * hidden + (2 - 2) * logits + (1 - 2) * logits
    ) * 4
    per_byte = hardware.load("dgx-h100").gamma / 3  # a byte moved: a third of numpy.add's reduced byte
    assert step() - step("--kernels", "numba") == pytest.approx(saved * per_byte, rel=1e-9)
    with pytest.raises(SimparError, match="invalid choice"):
        plan_main(["--kernels", "bogus"])
