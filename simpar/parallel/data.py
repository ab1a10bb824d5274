"""Data parallelism (DDP): every rank holds the whole model and a shard of every batch.

    forward + backward on my rows  ->  all-reduce (SUM) the gradients  ->  identical optimizer step

Why SUM and not mean: the loss divides by the GLOBAL batch size (model.softmax_cross_entropy), so a
rank's gradient is already its share of the serial gradient and the shares just add up. This is the
step the widely copied snippet gets wrong (averaging per-rank means is off when shards are uneven).

Buckets (as in PyTorch DDP, Li et al. 2020, sec. 3.2): gradients are grouped, from the LAST layer
backwards, into buckets of about --bucket-mb. Backward produces the last layer's gradients first,
so as soon as every layer of a bucket is done its all-reduce starts, and it progresses while the
earlier layers are still being differentiated (--no-overlap waits until backward ends instead).

Gradient accumulation (--grad-accum K): K micro-steps add into the same gradient buffers; only the
last one communicates. Model bytes per rank per step, ring: 2(p-1)/p * P * bytes_per_element.
"""

from __future__ import annotations

from .. import collectives
from ..model.precision import build_optimizer, loss_grad, vote_comm
from ..runtime import trace
from .base import SerialStack, Strategy
from .resmlp_stack import make_stack


class GradientBuckets:
    """Groups a ParamStore's flat gradients into buckets and all-reduces each as soon as it is ready."""

    def __init__(self, store, comm, bucket_bytes: float, algorithm: str = "ring", overlap: bool = True):
        self.store, self.comm, self.algorithm, self.overlap = store, comm, algorithm, overlap
        self.buckets: list[list] = []  # each: layer indices, last layer first
        self.ranges: list[tuple[int, int]] = []
        current, size = [], 0
        offsets = self._layer_offsets()
        for layer in reversed(store.layers):
            current.append(layer.index)
            size += (layer.W.size + layer.b.size) * store.grads.itemsize
            if size >= bucket_bytes:
                self._close(current, offsets)
                current, size = [], 0
        if current:
            self._close(current, offsets)
        self.pending: dict[int, collectives.Pending] = {}
        self.ready: set[int] = set()

    def _layer_offsets(self) -> dict[int, tuple[int, int]]:
        out, offset = {}, 0
        for layer in self.store.layers:
            n = layer.W.size + layer.b.size
            out[layer.index] = (offset, offset + n)
            offset += n
        return out

    def _close(self, layer_indices, offsets) -> None:
        self.buckets.append(list(layer_indices))
        lo = min(offsets[i][0] for i in layer_indices)
        hi = max(offsets[i][1] for i in layer_indices)
        self.ranges.append((lo, hi))  # layers are contiguous in the flat buffer

    def _start(self, b: int) -> None:
        lo, hi = self.ranges[b]
        self.pending[b] = collectives.start_allreduce(
            self.comm, self.store.grads[lo:hi], "model", "grad-allreduce", self.algorithm
        )

    def grads_ready(self, layer_index: int) -> None:
        """Backward has finished this layer: start its bucket if complete, and push the others along."""
        if self.comm.size == 1:
            return
        self.ready.add(layer_index)
        if self.overlap:
            for b, layers in enumerate(self.buckets):
                if b not in self.pending and all(i in self.ready for i in layers):
                    self._start(b)
            for p in self.pending.values():
                p.progress()

    def finish(self) -> None:
        """Start whatever has not started (all of it under --no-overlap), then wait for all."""
        if self.comm.size > 1:
            with trace.span(self.comm.runtime, "allreduce", "allreduce"):  # a bar in the --trace timeline
                for b in range(len(self.buckets)):
                    if b not in self.pending:
                        self._start(b)
                for p in self.pending.values():
                    p.wait()
        self.pending.clear()
        self.ready.clear()


class DataParallel(Strategy):
    """The whole model on every rank; gradients summed over the data-parallel group. dp=1 is serial.

    `stack` is the layers this rank runs: by default all of them whole (a SerialStack). Tensor
    parallelism passes its TensorParallelStack instead and so reuses this very step -- buckets,
    overlap, accumulation -- for its dp replicas (tensor.py reports the loss and weights itself).
    """

    def __init__(self, sections, mesh, stack=None):
        super().__init__(sections, mesh)
        self.stack = stack if stack is not None else make_stack(self.model, rt=self.rt)  # mlp or resmlp
        self.store = self.stack.store
        # Replicas hold the same summed gradients: no vote, unless a tp stack splits them (precision.py).
        self.optimizer = build_optimizer(self.model, self.optimisation, vote_comm(mesh, None), self.rt)
        self.buckets = GradientBuckets(
            self.store,
            mesh.dp_comm,
            self.layout.bucket_mb * 2**20,
            self.layout.collectives,
            self.layout.overlap,
        )

    def train_step(self, micro_steps, global_batch: int) -> float:
        # Plain MLP layers: every layer's first backward writes its gradients (model.ParamStore.zero_grad).
        self.store.zero_grad(lazy=isinstance(self.stack, SerialStack))
        self.watch.reset()
        loss = 0.0
        for k, (x, y) in enumerate(micro_steps):
            communicate = k == len(micro_steps) - 1  # accumulate locally, sync on the last micro-step
            loss += self._forward_backward(x, y, global_batch, communicate)
        self.store.settle()
        self.buckets.finish()
        self.optimizer.step(self.optimizer_params(), [self.store.grads])
        return loss

    def _forward_backward(self, x, y, global_batch, communicate) -> float:
        logits, contexts = self.stack.forward(x, self.meter, self.watch)
        loss, grad = loss_grad(self.optimizer, logits, y, global_batch)
        self.stack.backward(contexts, grad, self.meter, self.buckets.grads_ready if communicate else None)
        return loss

    def full_weights(self):
        if self.mesh.world.rank != 0:
            return None
        return [(layer.W.copy(), layer.b.copy()) for layer in self.store.layers]

    def memory(self) -> dict:
        return self.memory_of(
            self.store.params.nbytes, self.store.grads.nbytes, self.optimizer.state_nbytes()
        )

    # -- checkpoints: one position, the whole flat store (identical on every replica) --------------
    def optimizer_params(self) -> list:
        return [self.store.params]

    def gather_full(self, local):
        if self.mesh.world.rank != 0:
            return None  # replicas are identical: rank 0 has it all, nothing moves
        return [(W, b) for _, W, b in self.stack.full_pieces(local[0])]

    def slice_full(self, full, dtype=None):
        return [self.stack.flat_from_full(full, dtype)]
