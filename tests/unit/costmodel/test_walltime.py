"""What the wall-clock terms of the cost model count, against closed forms written here.

The first backward of a step after a lazy zero_grad (plain-MLP data parallelism, model.ParamStore)
writes dW, db instead of adding to them: the simulated clock charges, and the cost model predicts, no
accumulation pass for it when the GEMM writes into the gradient buffer, a copy (2ab + 2b) when the
kernels cannot, and the usual read-read-write (3ab + 3b) for every later micro-batch.
"""

from __future__ import annotations

import pytest

from kernels import NumpyKernels
from simpar import costmodel as cm
from simpar.costmodel.spec import Shape, micro_rows
from simpar.costmodel.work import elementwise_bytes, first_grads
from simpar.model.mlp import charge_backward
from tests.conftest import layer_sizes


class Recorder:
    """A stand-in clock: adds up what charge_backward streams and multiplies."""

    def __init__(self):
        self.bytes, self.flops = 0, 0

    def stream(self, nbytes):
        self.bytes += nbytes

    def matmul(self, m, k, n):
        self.flops += 2 * m * k * n


@pytest.mark.parametrize("grads", ["add", "into", "copy"])
def test_charge_backward_counts_how_gradients_reach_the_buffer(grads):
    r, a, b, bpe = 7, 5, 3, 4
    clock = Recorder()
    charge_backward(clock, NumpyKernels, r, a, b, True, True, "relu", bpe, grads)  # NumPy's passes
    per_row = 3 * r * b + r * b  # activation' (read dy, z; write dz) and db's row sum
    into_buffer = {"add": 3 * a * b + 3 * b, "into": 0, "copy": 2 * a * b + 2 * b}[grads]
    assert clock.bytes == (per_row + into_buffer) * bpe
    assert clock.flops == 2 * (2 * r * a * b)


def test_first_grads_follows_the_layout_and_kernels():
    widths = [6, 8, 4]
    assert first_grads(cm.Spec(widths, 8)) == "into"
    assert first_grads(cm.Spec(widths, 8, dp=2, kernels="numba")) == "into"
    assert first_grads(cm.Spec(widths, 8, kernels="cuda")) == "copy"
    assert first_grads(cm.Spec(widths, 8, precision="mixed")) == "copy"
    for layout in ({"tp": 2}, {"pp": 2}, {"dp": 2, "zero": 1}, {"arch": "resmlp"}):
        assert first_grads(cm.Spec([6, 8, 8, 4], 8, **layout)) == "add"


@pytest.mark.parametrize("accum", [1, 3])
def test_elementwise_bytes_leave_out_the_first_accumulation(accum):
    """Serial SGD with momentum, fp32: per row, forward bias + relu 4h (the logits 2c), backward
    relu' + db 4h (c); the loss 6c; once per micro-batch but the first, dW, db added in (3P); the
    optimizer's 10 sweeps over P."""
    a, h, c, B = 6, 8, 4, 12
    spec = cm.Spec([a, h, c], B, grad_accum=accum)
    P = sum(layer_sizes([a, h, c]))
    per_row = (4 * h + 2 * c) + (4 * h + c)
    expected = (per_row * B + 3 * P * (accum - 1)) * 4 + 6 * c * 4 * B + 10 * P * 4
    shape = Shape.of(spec)
    got = elementwise_bytes(spec, 0, 2, shape.kinds[0], micro_rows(spec, 0), P)
    assert got == expected
    assert cm.predict_rank(spec, 0)["elementwise_bytes"] == expected


def test_fit_link_recovers_alpha_and_beta_from_two_ring_times():
    """A ring all-reduce of n float32 on 2 ranks (n even): 2 rounds, n/2 elements each way per round
    (n through the link), n/2 reduced: t = 2 alpha + 4 n beta + 4 (n/2) gamma."""
    from simpar.bench.calibrate import RING_SIZES, fit_link

    alpha, beta, gamma = 40e-6, 1 / 6e9, 1 / 10e9
    ring = {size: 2 * alpha + 4 * (size // 4) * beta + 4 * (size // 8) * gamma for size in RING_SIZES}
    got_alpha, got_beta = fit_link(ring, gamma)
    assert got_alpha == pytest.approx(alpha, rel=1e-9)
    assert got_beta == pytest.approx(beta, rel=1e-9)
    assert fit_link({size: 1e-9 for size in RING_SIZES}, gamma) is None  # noise: keep the ping-pong
