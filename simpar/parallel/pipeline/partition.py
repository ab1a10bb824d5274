"""Which layers go on which pipeline stage (or model chunk): contiguous runs balanced by parameters.

`partition_layers(widths, n)` cuts the model into n contiguous parts -- n = S stages, or S*V model
chunks for the interleaved schedule (chunk c then runs on rank c mod S, schedules.py). A layer's matmul
work is proportional to its weights, so the split minimises the largest part's parameter count; among
equally good splits, later parts take as many layers as they can (so the early stages, which hold
the most activations under 1F1B, get fewer). `--stage-layers` overrides it (one count per part).

With --arch resmlp the parts are runs of UNITS (resmlp.py: the two projections and the residual
blocks between them), by the same rule on the units' parameter counts: a block of width d holds
2d^2 + 4d parameters and does 4d^2 FLOPs per row forward, 2 per parameter like a linear layer, so
parameters still measure the work.
"""

from __future__ import annotations

from ...model.resmlp import BlockUnit


def partition_layers(
    widths: list[int], S: int, stage_layers: list[int] | None = None, arch: str = "mlp"
) -> list[tuple[int, int]]:
    """[(first layer, one past the last layer)] for each of the S parts (see the module docstring)."""
    n = len(widths) - 1
    if not 1 <= S <= n:
        raise ValueError(f"cannot cut {n} layers into {S} stages")
    if stage_layers is None:
        stage_layers = _balanced_counts(parameter_counts(widths, arch), S)
    if len(stage_layers) != S or sum(stage_layers) != n or min(stage_layers) < 1:
        raise ValueError(f"stage layer counts {stage_layers} must be {S} positive numbers summing to {n}")
    bounds, lo = [], 0
    for count in stage_layers:
        bounds.append((lo, lo + count))
        lo += count
    return bounds


def partition_units(sizes: list[int], S: int, stage_layers: list[int] | None = None) -> list[tuple[int, int]]:
    """partition_layers for a model given as unit sizes (--arch gpt: embedding, L blocks, head): the
    same rule, contiguous runs of units balanced by their parameter counts."""
    n = len(sizes)
    if not 1 <= S <= n:
        raise ValueError(f"cannot cut {n} units into {S} stages")
    counts = stage_layers or _balanced_counts(sizes, S)
    if len(counts) != S or sum(counts) != n or min(counts) < 1:
        raise ValueError(f"stage unit counts {counts} must be {S} positive numbers summing to {n}")
    return [(sum(counts[:k]), sum(counts[: k + 1])) for k in range(S)]


def parameter_counts(widths: list[int], arch: str = "mlp") -> list[int]:
    """Parameters of each layer (fan_in * fan_out + fan_out), or of each unit for resmlp: its blocks
    are BlockUnit's 2d^2 + 4d instead."""
    counts = [a * b + b for a, b in zip(widths[:-1], widths[1:])]
    if arch == "resmlp":
        counts[1:-1] = [BlockUnit(i, widths[i], "none").size for i in range(1, len(widths) - 2)]
    return counts


def _balanced_counts(costs: list[int], S: int) -> list[int]:
    """Contiguous split of `costs` into S non-empty parts minimising the largest part's sum."""
    n = len(costs)
    prefix = [0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    part = lambda j, i: prefix[i] - prefix[j]  # sum of costs[j:i]
    INF = float("inf")
    # best[k][i]: the smallest possible largest part when the first i layers form k stages.
    best = [[INF] * (n + 1) for _ in range(S + 1)]
    best[0][0] = 0
    for k in range(1, S + 1):
        for i in range(k, n + 1):
            best[k][i] = min(max(best[k - 1][j], part(j, i)) for j in range(k - 1, i))
    target, counts, i = best[S][n], [], n
    for k in range(S, 0, -1):
        # The last remaining stage starts as early as the target allows (takes the most layers).
        j = min(j for j in range(k - 1, i) if best[k - 1][j] <= target and part(j, i) <= target)
        counts.append(i - j)
        i = j
    return counts[::-1]
