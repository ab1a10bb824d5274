"""A multilayer perceptron from scratch: every layer is an explicit forward and backward function.

    y = act(x @ W + b)            x: (batch, fan_in)   W: (fan_in, fan_out)   b: (fan_out,)

The per-layer math (activations, linear forward and backward) is the reference in
kernels/reference.py; the kernel backend chosen with --kernels runs it (kernels/__init__.py).

The loss is softmax cross-entropy averaged over the GLOBAL batch: a shard of B_local rows divides by
B_global, so summing the shards' gradients (the data-parallel all-reduce) gives the serial gradient
exactly -- no averaging step that could be forgotten or done twice.

Weights come from (seed, layer index) on the FULL shape, so a tensor-parallel shard is a slice of
exactly the numbers the serial model starts from.

(Over 300 lines: the layer's forward, its backward, the backward's two zero-bubble halves and what
each costs on the simulated clock sit together, so that the accounting changes with the code it
counts.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from kernels.reference import ACTIVATIONS, linear_forward  # noqa: F401  (re-exported)

from ..runtime.context import PLAIN

# -- loss ------------------------------------------------------------------------------------------


def softmax_cross_entropy(logits, labels, global_batch, clock=None):
    """Loss of these rows divided by the global batch size, and dL/dlogits for them.

    Returns (loss_share, dlogits): summing loss_share over all shards gives the mean loss.
    Logits (rows, s, V) with labels (rows, s) -- a sequence model, every position predicting its next
    token (gpt.py) -- are s times as many rows: the mean is over the global batch's tokens.
    `clock`: the run's simulated clock (its runtime's), charged for the passes; None: wall time.
    """
    if logits.ndim == 3:
        rows, s, v = logits.shape
        loss, d = softmax_cross_entropy(
            logits.reshape(rows * s, v), labels.reshape(-1), global_batch * s, clock
        )
        return loss, d.reshape(rows, s, v)
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    sum_exp = exp.sum(axis=1, keepdims=True)
    log_probs = shifted - np.log(sum_exp)
    rows = np.arange(len(labels))
    loss_share = -log_probs[rows, labels].sum() / global_batch
    dlogits = exp / sum_exp
    dlogits[rows, labels] -= 1
    dlogits /= logits.dtype.type(global_batch)
    if clock is not None:  # shift, exp, sum, log, the gradient and its scaling: ~6 passes over r x c
        clock.stream(6 * logits.size * logits.itemsize)
    return float(loss_share), dlogits


# -- parameters --------------------------------------------------------------------------------------


def init_layer(
    seed: int, layer_index: int, fan_in: int, fan_out: int, dtype
) -> tuple[np.ndarray, np.ndarray]:
    """Full-shape (W, b) of layer `layer_index`: He-normal W, small normal b, drawn in float64.

    Every layout calls this with the full shape and slices its shard, so all start identical.
    """
    rng = np.random.default_rng([seed, layer_index])
    W = rng.standard_normal((fan_in, fan_out)) * math.sqrt(2.0 / fan_in)
    b = rng.standard_normal(fan_out) * 0.01
    return W.astype(dtype), b.astype(dtype)


def parameter_count(widths: list[int]) -> int:
    return sum(a * b + b for a, b in zip(widths[:-1], widths[1:]))


@dataclass
class Linear:
    """One (possibly sharded) linear layer + activation. W, b, dW, db are views into flat buffers."""

    index: int  # position in the full model (0 = first layer)
    W: np.ndarray
    b: np.ndarray
    dW: np.ndarray
    db: np.ndarray
    act: str
    # True after ParamStore.zero_grad(lazy=True): dW, db hold stale numbers that count as zero, and
    # the next backward WRITES them instead of adding to them (see layer_backward).
    grads_stale: bool = False
    # The run's runtime (runtime/context.py): the kernels that compute this layer and the clock
    # that is charged for it. The strategy that builds the layer hands it down (ParamStore.build).
    rt: object = PLAIN


@dataclass
class Context:
    """What forward keeps for backward: the input x, the pre-activation z and the output y
    (relu and tanh differentiate from y; y is also the next layer's x, so it is counted there)."""

    x: np.ndarray
    z: np.ndarray
    y: np.ndarray

    @property
    def nbytes(self) -> int:
        # y is the next layer's x (or the logits): counted there, or as the output.
        return self.x.nbytes + (self.z.nbytes if self.z is not self.y else 0)


def layer_forward(layer: Linear, x: np.ndarray, bias: bool = True) -> tuple[np.ndarray, Context]:
    """y = act(x @ W + b); `bias=False` leaves the bias out (a row-parallel shard adds it after g)."""
    kern, clock = layer.rt.kernels, layer.rt.clock
    z, y = kern.linear_act_forward(x, layer.W, layer.b if bias else None, layer.act)
    if clock is not None:
        charge_forward(clock, kern, x.shape[0], *layer.W.shape, bias, layer.act, x.itemsize)
    return y, Context(x, z, y)


def layer_backward(
    layer: Linear, ctx: Context, dy: np.ndarray, need_dx: bool = True, bias: bool = True
) -> np.ndarray | None:
    """Accumulate dW, db into the layer's gradient buffers (+=, so micro-batches add up) -- or, the
    first time after a lazy zero_grad, write them there -- and return dx. Inside
    `deferred_weight_grads` only dx is computed now (the B half); dW, db wait (the W half)."""
    if _DEFERRED is not None:  # an empty list too: the first layer of the B pass defers as well
        return backward_input(layer, ctx, dy, need_dx, bias)
    kern = layer.rt.kernels
    grads = "add"  # how dW, db reach the gradient buffer: what the clock charges for it
    if layer.grads_stale:  # the first backward of a step: write the gradients, nothing to add to
        into = getattr(kern, "linear_act_backward_into", None)
        if into is not None and bias:  # the GEMM writes straight into the flat gradient buffer
            dx = into(dy, ctx.x, layer.W, ctx.z, ctx.y, layer.act, need_dx, layer.dW, layer.db)
            grads = "into"
        else:
            dx, dW, db = kern.linear_act_backward(dy, ctx.x, layer.W, ctx.z, ctx.y, layer.act, need_dx)
            layer.dW[...] = dW
            layer.db[...] = db if bias else 0
            grads = "copy"
        layer.grads_stale = False
    else:
        dx, dW, db = kern.linear_act_backward(dy, ctx.x, layer.W, ctx.z, ctx.y, layer.act, need_dx)
        layer.dW += dW
        if bias:
            layer.db += db
    clock = layer.rt.clock
    if clock is not None:
        charge_backward(
            clock, kern, dy.shape[0], *layer.W.shape, need_dx, bias, layer.act, dy.itemsize, grads
        )
    return dx


# -- the backward in two halves (zero-bubble schedules, Qi et al. 2023, sec. 2) -------------------------
#   B: dz = act'(dy), dx = dz W^T   (on the pipeline's critical path: the previous stage waits for dx)
#   W: dW += x^T dz, db += sum(dz)  (no one waits for it: a schedule may put it into a bubble)
# Together they compute, and charge the clock, exactly what layer_backward does in one call.
_DEFERRED: list | None = None


class deferred_weight_grads:
    """`with deferred_weight_grads() as pending:` every layer_backward inside runs its B half only
    and appends a closure for its W half to `pending` (call them later, in any order)."""

    def __enter__(self) -> list:
        global _DEFERRED
        self.saved, _DEFERRED = _DEFERRED, []
        return _DEFERRED

    def __exit__(self, *exc) -> None:
        global _DEFERRED
        _DEFERRED = self.saved


def pending_weight_passes() -> list | None:
    """Inside deferred_weight_grads, the list W halves are queued on (resmlp's blocks queue theirs
    too); None outside it."""
    return _DEFERRED


def wide(a: np.ndarray) -> np.ndarray:
    """A half array (--precision mixed-*) upcast to float32; any other array as it is."""
    return a.astype(np.float32) if a.dtype.itemsize < 4 else a


def backward_input(layer: Linear, ctx: Context, dy, need_dx: bool = True, bias: bool = True):
    """The B half: dz through the activation, dx = dz W^T; queues the W half in _DEFERRED. Half
    precision computes in float32 from the half inputs and rounds dx (and the W half dW, db) back,
    as precision.HalfKernels does for the fused backward."""
    dz = ACTIVATIONS[layer.act][1](wide(dy), wide(ctx.z), wide(ctx.y))
    dx = (dz @ wide(layer.W).T).astype(dy.dtype, copy=False) if need_dx else None
    r, (a, b) = dy.shape[0], layer.W.shape
    clock = layer.rt.clock
    if clock is not None:
        if need_dx:
            clock.matmul(r, b, a)
        clock.stream((3 * r * b if layer.act != "none" else 0) * dy.itemsize)
    _DEFERRED.append(lambda: backward_weight(layer, ctx.x, dz, bias))
    return dx


def backward_weight(layer: Linear, x, dz, bias: bool = True) -> None:
    """The W half: dW += x^T dz, db += sum(dz) (the clock: as charge_backward's remaining terms)."""
    layer.dW += (wide(x).T @ dz).astype(layer.dW.dtype, copy=False)
    if bias:
        layer.db += dz.sum(axis=0).astype(layer.db.dtype, copy=False)
    clock = layer.rt.clock
    if clock is not None:
        r, (a, b) = dz.shape[0], layer.W.shape
        clock.matmul(a, r, b)
        clock.stream((r * b + 3 * a * b + (3 * b if bias else 0)) * layer.dW.itemsize)


def bias_act_forward(z: np.ndarray, b: np.ndarray, act: str, clock=None) -> np.ndarray:
    """z += b, then act(z): what a row-parallel layer does after g has summed the partial products."""
    z += b
    if clock is not None:
        clock.stream((2 + (2 if act != "none" else 0)) * z.size * z.itemsize)
    return ACTIVATIONS[act][0](z)


def act_backward(dy: np.ndarray, z: np.ndarray, y: np.ndarray, act: str, clock=None) -> np.ndarray:
    """dL/dz from dL/dy through the activation (a row-parallel layer's, applied outside the kernel)."""
    if clock is not None and act != "none":
        clock.stream(3 * z.size * z.itemsize)
    return ACTIVATIONS[act][1](dy, z, y)


# -- what each call costs on the simulated clock (simclock.py, --clock sim) ------------------------
# The cost model (costmodel/work.py, layer_work) writes the same accounting down in closed form.
#   forward of r rows through an (a x b) layer:  2rab FLOPs; bias add and activation: the backend's
#                                                forward_passes x rb elements moved (NumPy 2 + 2,
#                                                Numba's one sweep 1 + 1 + 1); one layer call's overhead
#   backward:  2rab FLOPs for dW, 2rab more for dx (not at layer 0); activation' and db's row sum:
#              backward_passes x rb (NumPy 3 + 1, Numba 2 + 1); accumulating dW 3ab and db 3b (read,
#              read, write). The zero-bubble halves below are NumPy's own lines: NumPy's counts.
#              The first backward after a lazy zero_grad writes instead of accumulating: nothing more
#              when the GEMM writes into the buffer ("into"), 2ab + 2b when it copies ("copy": read, write)
#              -- the cost model knows which from the layout and the kernels (costmodel/work.py first_grads)
#   row-parallel layers move the same, split between the kernel and bias_act_forward/act_backward


def charge_forward(clock, kern, r: int, a: int, b: int, bias: bool, act: str, bpe: int) -> None:
    """`kern`: the backend that ran the layer (its passes are what moved through memory)."""
    clock.matmul(r, a, b)
    clock.stream(kern.forward_passes(bias, act != "none") * r * b * bpe)
    clock.layer_call()


def charge_backward(
    clock, kern, r: int, a: int, b: int, need_dx: bool, bias: bool, act: str, bpe: int, grads: str = "add"
) -> None:
    clock.matmul(a, r, b)
    if need_dx:
        clock.matmul(r, b, a)
    into_buffer = {
        "add": 3 * a * b + (3 * b if bias else 0),
        "into": 0,
        "copy": 2 * a * b + (2 * b if bias else b),
    }[grads]
    clock.stream((kern.backward_passes(act != "none") * r * b + into_buffer) * bpe)


@dataclass
class ParamStore:
    """All of a rank's parameters in one flat buffer, gradients in another, layers as views.

    Flat buffers let data parallelism all-reduce gradients in large buckets and let ZeRO cut the
    model into equal shards without caring where one layer ends.
    """

    params: np.ndarray
    grads: np.ndarray
    layers: list[Linear] = field(default_factory=list)

    @classmethod
    def build(cls, pieces: list[tuple[int, np.ndarray, np.ndarray, str]], dtype, rt=PLAIN) -> "ParamStore":
        """pieces: (layer index, W, b, activation) for each layer this rank holds; `rt`: the run's
        runtime, which every layer gets (its kernels and clock)."""
        total = sum(W.size + b.size for _, W, b, _ in pieces)
        params = np.zeros(total, dtype=dtype)
        grads = np.zeros(total, dtype=dtype)
        store = cls(params, grads)
        offset = 0
        for index, W, b, act in pieces:
            views = []
            for arr in (W, b):
                n = arr.size
                params[offset : offset + n] = arr.reshape(-1)
                views.append(
                    (
                        params[offset : offset + n].reshape(arr.shape),
                        grads[offset : offset + n].reshape(arr.shape),
                    )
                )
                offset += n
            (Wv, dWv), (bv, dbv) = views
            store.layers.append(Linear(index, Wv, bv, dWv, dbv, act, rt=rt))
        return store

    def zero_grad(self, lazy: bool = False) -> None:
        """Gradients to zero before a step. `lazy` writes nothing: every layer is marked stale and its
        first backward writes dW, db instead of adding to zeros, which saves a pass that writes the
        whole buffer and one that reads it back into the += (measured: ~1 ms of a 33 ms step of the
        784-1024-1024-10 MLP, 256 rows). Only for a step whose backward reaches every layer through
        layer_backward; `settle()` zeroes any layer it did not reach."""
        for layer in self.layers:
            layer.grads_stale = lazy
        if not lazy:
            self.grads.fill(0)

    def settle(self) -> None:
        """After a lazy zero_grad and the backward: any layer still stale really becomes zero."""
        for layer in self.layers:
            if layer.grads_stale:
                layer.dW.fill(0)
                layer.db.fill(0)
                layer.grads_stale = False


def activation_of(layer_index: int, n_layers: int, activation: str) -> str:
    """Hidden layers use the chosen activation; the last layer emits raw logits."""
    return "none" if layer_index == n_layers - 1 else activation


def serial_store(widths: list[int], activation: str, seed: int, dtype, rt=PLAIN) -> ParamStore:
    n = len(widths) - 1
    return ParamStore.build(
        [
            (i, *init_layer(seed, i, widths[i], widths[i + 1], dtype), activation_of(i, n, activation))
            for i in range(n)
        ],
        dtype,
        rt,
    )


def forward_backward(store: ParamStore, x: np.ndarray, labels: np.ndarray, global_batch: int) -> float:
    """One forward and backward of the whole MLP in `store`, on one process (no communication):
    the gradients go into store.grads (added, or written after a lazy zero_grad); returns the loss
    share. The tests, the hot-path benchmark and the calibration time this loop."""
    h, contexts = x, []
    for layer in store.layers:
        h, ctx = layer_forward(layer, h)
        contexts.append(ctx)
    loss, g = softmax_cross_entropy(
        h, labels, global_batch, store.layers[-1].rt.clock if store.layers else None
    )
    for layer, ctx in zip(reversed(store.layers), reversed(contexts)):
        g = layer_backward(layer, ctx, g, need_dx=layer.index > 0)
    return loss


def predict(weights: list[tuple[np.ndarray, np.ndarray]], x: np.ndarray, activation: str) -> np.ndarray:
    """Logits of the full model given full-shape (W, b) pairs (used for validation accuracy)."""
    n = len(weights)
    for i, (W, b) in enumerate(weights):
        x = ACTIVATIONS[activation_of(i, n, activation)][0](linear_forward(x, W, b))
    return x
