"""Context parallelism's own units in-process (parallel/context.py), no MPI.

The tests that launch real cp runs: tests/mpi/parallel/test_context.py, tests/mpi/parallel/pipeline/
test_cp_pipeline.py, and on the simulated clock tests/mpi/runtime/test_cp_pp_simclock.py.
"""

from __future__ import annotations

import numpy as np

from simpar.model.mlp import deferred_weight_grads
from simpar.model.ring_attention import chunk_positions
from simpar.parallel.context import PositionedEmbedding


def test_cp_embedding_leaves_its_whole_backward_to_the_w_pass():
    """Under a zero-bubble B pass (zb-h1, zb-v) the cp rank's embedding, like gpt.py's, has no B: it
    queues one W closure and writes no gradient, and the closure gives the plain backward's gradient
    exactly (issue 24: in B it was charged on the wrong side of the schedule and its bucket's hook never
    fired)."""
    V, s, h = 11, 8, 4
    unit = PositionedEmbedding(V, s, h, chunk_positions(1, 2, s))  # cp rank 1 of 2: tokens 2,3 and 4,5
    rng = np.random.default_rng(0)
    flat = unit.init(1, np.float64)
    tokens = rng.integers(0, V, (3, s // 2))
    x, ctx = unit.forward(flat, tokens)
    dy = rng.standard_normal(x.shape)
    plain = np.zeros_like(flat)
    unit.backward(flat, plain, ctx, dy)
    grads = np.zeros_like(flat)
    with deferred_weight_grads() as w_passes:
        assert unit.backward(flat, grads, ctx, dy) is None
    assert len(w_passes) == 1 and not grads.any()  # B alone: nothing yet
    w_passes[0]()
    np.testing.assert_array_equal(grads, plain)
    assert plain.any()
