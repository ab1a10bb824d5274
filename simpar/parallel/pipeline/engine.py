"""Pipeline parallelism: the model cut into chunks of consecutive layers, run by S rank groups.

    stage 0 --activations--> stage 1 --activations--> ... --> stage S-1 (loss)
            <--gradients----         <--gradients----  ...

Usually one chunk per stage; `--schedule interleaved --virtual-stages V` cuts S*V chunks, chunk c on
stage c mod S; `--schedule zb-v` cuts 2S, stage s holding chunks s and 2S-1-s (down the stages and
back up: the loss is on stage 0; chunks S-1 and S share stage S-1 and pass their arrays in memory).
Which layers a chunk gets: partition.partition_layers (contiguous, balanced by parameter count;
--stage-layers overrides it). Each rank's rows are cut into M micro-batches
(np.array_split: uneven is fine). In which order a stage does its forwards, backwards (or B and W
halves, zb-h1 and zb-v), sends and receives is the *schedule* (schedules.py), a plain list of steps that
`PipelineParallel._run` walks one by one; schedule_check.py has proven before the run that it cannot
deadlock (sends are isend, receives blocking and matched by tag). The loss divides by the GLOBAL
batch, so micro-batch gradients simply add up in dW, db (+=): after the last backward (or W pass)
each stage holds exactly the serial gradient of its layers. --recompute: recompute.py.

Messages (category "activation", over mesh.pp_comm, between ranks with the same dp and tp
coordinates): each chunk c sends its output (rows x layers[hi_c]) to chunk c+1 as "pp-send-act" and
the gradient w.r.t. its input (rows x layers[lo_c]) to chunk c-1 as "pp-send-grad". Per step, with
B_r = this rank's rows (summed over grad-accum micro-steps) and bpe bytes per element:

    sent by a rank:  sum over its chunks c of  B_r * layers[hi_c] * bpe  (if c < C-1, c+1 elsewhere)
                                             + B_r * layers[lo_c] * bpe  (if c > 0, c-1 elsewhere)

i.e. per boundary B*h forward + B*h backward (docs/design.md). With tp > 1 every tp rank sends its
own (identical, replicated) copy, and a chunk's layers are a TensorParallelStack (resmlp's units: a
ResTensorStack over the chunk's units, restensor.py; gpt's: a GptTensorStack over them, tensor_gpt.py,
the vocabulary-parallel loss on the last chunk, _loss_grad); under --sp each tp rank sends only its 1/t
row shard (B_r/t above; pipeline_comms._row_shard; gpt's tokens and labels stay whole). A pure pipeline
(dp = 1) sends no "model" bytes; with dp > 1 each chunk all-reduces its layers' gradients over
mesh.dp_comm once per step (GradientBuckets, started during its last backward or W pass).

The four message steps (send/receive of activations and gradients, their tags) are in
pipeline_comms.py; this file is the compute side and the Strategy interface.

(A little over 300 lines: one strategy readable alone. Its messages are already in pipeline_comms.py,
the schedules in schedules.py, recomputation in recompute.py; what is left -- the walk over the
schedule's steps and the Strategy interface -- shares the step's in-flight state.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...model.mlp import deferred_weight_grads
from ...model.precision import build_optimizer, loss_grad, vote_comm
from ...run.data import distributed_sampler, micro_steps
from ...runtime import trace
from ..base import HeldBytes, Strategy
from ..data import GradientBuckets
from ..resmlp_stack import make_stack, model_units
from . import recompute
from .comms import StageMessages
from .partition import partition_units
from .schedules import (
    SCHEDULES,
    AllReduceGrads,
    Backward,
    BackwardInput,
    BackwardWeight,
    Forward,
    RecvAct,
    RecvGrad,
    SendAct,
    SendGrad,
    build_schedule,
    chunks_of,
    in_flight_peaks,
    partition_layers,
)


def split_rows(arr, rows: list[int]) -> list:
    """`arr` cut into consecutive pieces of `rows` rows (np.array_split's pieces when rows are its sizes;
    expert_stage.py's micro-batches are the serial run's micro-steps instead)."""
    return np.split(arr, np.cumsum(rows)[:-1])


@dataclass
class InFlight:
    """What one pass of the schedule keeps between its steps, keyed by (micro-batch, chunk)."""

    rows: list[int]  # rows of each micro-batch on this rank
    global_batch: int
    communicate: bool  # last grad-accum micro-step: all-reduce grads
    inputs: dict = field(default_factory=dict)  # (mb, c) -> the chunk's input
    labels: dict = field(default_factory=dict)  # mb -> labels (last chunk only)
    contexts: dict = field(default_factory=dict)  # (mb, c) -> what forward kept for backward
    outputs: dict = field(default_factory=dict)  # (mb, c) -> output waiting to be sent on
    grads: dict = field(default_factory=dict)  # (mb, c) -> dL/d(output): received, or from the loss
    input_grads: dict = field(default_factory=dict)  # (mb, c) -> dL/d(input) waiting to be sent back
    weight_passes: dict = field(default_factory=dict)  # (mb, c) -> (W closures, activation bytes held)
    sends: list = field(default_factory=list)  # (request, buffer): buffer alive until sent
    loss: float = 0.0


class PipelineParallel(StageMessages, Strategy):
    """This rank's stage of the pipeline (one model chunk, or several); the Strategy interface.
    The message steps (send/receive of activations and gradients) are in pipeline_comms.py."""

    def __init__(self, sections, mesh):
        super().__init__(sections, mesh)
        model, layout = self.model, self.layout
        self.S, self.s, self.M = mesh.pp, mesh.pp_index, layout.microbatches
        self.kind = SCHEDULES[layout.schedule]
        self.V = layout.virtual_stages if layout.schedule == "interleaved" else 1
        self.C = self.kind.chunks(self.S, self.V)  # model chunks; chunk c runs on rank kind.rank_of(c)
        if model.arch == "gpt":  # units: embedding, blocks, head (model/gpt.py), by their parameters
            sizes = [u.size for u in model_units(model)]
            self.bounds = partition_units(sizes, self.C, layout.stage_layers)
        else:
            self.bounds = partition_layers(model.layers, self.C, layout.stage_layers, arch=model.arch)
        self.steps = build_schedule(layout.schedule, self.S, self.M, self.V)[self.s]
        self.chunks = chunks_of(self.steps)
        self.stacks = {c: self._stack(model, layout, mesh, *self.bounds[c]) for c in self.chunks}
        self.stores = [self.stacks[c].store for c in self.chunks]
        # This rank's layers only; --precision mixed-*: stages hold different gradients, so they vote
        # over the pp group (with --tp: the world) on skipping an overflowed step (precision.py).
        self.optimizer = build_optimizer(model, self.optimisation, vote_comm(mesh, mesh.pp_comm), self.rt)
        self.pp_comm = mesh.pp_comm  # wrapped by the mesh: bfloat16 messages travel as uint16 views
        dp_comm = mesh.dp_comm  # the mesh's ONE wrapper: the tag counter all chunks' buckets share
        self.buckets = {
            c: GradientBuckets(
                st.store, dp_comm, layout.bucket_mb * 2**20, layout.collectives, layout.overlap
            )
            for c, st in self.stacks.items()
        }
        self.dtype = model.compute_dtype()
        self.peak_in_flight = in_flight_peaks([self.steps])[0]
        # A chunk's gradients are final in its last backward (or W pass): that one feeds the DP buckets.
        self.last_grad_step = {
            st.chunk: st.mb for st in self.steps if isinstance(st, (Backward, BackwardWeight))
        }
        self._handlers = {
            Forward: self._forward,
            Backward: self._backward,
            BackwardInput: self._backward_input,
            BackwardWeight: self._backward_weight,
            RecvAct: self._recv_act,
            SendAct: self._send_act,
            RecvGrad: self._recv_grad,
            SendGrad: self._send_grad,
            AllReduceGrads: self._allreduce,
        }
        self._rows_cache: dict[int, list[list[int]]] = {}

    @staticmethod
    def _stack(model, layout, mesh, lo: int, hi: int):
        if mesh.tp > 1 and model.arch == "resmlp":  # the chunk's units, blocks split (restensor.py)
            from ..tensor_resmlp import ResTensorStack

            return ResTensorStack(model, layout, mesh, list(range(lo, hi)))
        if mesh.tp > 1 and model.arch == "gpt":  # the chunk's units, Megatron's split (tensor_gpt.py)
            from ..tensor_gpt import GptTensorStack

            return GptTensorStack(model, layout, mesh, list(range(lo, hi)))
        if mesh.tp > 1:
            from ..tensor import TensorParallelStack

            return TensorParallelStack(model, layout, mesh, list(range(lo, hi)))
        return make_stack(
            model, lo, hi, mesh.world.runtime
        )  # an MLP's layers, or resmlp's units (resstack.py)

    @property
    def is_first(self) -> bool:
        return self.s == 0

    @property
    def is_last(self) -> bool:
        """Holds the last chunk, which computes the loss: stage S-1, or stage 0 under zb-v's V."""
        return self.kind.rank_of(self.C - 1, self.S) == self.s

    # -- one training step -------------------------------------------------------------------------
    def train_step(self, micro_steps_data, global_batch: int) -> float:
        for store in self.stores:
            store.zero_grad()
        self.watch.reset()
        trace.next_step(self.pp_comm.runtime)
        rows = self._micro_batch_rows(global_batch)
        loss = 0.0
        for k, (x, y) in enumerate(micro_steps_data):
            shard = self._row_shard  # --sp: this tp rank's rows of each micro-batch (pipeline_comms.py)
            # gpt's tokens, labels and sequence counts stay whole: its embedding scatters the b s token
            # rows, its head gathers them, its boundaries carry a shard of them (_boundary_shape)
            ends = (lambda part: part) if self.model.arch == "gpt" else shard
            flight = InFlight(ends(rows[k]), global_batch, communicate=k == len(micro_steps_data) - 1)
            if self.is_first:
                assert len(x) == sum(rows[k]), "BatchFeeder and pipeline disagree on the rows"
                flight.inputs = {(mb, 0): ends(part) for mb, part in enumerate(split_rows(x, rows[k]))}
            if self.is_last:
                flight.labels = {mb: ends(part) for mb, part in enumerate(split_rows(y, rows[k]))}
            self._run(flight)
            loss += flight.loss
        self._update()
        # Only the last stage computes the loss; its tp ranks all hold the same value (count it once),
        # or under --sp each the share of its own rows (resmlp; gpt's head gathers every row).
        by_rows = self.layout.sp and self.model.arch != "gpt"
        return loss if self.is_last and (by_rows or self.mesh.tp_index == 0) else 0.0

    def _update(self) -> None:
        """The optimizer step on this rank's chunks (zero_mesh.py: ZeRO-1's sharded step instead)."""
        self.optimizer.step([st.params for st in self.stores], [st.grads for st in self.stores])

    def _micro_batch_rows(self, global_batch: int) -> list[list[int]]:
        """Rows of each micro-batch, per grad-accum micro-step, on this rank.

        The same split as the BatchFeeder (grad-accum micro-steps, then this dp rank's part), then
        np.array_split into M. Middle stages get no data, yet need this to size their receive buffers.
        """
        if global_batch not in self._rows_cache:
            every = np.arange(global_batch)
            self._rows_cache[global_batch] = [
                [
                    len(part)
                    for part in np.array_split(
                        distributed_sampler(m, self.mesh.dp, self.mesh.dp_index), self.M
                    )
                ]
                for m in micro_steps(every, self.optimisation.grad_accum)
            ]
        return self._rows_cache[global_batch]

    def _run(self, flight: InFlight) -> None:
        """Walk this stage's schedule: the steps are data, each handler below does one kind."""
        for step in self.steps:
            self._handlers[type(step)](step, flight)
        with trace.span(self.pp_comm.runtime, "wait sends", "comm"):
            self.pp_comm.waitall([request for request, _ in flight.sends])
        flight.sends.clear()

    # -- the step handlers ---------------------------------------------------------------------------
    def _forward(self, step: Forward, flight: InFlight) -> None:
        key = (step.mb, step.chunk)
        with trace.span(
            self.pp_comm.runtime,
            f"F{step.mb}",
            "forward",
            mb=step.mb,
            chunk=step.chunk,
            stage=self.s,
            stages=self.S,
            microbatches=self.M,
            virtual_stages=self.V,
            schedule=self.layout.schedule,
        ):
            x, mode = flight.inputs.pop(key), self.layout.recompute
            meter = self.meter if mode == "none" else HeldBytes()  # recompute: count what is kept
            y, flight.contexts[key] = self.stacks[step.chunk].forward(x, meter, self.watch)
            if mode != "none":
                flight.contexts[key] = recompute.save(mode, x, flight.contexts[key])
                self.meter.take(flight.contexts[key].held)
            if step.chunk == self.C - 1:
                # The gradient of the loss starts the backward; dividing by the GLOBAL batch makes
                # the micro-batches' (and dp ranks') gradients add up to the serial gradient.
                share, flight.grads[key] = self._loss_grad(y, flight.labels.pop(step.mb), flight.global_batch)
                flight.loss += share
            else:
                self._hand_on(key, y, flight)

    def _loss_grad(self, y, labels, global_batch: int):
        """(loss share, dL/dy): --arch gpt --tp: the vocabulary-parallel cross-entropy over this rank's
        columns of the logits (vocab_parallel.py); otherwise the whole softmax cross-entropy."""
        if self.model.arch == "gpt" and self.mesh.tp > 1:
            from ..vocab_parallel import vocab_loss_grad

            last = self.stacks[self.C - 1]
            return vocab_loss_grad(last, self.optimizer, y, labels, global_batch, self.model.seq_len)
        return loss_grad(self.optimizer, y, labels, global_batch)

    def _hook(self, step, flight: InFlight):
        """The DP bucket hook, during the chunk's last backward of the step's last micro-step."""
        final = flight.communicate and self.last_grad_step[step.chunk] == step.mb
        return self.buckets[step.chunk].grads_ready if final else None

    def _contexts(self, key: tuple, flight: InFlight) -> list:
        """The forward's Contexts of (mb, chunk); with --recompute rebuilt now (recompute.py), the
        rebuilt bytes taken on the meter (the backward frees them all)."""
        kept = flight.contexts.pop(key)
        if self.layout.recompute == "none":
            return kept
        with trace.span(self.pp_comm.runtime, f"R{key[0]}", "forward", mb=key[0], chunk=key[1], stage=self.s):
            contexts = recompute.restore(self.layout.recompute, kept, self.stacks[key[1]])
        self.meter.take(recompute.context_bytes(contexts) - kept.held)
        return contexts

    def _backward(self, step: Backward, flight: InFlight) -> None:
        key = (step.mb, step.chunk)
        contexts = self._contexts(key, flight)
        with trace.span(
            self.pp_comm.runtime, f"B{step.mb}", "backward", mb=step.mb, chunk=step.chunk, stage=self.s
        ):
            dx = self.stacks[step.chunk].backward(
                contexts, flight.grads.pop(key), self.meter, self._hook(step, flight)
            )
        if step.chunk > 0:
            self._hand_back(key, dx, flight)

    def _backward_input(self, step: BackwardInput, flight: InFlight) -> None:
        """B: dx only; the activations stay held (this rank's meter) until the W pass."""
        key = (step.mb, step.chunk)
        contexts = self._contexts(key, flight)
        with trace.span(
            self.pp_comm.runtime, f"B{step.mb}", "backward", mb=step.mb, chunk=step.chunk, stage=self.s
        ):
            with deferred_weight_grads() as weight_passes:
                dx = self.stacks[step.chunk].backward(contexts, flight.grads.pop(key), HeldBytes(), None)
        flight.weight_passes[key] = (weight_passes, sum(ctx.nbytes for ctx in contexts))
        if step.chunk > 0:
            self._hand_back(key, dx, flight)

    def _backward_weight(self, step: BackwardWeight, flight: InFlight) -> None:
        """W: dW += x^T dz, db += sum(dz) of every layer of the chunk; then its activations go."""
        weight_passes, nbytes = flight.weight_passes.pop((step.mb, step.chunk))
        hook = self._hook(step, flight)
        if hook is not None and self.layout.sp:  # the W pass completes the row shards' gradients: sum them
            hook = self.stacks[step.chunk].sequence_synced(hook)
        with trace.span(
            self.pp_comm.runtime, f"W{step.mb}", "backward", mb=step.mb, chunk=step.chunk, stage=self.s
        ):
            for layer, weight_pass in zip(reversed(self.stacks[step.chunk].store.layers), weight_passes):
                weight_pass()
                if hook is not None:
                    hook(layer.index)
        self.meter.free(nbytes)

    def _allreduce(self, step: AllReduceGrads, flight: InFlight) -> None:
        if flight.communicate:  # gradient accumulation: only after the last micro-step
            for c in self.chunks:
                self.buckets[c].finish()

    # -- the rest of the strategy interface ----------------------------------------------------------
    def full_weights(self):
        """World rank 0 gets [(W, b)] for every layer; all ranks must call (control traffic).

        dp replicas hold identical weights, so only dp index 0 contributes; inside it, each
        stage's tp group first assembles its shards on tp rank 0 (stack.full_pieces).
        """
        pieces = None
        if self.mesh.dp_index == 0:  # one call per chunk (collective over tp); None off tp rank 0
            parts = [self.stacks[c].full_pieces() for c in self.chunks]
            pieces = None if None in parts else [p for part in parts for p in part]
        gathered = self.mesh.world.gather_object(pieces, root=0)
        if self.mesh.world.rank != 0:
            return None
        by_layer = {index: (W, b) for part in gathered if part for index, W, b in part}
        return [by_layer[i] for i in range(self.model.n_layers)]

    def memory(self) -> dict:
        return self.memory_of(
            sum(st.params.nbytes for st in self.stores),
            sum(st.grads.nbytes for st in self.stores),
            self.optimizer.state_nbytes(),
        )

    # -- checkpoints: one position, this stage's flat store (train_step's optimizer.step list) -------
    def optimizer_params(self) -> list:
        return [st.params for st in self.stores]  # one position per chunk, as train_step's step

    def gather_full(self, local):
        """As full_weights: dp index 0 of each stage assembles its chunks' layers, world rank 0 collects."""
        pieces = None
        if self.mesh.dp_index == 0:
            parts = [self.stacks[c].full_pieces(flat) for c, flat in zip(self.chunks, local)]
            pieces = None if any(p is None for p in parts) else [piece for part in parts for piece in part]
        gathered = self.mesh.world.gather_object(pieces, root=0)
        if self.mesh.world.rank != 0:
            return None
        by_layer = {index: (W, b) for part in gathered if part for index, W, b in part}
        return [by_layer[i] for i in range(self.model.n_layers)]

    def slice_full(self, full, dtype=None):
        return [self.stacks[c].flat_from_full(full, dtype) for c in self.chunks]
