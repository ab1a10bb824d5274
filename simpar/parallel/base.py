"""What every strategy offers the training loop, and the small pieces they share.

A strategy owns this rank's parameters (a ParamStore), its optimizer, and the communication its
layout needs. The training loop only calls:

    train_step(micro_steps, global_batch) -> this rank's share of the loss (0.0 if it computes none)
    full_weights()  -> the full-shape [(W, b), ...] on world rank 0 (None elsewhere); control traffic
    memory()        -> bytes this rank holds: params, grads, optimizer, activations_peak
    first_nonfinite -> the lowest layer index whose output held NaN/inf in the last step, or None
"""

from __future__ import annotations

import numpy as np

from ..model import Context, ParamStore, activation_of, init_layer, layer_backward, layer_forward


class ActivationMeter:
    """Tracks the bytes of activations kept alive for backward; remembers the peak.

    Measured from the arrays actually held (inputs and pre-activations in each Context), so GPipe's
    M micro-batches in flight and 1F1B's at-most-S show up as they really are.
    """

    def __init__(self):
        self.live = 0
        self.peak = 0

    def keep(self, ctx: Context) -> None:
        self.live += ctx.nbytes
        self.peak = max(self.peak, self.live)

    def release(self, ctx: Context) -> None:
        self.live -= ctx.nbytes


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


def memory_report(store, optimizer, meter: ActivationMeter, extra_params: int = 0) -> dict:
    return {
        "params": int(store.params.nbytes + extra_params),
        "grads": int(store.grads.nbytes),
        "optimizer": int(optimizer.state_nbytes()),
        "activations_peak": int(meter.peak),
    }


class SerialStack:
    """Consecutive whole layers of the model on one rank (the serial model, or one pipeline stage).

    forward/backward run the layers with no communication; `on_layer_done(index)` is called as soon
    as a layer's gradients are final, so data parallelism can start that bucket's all-reduce.
    """

    def __init__(self, cfg, layer_indices: list[int]):
        n = cfg.n_layers
        self.store = ParamStore.build(
            [
                (
                    i,
                    *init_layer(cfg.seed, i, cfg.layers[i], cfg.layers[i + 1], cfg.dtype),
                    activation_of(i, n, cfg.activation),
                )
                for i in layer_indices
            ],
            cfg.dtype,
        )

    def forward(self, x, meter: ActivationMeter, watch: NonFiniteWatch):
        contexts = []
        for layer in self.store.layers:
            x, ctx = layer_forward(layer, x)
            watch.check(layer.index, x)
            meter.keep(ctx)
            contexts.append(ctx)
        return x, contexts

    def backward(self, contexts, grad, meter: ActivationMeter, on_layer_done=None):
        """Returns dL/d(input of the stack), or None when the stack starts at the model's first layer."""
        for layer, ctx in zip(reversed(self.store.layers), reversed(contexts)):
            grad = layer_backward(layer, ctx, grad, need_dx=layer.index > 0)
            meter.release(ctx)
            if on_layer_done is not None:
                on_layer_done(layer.index)
        return grad

    def full_pieces(self):
        """[(layer index, W, b)] full-shape copies of this stack's layers."""
        return [(layer.index, layer.W.copy(), layer.b.copy()) for layer in self.store.layers]
