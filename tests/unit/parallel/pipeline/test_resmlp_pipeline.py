"""--arch resmlp under pipeline parallelism: units cut into stages, the residual stream between them.

In-process: a unit's backward split into its B half (dL/dx) and W half (the weight gradients) adds up
to the fused backward, and the stages are the parameter-balanced split of the UNITS, found here by
trying every split. Over MPI, each schedule (naive, gpipe, 1f1b, interleaved, zb-h1) at S = 2 and 4
(interleaved at S = 4 on a model of 8 units), and --dp 2 --pp 2, trains the serial model
(float64 1e-12, one float32 run 1e-5); every boundary moves rows x d x bpe forward and back per
micro-batch; each rank's activation peak is the cost model's (also under --recompute full and
selective); on the simulated clock the cost model's step time agrees. Checkpoints cross layouts: saved
by dp2 x pp2, resumed on dp2, whose own checkpoint is resumed on pp2 with zb-h1.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import kernels
from simpar import costmodel as cm
from simpar.config import RunConfig
from simpar.model.mlp import deferred_weight_grads
from simpar.model.precision import HalfKernels
from simpar.model.resmlp import BlockUnit, LinearUnit
from simpar.parallel.base import HeldBytes, NonFiniteWatch
from simpar.parallel.pipeline import recompute
from simpar.parallel.pipeline.partition import partition_layers
from simpar.parallel.resmlp_stack import UnitStack
from simpar.runtime.context import Runtime

STEPS, BATCH = 6, 60

D = 96
LAYERS = [64, D, D, D, D, D, 10]  # 6 units: input projection, 4 blocks, output projection


def unit_params(widths: list[int]) -> list[int]:
    """Parameters per unit: projections fan_in * fan_out + fan_out, a block of width d 2d^2 + 4d
    (LayerNorm's gamma and beta, W1 and b1, W2 and b2)."""
    sizes = [a * b + b for a, b in zip(widths[:-1], widths[1:])]
    return [sizes[0], *(2 * d * d + 4 * d for d in widths[1:-2]), sizes[-1]]


def unit_split(widths: list[int], parts: int) -> list[tuple[int, int]]:
    """The README's rule by brute force: contiguous non-empty runs of units, the largest run's
    parameter count as small as possible; among equally good splits the later runs longest."""
    sizes = unit_params(widths)
    n, best = len(sizes), None
    for cuts in itertools.combinations(range(1, n), parts - 1):
        edges = [0, *cuts, n]
        counts = [b - a for a, b in zip(edges, edges[1:])]
        key = (max(sum(sizes[a:b]) for a, b in zip(edges, edges[1:])), [-c for c in reversed(counts)])
        best = min(best, (key, edges)) if best else (key, edges)
    return list(zip(best[1], best[1][1:]))


# -- in-process ------------------------------------------------------------------------------------


@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_backward_halves_add_up_to_the_fused_backward(act):
    rng = np.random.default_rng(0)
    block, proj = BlockUnit(1, 7, act), LinearUnit(0, 5, 7, "none")
    for unit, width, need_dx in ((block, 7, True), (proj, 5, False), (proj, 5, True)):
        flat = unit.init(3, np.float64) + 0.1 * rng.standard_normal(unit.size)
        x, dy = rng.standard_normal((4, width)), rng.standard_normal((4, 7))
        _, ctx = unit.forward(flat, x)
        fused, split = np.zeros(unit.size), np.zeros(unit.size)
        dx = unit.backward(flat, fused, ctx, dy, need_dx)
        dx_b, weight_pass = unit.backward_input(flat, split, ctx, dy, need_dx)
        assert not split.any()  # B touches no weight gradient ...
        weight_pass()  # ... W adds them all
        np.testing.assert_allclose(split, fused, rtol=1e-12, atol=1e-14)
        if need_dx:
            np.testing.assert_allclose(dx_b, dx, rtol=1e-12, atol=1e-14)
        else:
            assert dx is None and dx_b is None
    # Half precision: B and W round where the fused backward's HalfKernels do: the same numbers.
    saved, block.rt = block.rt, Runtime(kernels=HalfKernels(kernels.load("numpy"), np.float16))
    try:
        flat = block.init(3, np.float16)
        x, dy = (rng.standard_normal((4, 7)).astype(np.float16) for _ in range(2))
        _, ctx = block.forward(flat, x)
        fused, split = np.zeros(block.size, np.float16), np.zeros(block.size, np.float16)
        dx = block.backward(flat, fused, ctx, dy)
        dx_b, weight_pass = block.backward_input(flat, split, ctx, dy)
        weight_pass()
        np.testing.assert_array_equal(dx_b, dx)
        np.testing.assert_array_equal(split, fused)
    finally:
        block.rt = saved
    # What the zb-h1 pipeline does: backward inside deferred_weight_grads queues one W pass per unit.
    flat = block.init(3, np.float64)
    _, ctx = block.forward(flat, x := rng.standard_normal((4, 7)))
    grads = np.zeros(block.size)
    with deferred_weight_grads() as pending:
        block.backward(flat, grads, ctx, np.ones((4, 7)))
    assert len(pending) == 1 and not grads.any()


def test_selective_recompute_rebuilds_what_the_forward_kept():
    """A chunk [projection, block, block] keeps its input x (64 per row), the projection's output and
    block 1's (96 each: the next units' inputs) and both blocks' z1 (96 each); the backward's rebuilt
    Contexts equal the forward's array for array."""
    stack = UnitStack(RunConfig(layers=LAYERS, arch="resmlp", dtype="float64").model, [0, 1, 2])
    x = np.random.default_rng(2).standard_normal((5, 64))
    _, contexts = stack.forward(x, HeldBytes(), NonFiniteWatch())
    saved = recompute.save("selective", x, contexts)
    assert saved.held == 5 * (64 + 4 * D) * 8
    rebuilt = recompute.restore("selective", saved, stack)
    assert recompute.context_bytes(rebuilt) == recompute.context_bytes(contexts)
    for old, new in zip(contexts, rebuilt):
        old = old.arrays if hasattr(old, "arrays") else (old.x, old.z, old.y)
        new = new.arrays if hasattr(new, "arrays") else (new.x, new.z, new.y)
        for a, b in zip(old, new):
            np.testing.assert_array_equal(a, b)


def test_stages_are_runs_of_units_balanced_by_parameters():
    for widths in (LAYERS, [64, 32, 32, 32, 10], [8, 64, 64, 64, 64, 64, 64, 100], [784, 16, 16, 16, 10]):
        for parts in range(1, len(widths)):
            want = unit_split(widths, parts)
            assert partition_layers(widths, parts, arch="resmlp") == want, (widths, parts)
            spec = cm.Spec(widths=widths, batch=8, pp=parts, arch="resmlp")
            assert cm.stage_bounds(spec) == want, (widths, parts)
    assert unit_split(LAYERS, 4) == [(0, 2), (2, 3), (3, 4), (4, 6)]  # blocks weigh ~3x a projection
