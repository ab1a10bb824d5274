"""Helpers every test module shares: a run with its metrics and weights, the serial reference runs
(cached for the whole session), "same model" checks, and the np.array_split sizes written out.

Expected values in the tests come from formulas written in the tests or from simpar.costmodel,
never from the module under test; `split_sizes` is the one chunk rule the tests write down.
How jobs are launched (mpiexec, environment) is tests/mpiutil.py's.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from tests.mpiutil import run_mpi


def numeric_grad(f, x, eps=1e-6):
    """Central differences of the scalar f() with respect to every element of x (changed in place,
    restored): the finite-difference reference every explicit backward is checked against."""
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + eps
        up = f()
        x[i] = old - eps
        down = f()
        x[i] = old
        g[i] = (up - down) / (2 * eps)
    return g


DIGITS = [64, 128, 128, 128, 10]  # the default model (--dataset digits)


def layer_sizes(widths: list[int]) -> list[int]:
    """Parameters of each layer, W and b: fan_in * fan_out + fan_out."""
    return [a * b + b for a, b in zip(widths[:-1], widths[1:])]


def split_sizes(n: int, p: int) -> list[int]:
    """Sizes of np.array_split(range(n), p): the first n % p chunks hold one element more."""
    return [n // p + (i < n % p) for i in range(p)]


def stage_split(widths: list[int], S: int, stage_layers=None) -> list[tuple[int, int]]:
    """[(first layer, one past last)] per stage, by the rule the README states, found by trying every
    split: contiguous non-empty stages, the largest stage's parameter count as small as possible;
    among equally good splits, the last stage takes the most layers, then the one before it, ...
    `stage_layers` (--stage-layers) gives the counts directly."""
    sizes = layer_sizes(widths)
    n = len(sizes)
    if stage_layers is None:
        best = None
        for cuts in itertools.combinations(range(1, n), S - 1):
            edges = [0, *cuts, n]
            counts = [b - a for a, b in zip(edges, edges[1:])]
            largest = max(sum(sizes[a:b]) for a, b in zip(edges, edges[1:]))
            key = (largest, [-c for c in reversed(counts)])
            best = min(best, (key, counts)) if best else (key, counts)
        stage_layers = best[1]
    edges = list(itertools.accumulate(stage_layers, initial=0))
    return list(zip(edges, edges[1:]))


def train_json(n: int, args: list[str], tmp_path, name: str = "m", timeout: float = 120) -> dict:
    """Run `simpar train` on n ranks with --metrics-out and --weights-out; return the metrics dict
    with the final weights loaded under key "weights" (list of (W, b))."""
    metrics = Path(tmp_path) / f"{name}.json"
    weights = Path(tmp_path) / f"{name}.npz"
    res = run_mpi(
        n,
        ["train", *args, "--quiet", "--metrics-out", str(metrics), "--weights-out", str(weights)],
        timeout=timeout,
    )
    assert res.returncode == 0, (
        f"exit {res.returncode}\nSTDOUT:\n{res.stdout[-3000:]}\nSTDERR:\n{res.stderr[-3000:]}"
    )
    out = json.loads(metrics.read_text())
    with np.load(weights) as z:
        out["weights"] = [(z[f"W{i}"], z[f"b{i}"]) for i in range(len(z.files) // 2)]
    return out


@pytest.fixture(scope="session")
def serial(tmp_path_factory):
    """serial(args) -> metrics of `simpar train ARGS` on one process; each distinct argument list
    trains once per session, whichever module asks first."""
    cache: dict = {}

    def get(args) -> dict:
        key = tuple(args)
        if key not in cache:
            cache[key] = train_json(1, list(args), tmp_path_factory.mktemp("serial"))
        return cache[key]

    return get


def assert_same_model(run: dict, ref: dict, rtol: float) -> None:
    """Same losses at every step (relative rtol) and the same final weights: every layer's W and b
    within rtol of the largest entry of the reference's, same shapes and dtype.

    Biases start at zero, so a layer's may still be tiny after a few steps; 1e-3 floors their scale
    so float32 rounding of a near-zero bias is not read as a different model."""
    np.testing.assert_allclose(run["losses"], ref["losses"], rtol=rtol, atol=0)
    assert len(run["weights"]) == len(ref["weights"])
    for i, ((W, b), (Wr, br)) in enumerate(zip(run["weights"], ref["weights"])):
        assert W.shape == Wr.shape and b.shape == br.shape, f"layer {i}: shapes differ"
        assert W.dtype == Wr.dtype and b.dtype == br.dtype, f"layer {i}: dtypes differ"
        w_err = np.abs(W - Wr).max() / np.abs(Wr).max()
        b_err = np.abs(b - br).max() / max(np.abs(br).max(), 1e-3) if br.size else 0.0  # no b: resmlp, MoE
        assert w_err <= rtol, f"layer {i}: W off by {w_err:.3g} relative"
        assert b_err <= rtol, f"layer {i}: b off by {b_err:.3g} relative"
