"""Consecutive units (resmlp.py) on one rank: SerialStack's interface for any --arch.

Data parallelism and ZeRO-1 run this stack with every unit for --arch resmlp; a pipeline stage runs
it with the units of its chunk (partition.py cuts the model into runs of units). Parameters and
gradients live in one flat buffer each (ParamStore), a unit's slice of them being its flat vector,
so the gradient buckets and ZeRO-1's chunks see the model exactly as they see an MLP. `store.layers`
holds one entry per unit for them: a projection's (W, b) views, a block's flat vector as W with an
empty b.
"""

from __future__ import annotations

import numpy as np

from ..model.gpt_build import gpt_units
from ..model.mlp import Context, Linear, ParamStore
from ..model.resmlp import BlockContext, LinearUnit, build_units
from ..runtime.context import PLAIN
from .base import HeldBytes, NonFiniteWatch, SerialStack, flatten, store_views


def model_units(model, rt=PLAIN) -> list:
    """The model (its section: config.sections.Model) as units: resmlp.build_units (mlp, resmlp), or
    gpt.py's embedding, blocks and head; `rt`: the run's runtime, which every unit gets."""
    return gpt_units(model, rt) if model.arch == "gpt" else build_units(model, rt)


def unit_store(units: list, dtype, initial) -> tuple[ParamStore, list]:
    """(store, [(params, grads) per unit]): one flat buffer each for params and grads, unit after unit,
    params set from `initial(unit)`. store.layers: a projection's (W, b) views, anything else (a
    block, or this rank's share of one) as its flat vector W with an empty b."""
    total = sum(u.size for u in units)
    store = ParamStore(np.empty(total, dtype), np.zeros(total, dtype))
    flats, offset = [], 0
    for u in units:
        p = store.params[offset : offset + u.size]
        g = store.grads[offset : offset + u.size]
        p[...] = initial(u)
        flats.append((p, g))
        if isinstance(u, LinearUnit):
            (W, b), (dW, db) = u.views(p), u.views(g)
        else:
            W, b, dW, db = p, p[:0], g, g[:0]
        store.layers.append(Linear(u.index, W, b, dW, db, getattr(u, "act", "none"), rt=u.rt))
        offset += u.size
    return store, flats


class UnitStack:
    """The units `unit_indices` of the model (default: all), SerialStack's interface."""

    def __init__(self, model, unit_indices: list[int] | None = None, rt=PLAIN):
        self.rt = rt
        every = model_units(model, rt)
        self.units = every if unit_indices is None else [every[i] for i in unit_indices]
        dtype = model.compute_dtype()
        # from (seed, unit) on the full shape, as every layout
        self.store, self.flats = unit_store(self.units, dtype, lambda u: u.init(model.seed, dtype))

    def forward(self, x, meter: HeldBytes, watch: NonFiniteWatch):
        contexts = []
        for u, (p, _) in zip(self.units, self.flats):
            x, ctx = u.forward(p, x)
            watch.check(u.index, x)
            meter.take(ctx.nbytes)
            contexts.append(ctx)
        return x, contexts

    def backward(self, contexts, grad, meter: HeldBytes, on_layer_done=None):
        for u, (p, g), ctx in zip(reversed(self.units), reversed(self.flats), reversed(contexts)):
            grad = u.backward(p, g, ctx, grad, need_dx=u.index > 0)  # B half only if deferring
            meter.free(ctx.nbytes)
            if on_layer_done is not None:
                on_layer_done(u.index)
        return grad

    # -- checkpoints: the same layout as SerialStack's (a block's flat vector as W, b empty) --------
    def full_pieces(self, flat: np.ndarray | None = None):
        flat = self.store.params if flat is None else flat
        return [(i, W.copy(), b.copy()) for i, W, b in store_views(self.store, flat)]

    def flat_from_full(self, full: list, dtype=None) -> np.ndarray:
        return flatten([full[layer.index] for layer in self.store.layers], dtype or self.store.params.dtype)


# -- --recompute selective for units (recompute.py calls these for a chunk that holds a block) -------
# Keep what the matmuls produced, recompute the cheap rest (Korthikanti et al. 2022, sec. 4.2): the
# chunk's input; each unit's output but the last (it is the next unit's input: a projection's z, a
# block's x + v); each block's z1 = W1 LN(x) + b1. The backward rebuilds LayerNorm's xh, s, h and
# u = act(z1). Every kept array is inside the rebuilt Contexts, as recompute.py's meter assumes; the
# chunk's last projection keeps its z as the backward's (unused) z, y, uncounted like the MLP's logits.


def save_selective(x, contexts: list) -> tuple[list, int]:
    """(per unit: (z or z1, its output or None, gathered h or None), bytes held) for recompute.Saved.
    A block whose h has more rows than its input x (--sp: f-bar all-gathered LayerNorm's row shards)
    keeps h too: LayerNorm on this rank's rows cannot rebuild it without another all-gather."""
    kept, held = [], x.nbytes
    for k, ctx in enumerate(contexts):
        out = contexts[k + 1].x if k + 1 < len(contexts) else None
        if isinstance(ctx, BlockContext):
            z1, gathered = ctx.z1, (ctx.h if ctx.h.shape[0] != ctx.x.shape[0] else None)
            kept.append((z1, out, gathered))
            held += z1.nbytes + (out.nbytes if out is not None else 0)
            held += gathered.nbytes if gathered is not None else 0
        else:  # a projection: its output IS its z (no activation)
            kept.append((ctx.z, None, None))
            held += ctx.z.nbytes if out is not None else 0
    return kept, held


def restore_selective(x, kept: list, stack) -> list:
    """The chunk's Contexts again from save_selective's arrays (numbers equal to the forward's)."""
    contexts = []
    for unit, (p, _), (z, out, gathered) in zip(stack.units, stack.flats, kept):
        if isinstance(unit, LinearUnit):
            contexts.append(Context(x, z, z))
            x = z
        elif gathered is None:  # a block, or this rank's share of one (restensor.ShardedBlock)
            contexts.append(unit.rebuild_context(p, x, z))
            x = out
        else:  # this rank's share of a block under --sp, its gathered h kept
            contexts.append(unit.rebuild_context(p, x, z, gathered))
            x = out
    return contexts


def make_stack(model, lo: int = 0, hi: int | None = None, rt=PLAIN):
    """Layers (units) lo..hi-1 of the model (its section) on this rank, default all: SerialStack for the
    MLP, UnitStack for resmlp; `rt`: the run's runtime, which their layers get."""
    indices = list(range(lo, model.n_layers if hi is None else hi))
    if model.arch in ("resmlp", "gpt"):
        return UnitStack(model, indices, rt)
    return SerialStack(model, indices, rt)
