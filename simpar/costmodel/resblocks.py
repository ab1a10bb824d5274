"""The residual MLP's units in closed form: what each costs one rank (resmlp_unit_work; simpar/resmlp.py),
and under tensor and sequence parallelism parallel/restensor.py's rules written down again (this
file imports none of it).

t = --tp ranks, k = this rank's tp index, d = the residual width, dl = d/t, r = the rows of one
micro-batch on this data-parallel rank, share = the part of them the LayerNorm/residual region and
the projections see: 1, or 1/t under --sp (config.validate makes t divide r).

  sizes on one tp rank   block: gamma, beta, b2 (3d) + W1[:, cols], W2[cols, :] (2 d dl) + b1[cols] (dl);
                         projections whole (replicated)
  per block per micro-step (Megatron-LM sec. 3 Fig. 3a; Korthikanti et al. 2022 sec. 4.2.2):
    --tp        g: all-reduce of r*d in forward ("tp-g-allreduce"), f: all-reduce of r*d in backward
                ("tp-f-allreduce"); --collectives picks the algorithm
    --tp --sp   f-bar: all-gather of r*d forward, reduce-scatter backward; g-bar: reduce-scatter
                forward, all-gather backward; ring: "sp-gather" twice and "sp-scatter" twice. A ring
                reduce-scatter plus a ring all-gather send 2N - c_k - c_(k+1) elements: one all-reduce.
    --sp, once per step: all-reduce over tp (category model, "sp-grad-allreduce") of each block's
                gamma and beta (2d) and of each projection's parameters: they saw 1/t of the rows
                (under --pp: those of the stage's chunks)
    --sp --pp   a stage boundary carries tp rank k's r/t rows to tp rank k of the next stage
                (rank.py, steptime.py: r * row_share)
  kept for backward, per row of a micro-batch:
    block       x, xh (2d) and s (1) on share*r rows; h (d), z1 and u (2 dl) on all r rows
    projection  its input (fan_in) on share*r rows
"""

from __future__ import annotations

from fractions import Fraction

from . import passes
from .collectives import ALLREDUCE, Cost, ring_allgather, ring_reduce_scatter


def sharded(spec) -> bool:
    """Does this spec run resmlp's blocks split over a tp group (parallel/restensor.py)?"""
    return spec.arch == "resmlp" and spec.tp > 1


def row_share(spec) -> Fraction:
    """The part of a micro-batch's rows one rank's LayerNorm, residual, projections and loss see."""
    return Fraction(1, spec.tp) if getattr(spec, "sp", False) else Fraction(1)


def is_block(spec, i: int) -> bool:
    return 0 < i < spec.n_layers - 1


def unit_kinds(spec) -> list[str]:
    """Per unit: "replicated" projections around "block"s."""
    return ["block" if is_block(spec, i) else "replicated" for i in range(spec.n_layers)]


