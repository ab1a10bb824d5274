"""ZeRO-1 inside a model-parallel mesh: --zero 1 with --tp, --pp (both, and --cp) on --arch gpt; with
--tp, --pp (and both) on --arch mlp and resmlp.

Megatron-LM's distributed optimizer (Shoeybi et al. 2019; its `--use-distributed-optimizer`, the ZeRO-1
of Rajbhandari et al. 2020, sec. 5.1) shards the optimizer states of each MODEL SHARD over the
data-parallel group of that shard: a rank of tp index j on pipeline stage s holds the flat parameters
and gradients of its shard (P_shard elements: its tp slice of its stage's units), and the p ranks that
hold the same shard -- the dp group, or with --cp the dp x cp group (the mesh's `dpcp`) -- are exactly
the ranks that would all-reduce its gradient. ZeRO-1 replaces that all-reduce by its two halves:

    reduce-scatter the flat gradient of each store   op "grad-reduce-scatter" (model)
    update chunk g of it, with the only optimizer state this rank keeps (chunk g's)
    all-gather the updated parameters of each store  op "param-all-gather" (model)

A "store" is one flat ParamStore: the whole tp shard (GptTensorStack), or each pipeline chunk this rank
runs (one per stage; V under --schedule interleaved, two under zb-v). chunk(n, p, g) =
np.array_split's g-th size (collectives.chunk_bounds); dpcp rank g = d C + c.

Bytes per rank per step (ring; Rajbhandari et al. sec. 7.2.1, the same as an all-reduce):
    sum over stores n of  (n - chunk(n, p, g)) + (n - chunk(n, p, g+1))  elements  ~=  2(p-1)/p P_shard
with P_shard = sum of the stores' n; grad bytes for the first half, param bytes for the second.
Memory: params and grads P_shard (ZeRO-1 keeps them whole), optimizer K_opt sum chunk(n, p, g):
the optimizer state of a tp/pp layout divided by p. Both in closed form in costmodel/zero_mesh.py.

Gradient accumulation: only the last micro-step's gradients are complete, so the collectives run once
per step, after the last micro-step (as zero.py's stage 1). --sp's tp sum of the LayerNorm gradients
still runs during that backward (the stack does it when handed a layer-done hook).

Checkpoints: a store's chunks in dpcp-rank order concatenate back to the store (gathered as control
traffic onto the group's rank 0, which has dp index 0 and cp index 0); from there the tp/pp layout's
own gather_full assembles the full model, so a checkpoint reshards to serial and back.

Not built: ZeRO-2/3 with --pp -- DeepSpeed's PipelineEngine refuses them too ("ZeRO-2 and ZeRO-3 are
incompatible with pipeline parallelism", deepspeed/runtime/pipe/engine.py): partitioned gradients
would be reduced on every micro-batch's backward, which a pipeline runs many of per step
(deepspeedai/DeepSpeed issues #823, #4164); config/rules.py refuses it. ZeRO-2/3 with --tp on gpt is
zero_tp.py's (unit by unit, as zero.py, with --cp too); on mlp/resmlp it is refused.
"""

from __future__ import annotations

import numpy as np

from .. import collectives
from ..model.precision import build_optimizer
from .context_tensor import ContextTensorParallel, ContextVocabReplicas
from .data import DataParallel
from .pipeline.context_stage import ContextPipelineParallel
from .pipeline.context_tensor_stage import ContextTensorPipelineParallel
from .pipeline.engine import PipelineParallel
from .tensor import TensorParallel
from .tensor_gpt import GptTensorParallel
from .vocab_parallel import VocabParallelReplicas


def sharding_group(mesh):
    """The ranks holding the same model shard: dp, or with --cp dp x cp."""
    return mesh.groups["dpcp"] if mesh.cp > 1 else mesh.dp_comm


