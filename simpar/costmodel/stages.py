"""Which layers each pipeline stage (or model chunk) gets: the cost model's own statement of the rule
(stage_bounds), found by bisection, not by the executor's dynamic programme (parallel/partition.py).
If the two ever disagree, `prediction_mismatches` says so (tests/mpi/costmodel/test_costmodel.py gives the
executor an unbalanced split to prove it). `spec` is a Spec (spec.py, whose Shape is built from stage_bounds).
"""

from __future__ import annotations

from .order import n_chunks


def stage_bounds(spec) -> list[tuple[int, int]]:
    """[(first layer, one past last)] per pipeline stage -- per model chunk for the interleaved
    schedule, whose S*V chunks are cut by the same rule (chunk c then runs on stage c mod S).

    The rule (docs/strategies.md): contiguous layers, balanced by parameter count -- the split whose largest
    stage holds the fewest parameters; among equally good splits, later stages take as many layers as
    they can. Found here by bisection on that largest stage (`_min_bottleneck`), then filled from the
    back; `--stage-layers` overrides it. For resmlp the "layers" are its units, each weighed by
    its parameters (unit_sizes: a block's 2d^2 + 4d).
    """
    counts = spec.stage_layers or balanced_counts(
        unit_sizes(spec), n_chunks(spec.schedule, spec.pp, spec.virtual_stages)
    )
    bounds, lo = [], 0
    for c in counts:
        bounds.append((lo, lo + c))
        lo += c
    return bounds


def _parts_needed(costs: list[int], cap: int) -> int:
    """Fewest contiguous parts of `costs` with every part's sum <= cap (greedy: fill each part fully)."""
    parts, current = 1, 0
    for c in costs:
        if current + c > cap:
            parts, current = parts + 1, 0
        current += c
    return parts


def _min_bottleneck(costs: list[int], S: int) -> int:
    """The smallest cap such that `costs` splits into at most S contiguous parts of sum <= cap."""
    lo, hi = max(costs), sum(costs)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if _parts_needed(costs, mid) <= S else (mid + 1, hi)
    return lo


def balanced_counts(costs: list[int], S: int) -> list[int]:
    """Layers per stage: S non-empty contiguous parts, the largest part as small as possible, the
    last parts as long as possible. From the back, each stage takes the most layers that keep its sum
    within the cap and leave one layer for each stage before it. (Taking the most is also what keeps
    the rest splittable: greedy maximal parts from the back need the fewest parts.)"""
    cap = _min_bottleneck(costs, S)
    counts, end = [], len(costs)
    for k in range(S, 0, -1):  # k stages left, this one ends at `end`
        start, total = end, 0
        while start - 1 >= k - 1 and total + costs[start - 1] <= cap:
            start -= 1
            total += costs[start]
        counts.append(end - start)
        end = start
    return counts[::-1]


def unit_sizes(spec) -> list[int]:
    """Parameters per unit. MLP: each layer's fi*fo + fo. resmlp (simpar/resmlp.py): the input and
    output projections like layers, each residual block of width d 2d^2 + 4d (LayerNorm's gamma and
    beta, W1 and b1, W2 and b2)."""
    W = spec.widths
    sizes = [a * b + b for a, b in zip(W[:-1], W[1:])]
    if spec.arch == "resmlp":
        sizes[1:-1] = [2 * d * d + 4 * d for d in W[1:-2]]
    return sizes
