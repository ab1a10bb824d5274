"""Tensor parallelism (Megatron-LM, Shoeybi et al. 2019, sec. 3 and Fig. 3): one layer split over t ranks.

Layers are taken in PAIRS. For a pair (A, B) computing  Y = act(X A + a),  Z = act'(Y B + b):

  column-parallel A   A = [A_1 ... A_t] split by output columns (a split the same way). Rank k computes
                      Y_k = act(X A_k + a_k) with no communication: act is elementwise, so it may be
                      applied to a column shard alone (Megatron eq. 3 -- why A is split by columns).
  row-parallel B      B split by input rows to match Y's columns. Rank k computes the partial product
                      Y_k B_k; the sum over k is  Y B  (Megatron eq. 3's second half). The bias b is
                      replicated and added ONCE, after the sum; act' follows it.

The two conjugate operators of Fig. 3 carry all the activation traffic:
  f  before A:  forward identity (every rank already holds X),   backward all-reduce of dL/dX
                (each rank's  dY_k A_k^T  is only one term of  dY A^T).
  g  after B:   forward all-reduce of the partials Y_k B_k,       backward identity (dL/dZ is replicated).
Both use simpar's counted collectives (ring by default, --collectives picks another), category
"activation", ops "tp-f-allreduce" and "tp-g-allreduce". Under --precision mixed-* they carry half
activations and gradients (2-byte elements; bfloat16 through precision.wire): a row layer's partial
products are rounded to half before g sums them, and its bias and activation apply in half after.

Pairing rule (also inside a pipeline stage): pairs are formed greedily from the FIRST layer of the list
given to TensorParallelStack: (l0, l1), (l2, l3), ...; with an odd count the LAST layer is replicated:
every tp rank holds it whole, computes it redundantly on the replicated input, and gets identical
gradients, so it needs no communication at all. In a pair, A's output width is B's input width and is
never the model's input or output width, so only hidden widths must divide by t (config.validate).

Traffic per rank per micro-step (N = rows x width elements, ring all-reduce over t ranks sends
2N - chunk_r - chunk_{r+1} elements from rank r, i.e. 2(t-1)/t*N, exactly 2(t-1)*N over the group):
  each pair (c, c+1):  g: all-reduce of B_local x layers[c+2]       (the pair's output width)
                       f: all-reduce of B_local x layers[c]         (the pair's input width),
                          skipped when c == 0: nothing upstream wants dL/dX of the model's input.
  replicated layer:    nothing.
No "model" traffic inside a tp group: each rank updates its own shard. With dp > 1 the gradient
buckets all-reduce only the local shard over the dp group: 2(dp-1)/dp * P_local * bpe per rank.

Input: every rank of a tp group needs the same rows. With --data-source local each reads them itself
(no traffic); with --data-source root rank 0 sends them to every tp rank (the BatchFeeder's "data").
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .. import collectives
from ..model.mlp import (
    Context,
    ParamStore,
    act_backward,
    activation_of,
    bias_act_forward,
    init_layer,
    layer_backward,
    layer_forward,
)
from .base import HeldBytes, NonFiniteWatch, Strategy, flatten, store_views
from .data import DataParallel

COLUMN, ROW, REPLICATED = "column", "row", "replicated"


# -- the conjugate operators f and g (Megatron Fig. 3) ------------------------------------------


def f_forward(x: np.ndarray) -> np.ndarray:
    """f, forward: identity -- every tp rank already holds the whole input X."""
    return x


def f_backward(dx_partial: np.ndarray, comm, algorithm: str = "ring") -> np.ndarray:
    """f, backward: all-reduce dL/dX = sum_k dY_k A_k^T over the tp group (in place, replicated after)."""
    dx = np.ascontiguousarray(dx_partial)
    return collectives.allreduce(comm, dx, "activation", "tp-f-allreduce", algorithm)


def g_forward(partial: np.ndarray, comm, algorithm: str = "ring") -> np.ndarray:
    """g, forward: all-reduce Y B = sum_k Y_k B_k over the tp group (in place, replicated after)."""
    z = np.ascontiguousarray(partial)
    return collectives.allreduce(comm, z, "activation", "tp-g-allreduce", algorithm)


def g_backward(dz: np.ndarray) -> np.ndarray:
    """g, backward: identity -- dL/dZ is the same on every rank, and each needs all of it for dB_k."""
    return dz


def pair_kinds(layer_indices: list[int]) -> list[str]:
    """The pairing rule: column, row, column, row, ... and a trailing odd layer replicated."""
    kinds = [COLUMN if i % 2 == 0 else ROW for i in range(len(layer_indices))]
    if len(kinds) % 2:
        kinds[-1] = REPLICATED
    return kinds


class TensorParallelStack:
    """Consecutive layers split over mesh.tp_comm; the same interface as base.SerialStack.

    `store` holds this rank's shards only: a column layer's W[:, cols] and b[cols], a row layer's
    W[rows, :] and the whole (replicated) b, a replicated layer whole.
    """

    def __init__(self, model, layout, mesh, layer_indices: list[int]):
        # model, layout: the config's sections (config.sections); the layout names the f/g algorithm.
        # --precision mixed-bf16: f and g move bfloat16 as uint16 views (precision.wire)
        self.comm, self.algorithm = mesh.tp_comm, layout.collectives
        self.rt = mesh.world.runtime  # the run's kernels and clock, for its layers
        self.kinds = pair_kinds(layer_indices)
        pieces, dtype = [], model.compute_dtype()  # half under --precision mixed-*, as the serial stack
        for i, kind in zip(layer_indices, self.kinds):
            W, b = init_layer(model.seed, i, model.layers[i], model.layers[i + 1], dtype)  # full, then slice
            W, b = self._shard(kind, W, b)
            pieces.append((i, W, b, activation_of(i, model.n_layers, model.activation)))
        self.store = ParamStore.build(pieces, dtype, self.rt)

    def _shard(self, kind: str, W: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """This rank's part of a full-shape layer (initial weights, or a checkpoint's state)."""
        t, k = self.comm.size, self.comm.rank
        if kind == COLUMN:
            cols = slice(k * W.shape[1] // t, (k + 1) * W.shape[1] // t)
            return W[:, cols], b[cols]
        if kind == ROW:
            rows = slice(k * W.shape[0] // t, (k + 1) * W.shape[0] // t)
            return W[rows, :], b
        return W, b

    # -- one layer of each kind -----------------------------------------------------------------
    def _row_forward(self, layer, x_shard):
        # The kernel must not add b or apply act: both belong AFTER the sum g computes.
        partial, _ = layer_forward(dataclasses.replace(layer, act="none"), x_shard, bias=False)
        z = g_forward(partial, self.comm, self.algorithm)
        y = bias_act_forward(
            z, layer.b, layer.act, self.rt.clock
        )  # b once, on the full sum (b is replicated)
        return y, Context(x_shard, z, y)

    def _row_backward(self, layer, ctx, dy):
        dz = act_backward(g_backward(dy), ctx.z, ctx.y, layer.act, self.rt.clock)
        # dB_k = Y_k^T dZ (this rank's rows), db = sum dZ (identical on every rank), dY_k = dZ B_k^T.
        return layer_backward(dataclasses.replace(layer, act="none"), Context(ctx.x, dz, dz), dz)

    # -- the SerialStack interface --------------------------------------------------------------
    def forward(self, x, meter: HeldBytes, watch: NonFiniteWatch):
        """y is replicated on every tp rank (a column layer's output shard is never the stack's output)."""
        contexts = []
        for layer, kind in zip(self.store.layers, self.kinds):
            if kind == ROW:
                x, ctx = self._row_forward(layer, x)
            else:  # column: f is the identity; replicated: plain
                x, ctx = layer_forward(layer, f_forward(x) if kind == COLUMN else x)
            watch.check(layer.index, x)  # a column shard: the world-wide MIN finds the layer
            meter.take(ctx.nbytes)
            contexts.append(ctx)
        return x, contexts

    def backward(self, contexts, grad, meter: HeldBytes, on_layer_done=None):
        """Returns dL/d(input) replicated on every tp rank, or None when the stack starts at layer 0."""
        for layer, kind, ctx in zip(reversed(self.store.layers), reversed(self.kinds), reversed(contexts)):
            if kind == ROW:
                grad = self._row_backward(layer, ctx, grad)
            else:
                grad = layer_backward(layer, ctx, grad, need_dx=layer.index > 0)
            meter.free(ctx.nbytes)
            # The shard's gradients are final now: let data parallelism start its bucket BEFORE the
            # f all-reduce below, so gradient and activation traffic overlap.
            if on_layer_done is not None:
                on_layer_done(layer.index)
            if kind == COLUMN and grad is not None:
                grad = f_backward(grad, self.comm, self.algorithm)
        return grad

    def full_pieces(self, flat: np.ndarray | None = None):
        """On tp rank 0: [(layer index, W, b)] full shape, gathered (control traffic); None elsewhere.
        Of the parameters, or of `flat`: an array laid out like store.params (optimizer state)."""
        flat = self.store.params if flat is None else flat
        mine = [(W.copy(), b.copy()) for _, W, b in store_views(self.store, flat)]
        shards = self.comm.gather_object(mine, root=0)
        if self.comm.rank != 0:
            return None
        out = []
        for n, (layer, kind) in enumerate(zip(self.store.layers, self.kinds)):
            Ws = [s[n][0] for s in shards]
            if kind == COLUMN:
                W, b = np.concatenate(Ws, axis=1), np.concatenate([s[n][1] for s in shards])
            elif kind == ROW:
                W, b = np.concatenate(Ws, axis=0), shards[0][n][1]
            else:
                W, b = shards[0][n]
            out.append((layer.index, W, b))
        return out

    def flat_from_full(self, full: list, dtype=None) -> np.ndarray:
        """A fresh array laid out like store.params: this rank's shard of each full-shape layer."""
        pairs = [self._shard(kind, *full[layer.index]) for layer, kind in zip(self.store.layers, self.kinds)]
        return flatten(pairs, dtype or self.store.params.dtype)