class FlatShards:
    """ZeRO-1 over `comm` of flat stores (each with .params and .grads): chunk g of each is this rank's."""

    def __init__(self, stores: list, comm):
        self.stores, self.comm = stores, comm
        self.chunks = []
        for st in stores:
            b = collectives.chunk_bounds(st.params.size, comm.size)
            self.chunks.append(slice(int(b[comm.rank]), int(b[comm.rank + 1])))

    def params(self) -> list:
        """What the optimizer updates: views of chunk g of each store's parameters."""
        return [st.params[ch] for st, ch in zip(self.stores, self.chunks)]

    def step(self, optimizer) -> None:
        rs = collectives.reduce_scatter
        grads = [rs(self.comm, st.grads, "model", "grad-reduce-scatter") for st in self.stores]
        optimizer.step(self.params(), grads)
        # The other chunks of grads now hold partial sums: the next step's zero_grad clears them.
        for st in self.stores:
            collectives.allgather(self.comm, st.params, "model", "param-all-gather")

    def gather(self, local: list) -> list | None:
        """Arrays laid out like params() -> whole arrays laid out like the stores, on group rank 0."""
        parts = self.comm.gather_object([np.ascontiguousarray(a) for a in local], root=0)
        if self.comm.rank != 0:
            return None
        return [np.concatenate([p[i] for p in parts]) for i in range(len(self.stores))]

    def cut(self, whole: list) -> list:
        return [w[ch].copy() for w, ch in zip(whole, self.chunks)]


class _ShardedCheckpoints:
    """optimizer_params, gather_full, slice_full, load_params over the layout's own (one position per
    store): the chunks gathered to whole stores first, the layout's gather then runs as without ZeRO."""

    def optimizer_params(self) -> list:
        return self.shards.params()

    def gather_full(self, local):
        whole = self.shards.gather(local)
        return super().gather_full(whole if whole is not None else list(local))

    def slice_full(self, full, dtype=None):
        return self.shards.cut(super().slice_full(full, dtype))

    def load_params(self, full) -> None:
        for st, flat in zip(self.shards.stores, super().slice_full(full)):
            st.params[...] = flat  # ZeRO-1 holds every parameter of its shard


class _ZeroReplicasStep:
    """DataParallel's step (parallel/data.py) with ZeRO-1 in place of the dp all-reduce of its store."""

    def __init__(self, sections, mesh, stack):
        super().__init__(sections, mesh, stack=stack)
        self.shards = FlatShards([self.store], sharding_group(mesh))
        if self.model.mixed:  # the ranks hold different gradient chunks: the world votes on a skip
            self.optimizer = build_optimizer(self.model, self.optimisation, mesh.world, self.rt)
        self.buckets.grads_ready = _no_bucket  # backward still calls the hook (--sp's tp sums run there)

    def train_step(self, micro_steps, global_batch: int) -> float:
        self.store.zero_grad()
        self.watch.reset()
        loss = 0.0
        for k, (x, y) in enumerate(micro_steps):
            loss += self._forward_backward(x, y, global_batch, k == len(micro_steps) - 1)
        self.store.settle()
        self.shards.step(self.optimizer)
        return loss

    def optimizer_params(self) -> list:
        return self.shards.params()


class ZeroReplicas(_ZeroReplicasStep, DataParallel):
    """--arch mlp: the tensor-parallel stack's replicas (tensor.py)."""


class ZeroVocabReplicas(_ZeroReplicasStep, VocabParallelReplicas):
    """--arch gpt: the vocabulary-parallel step (ZeroContextVocabReplicas puts context_tensor.py's
    replicas, on the cp rank's tokens, under it)."""


def _no_bucket(layer_index: int) -> None:
    """A layer's gradients are final: ZeRO-1 waits for the step's end to reduce-scatter them."""


def _use_zero_replicas(strategy, sections, mesh, replicas_class) -> None:
    """A tensor-parallel strategy (tensor.py's shape) runs its stack in ZeRO-1 replicas instead."""
    strategy.replicas = replicas_class(sections, mesh, stack=strategy.stack)
    strategy.meter, strategy.watch = strategy.replicas.meter, strategy.replicas.watch
    strategy.optimizer = strategy.replicas.optimizer
    strategy.shards = strategy.replicas.shards


