"""What one rank's compute costs, per row of a micro-batch and per call: the matmul FLOPs and the
memory-bound elements of each layer or unit (layer_work), what recomputation redoes
(recompute_elems), the loss and the optimizer's sweeps -- summed over a step by elementwise_bytes.

Part of the cost model: rank.py adds these up into a rank's FLOPs and bytes moved, chunktime.py turns
them into seconds. The units of --arch resmlp are in resblocks.py (whole, or split over a tp group).
The same accounting the simulated clock is charged with: simpar/model.py (layers), resmlp.py and
parallel/restensor.py (units), optim.py (the optimizer's passes), precision.py (the casts).
"""

from __future__ import annotations

from . import passes
from .resblocks import resmlp_unit_work, row_share, sharded, sharded_unit_work
from .spec import Spec


def layer_work(spec: Spec, i: int, kind: str) -> dict:
    """What layer i of kind `kind` costs one (tp) rank, per row of a micro-batch and per call.

    Its shard is a_l x b_l (a column shard b/t wide, a row shard a/t tall); bias and activation run
    on b_l elements per row (for a row shard: the whole b, after g). Forward: 2 a_l b_l FLOPs per row;
    the bias add and activation move the backend's forward passes x b_l elements (passes.py: numpy
    2 + 2, numba's fused sweep 3). Backward: 2 a_l b_l FLOPs for dW and as many for dx (not at layer
    0); activation' and db's row sum its backward passes x b_l per row (numpy 3 + 1, numba 3);
    accumulating dW (3 a_l b_l) and db (3 b_l) per call. A row shard's kernel call has neither bias
    nor activation: NumPy adds them after g (model.bias_act_forward, act_backward). The raw-logits
    layer has no activation. The first backward of a step after a lazy zero_grad writes dW, db
    instead of adding to them (`first_call_elems`, see first_grads). (The same accounting the
    simulated clock charges: simpar/model.py.)
    """
    if sharded(spec):
        return sharded_unit_work(spec, i)
    if spec.arch == "resmlp":
        return resmlp_unit_work(spec, i)
    W, t = spec.widths, spec.tp
    a_l = W[i] // t if kind == "row" else W[i]
    b_l = W[i + 1] // t if kind == "column" else W[i + 1]
    act = 0 if i == spec.n_layers - 1 else 1
    fk, bk = passes.backend(spec), passes.backward_backend(spec)
    if kind == "row":  # the kernel: a bare GEMM; then NumPy: z += b, act (2 + 2), act' (3)
        fwd = 2 + 2 * act + passes.forward_passes(fk, False, False)
        bwd = 3 * act + passes.backward_passes(bk, False)
    else:
        fwd, bwd = passes.forward_passes(fk, True, act), passes.backward_passes(bk, act)
    return {
        "fwd_flops": 2 * a_l * b_l,
        "bwd_flops": 2 * a_l * b_l * (1 if i == 0 else 2),
        "fwd_elems": fwd * b_l,
        "bwd_elems": bwd * b_l,
        "bwd_call_elems": 3 * a_l * b_l + 3 * b_l,
        "first_call_elems": {"add": 3 * a_l * b_l + 3 * b_l, "into": 0, "copy": 2 * a_l * b_l + 2 * b_l}[
            first_grads(spec)
        ],
        "w_elems": b_l,  # db's row sum: with bwd_call_elems, the W half of a split backward
        "act_elems": 2 * act * b_l,  # y = act(z) alone: what selective recomputation redoes
    }


def first_grads(spec: Spec) -> str:
    """How a layer's first backward of a step puts dW, db into the gradient buffer. Plain-MLP data
    parallelism (serial included; not ZeRO, tp, pp, experts or resmlp) zeroes lazily
    (model.ParamStore.zero_grad(lazy=True)): the first backward writes the gradients, straight from
    the GEMM ("into": nothing more to move) where the kernels can (numpy, numba; auto is one of them),
    else as a copy ("copy": --kernels cuda, mixed precision's half kernels). Everything else adds
    ("add": read, read, write)."""
    if spec.arch != "mlp" or spec.zero or spec.tp > 1 or spec.pp > 1 or spec.experts:
        return "add"
    return "copy" if spec.kernels == "cuda" or spec.precision == "mixed" else "into"


def recompute_elems(spec: Spec, lo: int, hi: int, kinds: list) -> int:
    """Elements moved per row by recomputation (layer_work's forward terms): full re-runs the
    forward's bias and activation, selective only y = act(z) (read z, write y: 2 per element)."""
    if spec.recompute == "none":
        return 0
    works = [layer_work(spec, i, k) for i, k in zip(range(lo, hi), kinds)]
    if spec.recompute == "full":
        return sum(w["fwd_elems"] for w in works)
    return sum(w["act_elems"] for w in works)


def optimizer_passes(spec: Spec) -> int:
    """Sweeps over the updated parameters per step, as the run's kernels make them (passes.py):
    numpy SGD 5 (10 with momentum), Adam 32; numba's fused loops 3 (5), 7 -- simpar/optim.py."""
    return passes.optimizer_passes(passes.backend(spec), spec.optimizer, bool(spec.momentum))


LOSS_ELEMS = 6  # softmax cross-entropy sweeps rows x classes about 6 times
MIXED_CAST_BYTES = 14  # mixed precision, per updated parameter: check 2, unscale 2+4, round back 4+2


def elementwise_bytes(spec: Spec, lo: int, hi: int, kinds: list, rows: list[list[int]], updated: int) -> int:
    """Bytes the memory-bound work of one step moves on a rank whose stage holds layers lo..hi-1:
    bias, activations and their derivatives (layer_work), the loss on the last stage, and the
    optimizer's sweeps over the `updated` parameters this rank owns (optimizer_passes)."""
    per_row = per_call = first_call = 0
    for i, kind in zip(range(lo, hi), kinds):
        w = layer_work(spec, i, kind)
        per_row += w["fwd_elems"] + w["bwd_elems"]
        per_call += w["bwd_call_elems"]
        first_call += w.get("first_call_elems", w["bwd_call_elems"])
    micro_batches = sum(len(step) for step in rows)
    loss = loss_bytes(spec) * sum(map(sum, rows)) if hi == spec.n_layers else 0
    return (
        (per_row * sum(map(sum, rows)) + per_call * (micro_batches - 1) + first_call) * spec.prec.act
        + loss
        + (optimizer_bytes(spec, updated))
    )


def loss_bytes(spec: Spec) -> int:
    """Bytes the loss moves per row of the last stage: LOSS_ELEMS sweeps over the classes, in the
    activations' type -- float32 under mixed precision (the half logits are upcast first). Under
    --sp each tp rank computes the loss of its 1/t of the rows (resblocks.row_share)."""
    return (
        LOSS_ELEMS * spec.widths[-1] * (4 if spec.precision == "mixed" else spec.prec.act) * row_share(spec)
    )


def optimizer_bytes(spec: Spec, updated: int) -> int:
    """Bytes the optimizer step moves over the `updated` parameters a rank owns: its sweeps over
    parameters and state in their type -- float32 masters under mixed precision, plus the overflow
    check, the unscaled float32 gradient and the rounding back to half (MIXED_CAST_BYTES)."""
    if spec.precision == "mixed":
        return (optimizer_passes(spec) * 4 + MIXED_CAST_BYTES) * updated
    return optimizer_passes(spec) * updated * spec.prec.param
