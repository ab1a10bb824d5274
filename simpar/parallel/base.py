"""What every strategy offers the training loop, and the small pieces they share.

A strategy owns this rank's parameters, its optimizer, and the communication its layout needs.
`Strategy` is the interface; the training loop only calls:

    train_step(micro_steps, global_batch) -> this rank's share of the loss (0.0 if it computes none)
    full_weights()  -> the full-shape [(W, b), ...] on world rank 0 (None elsewhere); control traffic
    memory()        -> bytes this rank holds: params, grads, optimizer, activations_peak
    first_nonfinite -> the lowest layer index whose output held NaN/inf in the last step, or None
    full_state()    -> full-shape params + optimizer state (checkpoint.FullState) on world rank 0
    load_full_state(state) -> every rank takes its slice of a full-shape state (a resume)

Checkpoints in any layout: the optimizers (optim.py) keep their state per POSITION in the list of
arrays a strategy hands to `optimizer.step`, each laid out exactly like that array. So a strategy
names that list once (`optimizer_params`) and says how an array laid out like it is gathered to
full shape (`gather_full`) and cut from full shape (`slice_full`); full_state and load_full_state
apply the same two to the parameters and to every kind of optimizer state.

Shared pieces: HeldBytes (bytes held now and at the peak: activations, gathered parameters,
gradient buffers), NonFiniteWatch (which layer went NaN first), and SerialStack (whole layers run
with no communication; parallel/tensor.py has the tensor-parallel stack with the same interface).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

from ..model.mlp import ParamStore, activation_of, init_layer, layer_backward, layer_forward
from ..run.checkpoint import FullState
from ..runtime.context import PLAIN


class HeldBytes:
    """Bytes of one kind of state this rank holds right now, and the most it ever held at once.

    Measured from the arrays actually held: for activations the inputs and pre-activations each
    Context keeps for backward, so GPipe's M micro-batches in flight and 1F1B's at-most-S show up as
    they really are; for ZeRO the gathered parameter layer and the transient gradient buffers.
    """

    def __init__(self):
        self.live = 0
        self.peak = 0

    def take(self, nbytes: int) -> None:
        self.live += nbytes
        self.peak = max(self.peak, self.live)

    def free(self, nbytes: int) -> None:
        self.live -= nbytes


class NonFiniteWatch:
    """Remembers the first layer whose output went NaN/inf, so a NaN loss can be blamed precisely.

    One float64 sum per layer output: far cheaper than the matmul that produced it, and a NaN or
    inf anywhere in the array makes the sum non-finite (float64 accumulation: no false overflow).
    """

    def __init__(self):
        self.first: int | None = None

    def reset(self) -> None:
        self.first = None

    def check(self, layer_index: int, y: np.ndarray) -> None:
        if not np.isfinite(y.sum(dtype=np.float64)):
            if self.first is None or layer_index < self.first:
                self.first = layer_index


class Strategy(ABC):
    """One parallel layout on this rank: what the training loop calls (see the module docstring).

    Every strategy keeps `meter` (activations held for backward; its peak is `activations_peak`)
    and `watch` (reset at the start of each train_step, checked on every layer's output).
    """

    def __init__(self, sections, mesh):
        """`sections`: config.StrategySections, the model, layout and optimisation sections, and no other
        part of the run's config (no clock, output, checkpoint or reliability option)."""
        self.model, self.layout, self.optimisation = sections.model, sections.layout, sections.optimisation
        self.mesh = mesh
        self.rt = mesh.world.runtime  # the run's kernels and clock, for the layers it builds
        self.meter = HeldBytes()
        self.watch = NonFiniteWatch()

    @abstractmethod
    def train_step(self, micro_steps, global_batch: int) -> float:
        """Forward, backward and the optimizer step over this rank's micro-steps [(x, y), ...]
        (grad-accum); returns this rank's share of the loss, counted once over the world."""

    @abstractmethod
    def full_weights(self) -> list | None:
        """Full-shape [(W, b), ...] on world rank 0, None elsewhere; every rank must call it."""

    @abstractmethod
    def memory(self) -> dict:
        """Bytes this rank holds: {"params", "grads", "optimizer", "activations_peak"}."""

    @property
    def first_nonfinite(self) -> int | None:
        return self.watch.first

    # -- checkpoints: the hooks each strategy implements, and what they add up to -------------------
    @abstractmethod
    def optimizer_params(self) -> list[np.ndarray]:
        """The list this rank hands to optimizer.step: position i of the optimizer's state is laid
        out like element i (a flat store, a ZeRO chunk, one chunk per layer)."""

    @abstractmethod
    def gather_full(self, local: list[np.ndarray]) -> list | None:
        """Arrays laid out like optimizer_params() -> full-shape [(W, b), ...] on world rank 0, None
        elsewhere; every rank must call it (control traffic)."""

    @abstractmethod
    def slice_full(self, full: list, dtype=None) -> list[np.ndarray]:
        """Full-shape [(W, b), ...] -> fresh arrays laid out like optimizer_params(), in `dtype` (by
        default the parameters'); no traffic."""

    def load_params(self, full: list) -> None:
        """Set this rank's parameters from full shape. Strategies that hold more than they update
        (ZeRO-1/2 keep every parameter) override it."""
        for dst, src in zip(self.optimizer_params(), self.slice_full(full)):
            dst[...] = src

    def full_state(self) -> FullState | None:
        """Full-shape params and optimizer state on world rank 0, None elsewhere; collective."""
        positions = len(self.optimizer_params())
        params = self.gather_full(self.optimizer_params())
        slots = {}
        for name, by_position in self.optimizer.state_slots().items():
            # Empty before the first step (or SGD without momentum) -- on every rank alike.
            if by_position:
                slots[name] = self.gather_full([by_position[i] for i in range(positions)])
        if self.mesh.world.rank != 0:
            return None
        # --precision mixed-*: the half weights are stored as float32 (exactly: every half number is
        # one), so a checkpoint is in --dtype like every other; the float32 masters are a slot.
        params = [
            (W.astype(self.model.dtype, copy=False), b.astype(self.model.dtype, copy=False))
            for W, b in params
        ]
        return FullState(params, slots, self.optimizer.state_scalars())

    def load_full_state(self, state: FullState) -> None:
        """Every rank takes its slice of the same full-shape state: no traffic."""
        self.load_params(state.params)
        # Each slot in its own type: float32 masters and moments stay float32 under mixed precision.
        slots = {
            name: dict(enumerate(self.slice_full(full, full[0][0].dtype)))
            for name, full in state.slots.items()
        }
        self.optimizer.load_state(slots, state.scalars)

    def memory_of(self, params: int, grads: int, optimizer: int) -> dict:
        """The memory() dict, activations_peak from this strategy's meter."""
        return {
            "params": int(params),
            "grads": int(grads),
            "optimizer": int(optimizer),
            "activations_peak": int(self.meter.peak),
        }


class SerialStack:
    """Consecutive whole layers of the model on one rank (the serial model, or one pipeline stage).

    forward/backward run the layers with no communication; `on_layer_done(index)` is called as soon
    as a layer's gradients are final, so data parallelism can start that bucket's all-reduce.
    """

    def __init__(self, model, layer_indices: list[int], rt=PLAIN):
        n, dtype = model.n_layers, model.compute_dtype()  # model: the model section
        self.rt = rt
        self.store = ParamStore.build(
            [
                (
                    i,
                    *init_layer(model.seed, i, model.layers[i], model.layers[i + 1], dtype),
                    activation_of(i, n, model.activation),
                )
                for i in layer_indices
            ],
            dtype,
            rt,
        )

    def forward(self, x, meter: HeldBytes, watch: NonFiniteWatch):
        contexts = []
        for layer in self.store.layers:
            x, ctx = layer_forward(layer, x)
            watch.check(layer.index, x)
            meter.take(ctx.nbytes)
            contexts.append(ctx)
        return x, contexts

    def backward(self, contexts, grad, meter: HeldBytes, on_layer_done=None):
        """Returns dL/d(input of the stack), or None when the stack starts at the model's first layer."""
        for layer, ctx in zip(reversed(self.store.layers), reversed(contexts)):
            grad = layer_backward(layer, ctx, grad, need_dx=layer.index > 0)
            meter.free(ctx.nbytes)
            if on_layer_done is not None:
                on_layer_done(layer.index)
        return grad

    def full_pieces(self, flat: np.ndarray | None = None):
        """[(layer index, W, b)] full-shape copies of this stack's layers, or of `flat`, an array
        laid out like store.params (optimizer state)."""
        flat = self.store.params if flat is None else flat
        return [(i, W.copy(), b.copy()) for i, W, b in store_views(self.store, flat)]

    def flat_from_full(self, full: list, dtype=None) -> np.ndarray:
        """A fresh array laid out like store.params, cut from full-shape [(W, b), ...] (in `dtype`, by
        default the parameters'; mixed precision's float32 optimizer state keeps float32)."""
        return flatten([full[layer.index] for layer in self.store.layers], dtype or self.store.params.dtype)


def store_views(store: ParamStore, flat: np.ndarray) -> list:
    """[(layer index, W, b)]: views of `flat`, laid out like store.params (ParamStore.build's order:
    each layer's W, then its b), with the shapes of the store's layers."""
    out, offset = [], 0
    for layer in store.layers:
        W = flat[offset : offset + layer.W.size].reshape(layer.W.shape)
        offset += layer.W.size
        b = flat[offset : offset + layer.b.size]
        offset += layer.b.size
        out.append((layer.index, W, b))
    return out


def flatten(pairs: list, dtype) -> np.ndarray:
    """[(W, b), ...] -> one fresh flat array: W then b for each, in order (ParamStore's layout)."""
    parts = [a.reshape(-1) for W, b in pairs for a in (W, b)]
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)