class ZeroGptTensorParallel(_ShardedCheckpoints, GptTensorParallel):
    """--arch gpt --tp T --dp D --zero 1 [--sp] (module docstring)."""

    def __init__(self, sections, mesh):
        super().__init__(sections, mesh)
        _use_zero_replicas(self, sections, mesh, ZeroVocabReplicas)


class ZeroTensorParallel(_ShardedCheckpoints, TensorParallel):
    """--arch mlp|resmlp --tp T --dp D --zero 1 (module docstring; tensor.py's column/row shards, or
    tensor_resmlp.py's blocks)."""

    def __init__(self, sections, mesh):
        stack = None
        if sections.model.arch == "resmlp":  # residual blocks split over tp, and --sp (tensor_resmlp.py)
            from .tensor_resmlp import ResTensorStack

            stack = ResTensorStack(sections.model, sections.layout, mesh)
        super().__init__(sections, mesh, stack=stack)
        _use_zero_replicas(self, sections, mesh, ZeroReplicas)


class ZeroPipelineMixin(_ShardedCheckpoints):
    """A pipeline stage (engine.py, or context_stage.py's with --cp) whose chunks' gradients are
    reduce-scattered over the sharding group at the step's end instead of all-reduced in buckets."""

    def _zero_init(self, mesh) -> None:
        self.shards = FlatShards(self.stores, sharding_group(mesh))
        if self.model.mixed:  # dp ranks hold different gradient chunks: the world votes on a skip
            self.optimizer = build_optimizer(self.model, self.optimisation, mesh.world, self.rt)

    def _hook(self, step, flight):
        final = super()._hook(step, flight)
        return None if final is None else _no_bucket

    def _allreduce(self, step, flight) -> None:
        """No bucket all-reduce: the reduce-scatter waits for _update."""

    def _update(self) -> None:
        self.shards.step(self.optimizer)


class ZeroPipelineParallel(ZeroPipelineMixin, PipelineParallel):
    """--arch gpt --pp S --dp D --zero 1 [--tp T [--sp]] (module docstring)."""

    def __init__(self, sections, mesh):
        super().__init__(sections, mesh)
        self._zero_init(mesh)


class ZeroContextVocabReplicas(ZeroVocabReplicas, ContextVocabReplicas):
    """cp x tp: the cp rank's tokens (context_tensor.py), ZeRO-1 over dp x cp."""


class ZeroContextTensorParallel(_ShardedCheckpoints, ContextTensorParallel):
    """--arch gpt --cp C --tp T --dp D --zero 1 [--sp] (module docstring)."""

    def __init__(self, sections, mesh):
        super().__init__(sections, mesh)
        _use_zero_replicas(self, sections, mesh, ZeroContextVocabReplicas)


class ZeroContextPipelineParallel(ZeroPipelineMixin, ContextPipelineParallel):
    """--arch gpt --cp C --pp S --dp D --zero 1: cp inside the stages (context_stage.py)."""

    def __init__(self, sections, mesh):
        super().__init__(sections, mesh)
        self._zero_init(mesh)


class ZeroContextTensorPipelineParallel(ZeroPipelineMixin, ContextTensorPipelineParallel):
    """--arch gpt --cp C --tp T --pp S --dp D --zero 1: pp x dp x cp x tp (context_tensor_stage.py)."""

    def __init__(self, sections, mesh):
        super().__init__(sections, mesh)
        self._zero_init(mesh)


def strategy_class(pp: bool, cp: bool, tp: bool, gpt: bool = True):
    """parallel.build_strategy's pick for --zero 1 with --tp and/or --pp (and --cp): which axes are > 1;
    --arch mlp|resmlp (gpt False) runs tensor.py's (or tensor_resmlp.py's) stack, or the engine's stages."""
    if not gpt and not pp:
        return ZeroTensorParallel
    if pp and cp:
        return ZeroContextTensorPipelineParallel if tp else ZeroContextPipelineParallel
    if pp:
        return ZeroPipelineParallel
    return ZeroContextTensorParallel if cp else ZeroGptTensorParallel