class TensorParallel(Strategy):
    """The whole model tensor-parallel over mesh.tp_comm, by composition: the data-parallel step
    (buckets, overlap, accumulation: parallel/data.py) runs this rank's TensorParallelStack. With
    dp > 1 each DP all-reduce carries only this rank's shard, summed with the same-position shards
    of the other replicas; with dp = 1 that step simply sends nothing."""

    def __init__(self, sections, mesh, stack=None):
        super().__init__(sections, mesh)
        # `stack`: another split of the model with this interface (restensor.py for --arch resmlp)
        self.stack = stack or TensorParallelStack(
            self.model, self.layout, mesh, list(range(self.model.n_layers))
        )
        self.replicas = DataParallel(sections, mesh, stack=self.stack)
        # One meter and one watch: those of the step that runs the stack; and its optimizer.
        self.meter, self.watch = self.replicas.meter, self.replicas.watch
        self.optimizer = self.replicas.optimizer

    def train_step(self, micro_steps, global_batch: int) -> float:
        if self.layout.sp:  # sequence parallel: this rank's 1/t of each micro-step's rows, end to end
            t, k = self.mesh.tp, self.mesh.tp_index
            micro_steps = [
                (x[k * len(x) // t : (k + 1) * len(x) // t], y[k * len(y) // t : (k + 1) * len(y) // t])
                for x, y in micro_steps
            ]
            return self.replicas.train_step(micro_steps, global_batch)  # a loss share per row shard
        loss = self.replicas.train_step(micro_steps, global_batch)
        # Every tp rank computed the same logits; report the loss once per tp group, or the
        # world-wide sum would count it t times.
        return loss if self.mesh.tp_index == 0 else 0.0

    def full_weights(self):
        """World rank 0 gets [(W, b), ...] full shape. dp replicas are identical, so only dp index 0
        gathers (inside its tp group); everyone else just returns None."""
        if self.mesh.dp_index != 0:
            return None
        pieces = self.stack.full_pieces()
        if self.mesh.world.rank != 0:
            return None
        return [(W, b) for _, W, b in pieces]

    def memory(self) -> dict:
        return self.replicas.memory()  # this rank's shards, from the arrays the stack holds

    # -- checkpoints: one position, this rank's flat store of shards -------------------------------
    def optimizer_params(self) -> list:
        return self.replicas.optimizer_params()

    def gather_full(self, local):
        """As full_weights: only dp index 0 gathers, inside its tp group, onto world rank 0."""
        if self.mesh.dp_index != 0:
            return None
        pieces = self.stack.full_pieces(local[0])
        return [(W, b) for _, W, b in pieces] if self.mesh.world.rank == 0 else None

    def slice_full(self, full, dtype=None):
        return [self.stack.flat_from_full(full, dtype)]