def local_unit_sizes(spec) -> list[int]:
    """Parameters of each unit on one tp rank (see the module docstring)."""
    W, t = spec.widths, spec.tp
    return [
        3 * W[i] + 2 * W[i] * (W[i] // t) + W[i] // t if is_block(spec, i) else W[i] * W[i + 1] + W[i + 1]
        for i in range(spec.n_layers)
    ]


def resmlp_unit_work(spec, i: int) -> dict:
    """layer_work for unit i of --arch resmlp (simpar/resmlp.py), plus `act_row`: elements kept for
    backward per row. Projections have no activation (a bias only; the input projection keeps x, the
    output one too). A block of width d: two d x d matmuls forward (4d^2 FLOPs), four backward;
    LayerNorm ~8 passes, bias + activation 4, bias 2, the residual add 3 forward (17d; NumPy's counts
    for every backend, as resmlp.BlockUnit charges them); act' 3,
    LayerNorm' ~10, two bias sums 2, the residual 2 backward (17d); it keeps x, xh, h, z1, u (5d)
    and s (1). Split for zero-bubble schedules, the W half is the two dW matmuls (as many FLOPs as
    the forward) and four row sums (db1, db2, dgamma, dbeta: w_elems 4d); the B half the rest. The
    same accounting simclock is charged with (resmlp.BlockUnit)."""
    W, n = spec.widths, spec.n_layers
    if 0 < i < n - 1:
        d = W[i]
        return {
            "fwd_flops": 4 * d * d,
            "bwd_flops": 8 * d * d,
            "fwd_elems": 17 * d,
            "bwd_elems": 17 * d,
            "bwd_call_elems": 3 * (2 * d * d + 4 * d),
            "w_elems": 4 * d,
            "act_elems": 10 * d,  # --recompute selective redoes LayerNorm (8) and act(z1) (2)
            "act_row": 5 * d + 1,
        }
    a, b = W[i], W[i + 1]
    return {
        "fwd_flops": 2 * a * b,
        "bwd_flops": 2 * a * b * (1 if i == 0 else 2),
        "fwd_elems": projection_passes(spec)[0] * b,
        "bwd_elems": projection_passes(spec)[1] * b,
        "bwd_call_elems": 3 * a * b + 3 * b,
        "w_elems": b,  # db's row sum, as an MLP layer's
        "act_elems": 0,  # selective keeps its output z: nothing to redo
        "act_row": a,
    }


def projection_passes(spec) -> tuple[int, int]:
    """A projection's kernel calls (model.layer_forward, layer_backward: a bias, no activation):
    elements moved per output element forward and backward, as the run's kernels make them (numpy
    2 and 1). The blocks' own passes above are the reference's for every backend."""
    return passes.forward_passes(passes.backend(spec), True, False), passes.backward_passes(
        passes.backward_backend(spec), False
    )


def sharded_unit_work(spec, i: int) -> dict:
    """work.layer_work for unit i on one tp rank, per row of a micro-batch (Fractions under --sp).

    A block: two r x d x dl matmuls forward, four backward; forward LayerNorm 8, b2 2, the residual 3
    elements per feature on the shared rows, b1 and act 4 per column of this rank; backward LN' 10
    and the residual 2 on the shared rows, b2's row sum 1 on all rows (it sums the gathered dL/dy),
    act' 3 and b1's row sum 1 per column. Split for a zero-bubble pipeline, the W half is the two dW
    matmuls and the row sums of b2 (d) and b1 (dl); B keeps LayerNorm's. --recompute selective redoes
    LayerNorm (8 per feature) and act(z1) (2 per column). A projection: as resmlp_unit_work, on
    share*r rows. (The same accounting parallel/restensor.py charges the simulated clock with.)"""
    W, s = spec.widths, row_share(spec)
    if is_block(spec, i):
        d = W[i]
        dl = d // spec.tp
        return {
            "fwd_flops": 4 * d * dl,
            "bwd_flops": 8 * d * dl,
            "fwd_elems": 13 * d * s + 4 * dl,
            "bwd_elems": 12 * d * s + d + 4 * dl,
            "bwd_call_elems": 3 * local_unit_sizes(spec)[i],
            "w_elems": d + dl,  # zero-bubble W half: b2's and b1's row sums (LN's ride with B's dx)
            "act_elems": 8 * d * s + 2 * dl,  # --recompute selective redoes LayerNorm and act(z1)
            "act_row": (2 * d + 1) * s + d + 2 * dl,
        }
    a, b = W[i], W[i + 1]
    return {
        "fwd_flops": 2 * a * b * s,
        "bwd_flops": 2 * a * b * (1 if i == 0 else 2) * s,
        "fwd_elems": projection_passes(spec)[0] * b * s,
        "bwd_elems": projection_passes(spec)[1] * b * s,
        "bwd_call_elems": 3 * a * b + 3 * b,
        "w_elems": b * s,  # db's row sum, as an MLP layer's
        "act_elems": 0,  # selective keeps its output z: nothing to redo
        "act_row": a * s,
    }


def block_collectives(spec, rows: int, i: int, k: int, phase: str) -> list[tuple[str, Cost]]:
    """[(op, tp rank k's Cost)] of block i's collectives on a micro-batch of `rows` rows in
    `phase` ("forward" or "backward"); see the module docstring."""
    n, t = rows * spec.widths[i], spec.tp
    if getattr(spec, "sp", False):
        return [("sp-gather", ring_allgather(n, t, k)), ("sp-scatter", ring_reduce_scatter(n, t, k))]
    op = "tp-g-allreduce" if phase == "forward" else "tp-f-allreduce"
    return [(op, ALLREDUCE[spec.collectives](n, t, k))]


def sp_grad_allreduces(spec, k: int, units=None) -> list[Cost]:
    """--sp: tp rank k's Cost of each once-a-step gradient all-reduce (none without --sp), one per
    unit of `units` (default: all; under --pp the units of this stage's chunks)."""
    if not getattr(spec, "sp", False):
        return []
    sizes = sp_grad_sizes(spec)
    chosen = range(spec.n_layers) if units is None else units
    return [ALLREDUCE[spec.collectives](sizes[i], spec.tp, k) for i in chosen]


def sp_grad_sizes(spec) -> list[int]:
    """--sp: the elements of each unit's once-a-step gradient all-reduce (module docstring)."""
    return [2 * spec.widths[i] if is_block(spec, i) else n for i, n in enumerate(local_unit_sizes(spec))]
