"""The whole model as units (resmlp.py) on one rank: SerialStack's interface for any --arch.

Data parallelism and ZeRO-1 run this stack for --arch resmlp. Parameters and gradients live in one
flat buffer each (ParamStore), a unit's slice of them being its flat vector, so the gradient buckets
and ZeRO-1's chunks see the model exactly as they see an MLP. `store.layers` holds one entry per unit
for them: a projection's (W, b) views, a block's flat vector as W with an empty b.
"""

from __future__ import annotations

import numpy as np

from ..model import Linear, ParamStore
from ..resmlp import LinearUnit, build_units
from .base import HeldBytes, NonFiniteWatch, SerialStack, flatten, store_views


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
        store.layers.append(Linear(u.index, W, b, dW, db, getattr(u, "act", "none")))
        offset += u.size
    return store, flats


class UnitStack:
    def __init__(self, cfg):
        self.units = build_units(cfg)
        dtype = cfg.compute_dtype()
        # from (seed, unit) on the full shape, as every layout
        self.store, self.flats = unit_store(self.units, dtype, lambda u: u.init(cfg.seed, dtype))

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
            grad = u.backward(p, g, ctx, grad, need_dx=u.index > 0)
            meter.free(ctx.nbytes)
            if on_layer_done is not None:
                on_layer_done(u.index)
        return grad

    # -- checkpoints: the same layout as SerialStack's (a block's flat vector as W, b empty) --------
    def full_pieces(self, flat: np.ndarray | None = None):
        flat = self.store.params if flat is None else flat
        return [(i, W.copy(), b.copy()) for i, W, b in store_views(self.store, flat)]

    def flat_from_full(self, full: list) -> np.ndarray:
        return flatten([full[layer.index] for layer in self.store.layers], self.store.params.dtype)


def make_stack(cfg):
    """All of the model on this rank: SerialStack for the MLP (unchanged), UnitStack for resmlp."""
    if cfg.arch == "resmlp":
        return UnitStack(cfg)
    return SerialStack(cfg, list(range(cfg.n_layers)))
