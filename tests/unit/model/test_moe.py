"""Mixture of experts in-process: the layer's backward against finite differences, capacity, aux loss.

The tests that launch real MPI jobs: tests/mpi/model/test_moe.py.
"""

from __future__ import annotations

import math

import numpy as np

from simpar.model import moe
from tests.conftest import numeric_grad

E, K, B, D_IN = 4, 2, 64, 128  # the default digits model: MoE layers 1 and 2 are 128 -> 128


def _objective(x, Wr, experts, R, K, C, alpha, act):
    """A scalar of the layer's output: sum(y * R) + the aux loss (so both paths are differentiated)."""
    y, aux, ctx = moe.serial_forward(x, Wr, experts, K, C, alpha, act)
    return float((y * R).sum()) + aux, y, ctx


def test_backward_matches_finite_differences_with_drops():
    rng = np.random.default_rng(0)
    n, d_in, d_out, E, K, C, alpha = 12, 5, 4, 4, 2, 0.6, 0.3
    x = rng.standard_normal((n, d_in))
    Wr = rng.standard_normal((d_in, E))
    experts = [(rng.standard_normal((d_in, d_out)), rng.standard_normal(d_out)) for _ in range(E)]
    R = rng.standard_normal((n, d_out))
    f0, y, ctx = _objective(x, Wr, experts, R, K, C, alpha, "tanh")
    _, p, top, gates, _, parts = ctx
    kept = sum(len(rows) for rows, *_ in parts)
    cap = math.ceil(C * K * n / E)  # 4 slots per expert for 24 assignments: some must drop
    assert kept < n * K and all(len(rows) <= cap for rows, *_ in parts)
    np.testing.assert_allclose(gates.sum(axis=1), 1.0, rtol=1e-14)
    dx, dWr, grads = moe.serial_backward(R, ctx, Wr, experts, "tanh")

    def numeric(arr):
        return numeric_grad(lambda: _objective(x, Wr, experts, R, K, C, alpha, "tanh")[0], arr)

    np.testing.assert_allclose(dx, numeric(x), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(dWr, numeric(Wr), rtol=1e-6, atol=1e-8)
    for (W, b), (dW, db) in zip(experts, grads):
        np.testing.assert_allclose(dW, numeric(W), rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(db, numeric(b), rtol=1e-6, atol=1e-8)


def test_capacity_keeps_earliest_rows_and_aux_loss_formula():
    # Expert 0 chosen by every row: the first cap rows keep it, in global row order across ranks.
    top = np.array([[0, 1], [0, 2], [0, 1], [0, 3], [0, 2]])
    E, cap = 4, 3
    keep = moe.keep_mask(top, E, cap, np.zeros(E, np.int64))
    assert keep[:, 0].tolist() == [True, True, True, False, False] and keep[:, 1].all()
    # The same rows split over two ranks (2 + 3 rows): rank 1 knows rank 0's counts.
    H = np.stack([moe.histogram(top[:2], E), moe.histogram(top[2:], E)])
    assert moe.kept_counts(H, cap).tolist() == [[2, 1, 1, 0], [1, 1, 1, 1]]
    keep1 = moe.keep_mask(top[2:], E, cap, H[0])
    assert (keep1 == keep[2:]).all()
    # Switch eq. 4: alpha * E * sum f_e P_e; uniform routing gives alpha exactly.
    p = np.full((6, 4), 0.25)
    share, grad = moe.aux_loss(p, np.full(4, 0.25), alpha=0.01, N=6)
    assert abs(share - 0.01) < 1e-15 and np.allclose(grad, 0.01 * 4 * 0.25 / 6)


def test_plan_predicts_balanced_all_to_all_and_expert_memory(capsys):
    import json

    from simpar.cli.plan import plan_main

    args = ["--batch", "64", "--dp", "4", "--experts", "4", "--top-k", "2", "--ep", "2", "--json"]
    plan_main(args + ["--hardware", "ib-cluster"])
    pred = json.loads(capsys.readouterr().out)
    D, P, bpe, h, layers = 4, 2, 4, 128, 2
    balanced = (P - 1) / P * (B / D) * K * h * bpe * layers  # per rank per step, each of the four ops
    for rank in pred["comm"]["ranks"]:
        for op in ("ep-dispatch", "ep-combine", "ep-combine-grad", "ep-dispatch-grad"):
            assert rank["by_op"][f"activation/{op}"]["sent"] == balanced
        assert rank["sent"]["activation"] == 4 * balanced
    dense = 64 * 128 + 128 + 128 * 10 + 10 + 2 * 128 * E
    assert pred["memory"]["ranks"][0]["params"] == (dense + 2 * (E // P) * (128 * 128 + 128)) * bpe
    # An imbalance of 3 is capped at the capacity factor C = 1.25: the hot expert's owner returns
    # (C + E/P - 1)/(E/P) times the balanced rows in ep-combine.
    plan_main(args + ["--imbalance", "3", "--capacity-factor", "1.25"])
    hot = json.loads(capsys.readouterr().out)["comm"]["ranks"][0]["by_op"]["activation/ep-combine"]["sent"]
    assert hot == round(balanced * (1.25 + 1) / 2)
    import pytest

    from simpar.config import SimparError

    with pytest.raises(SimparError, match="--compare and --sweep do not cover --experts"):
        plan_main(args + ["--compare", "--world", "4"])
