"""Pipeline parallelism: the model cut into S stages of consecutive layers, one stage per rank group.

    stage 0 --activations--> stage 1 --activations--> ... --> stage S-1 (loss)
            <--gradients----         <--gradients----  ...

Which layers a stage gets: schedules.partition_layers -- contiguous runs, balanced by parameter
count (the split whose largest stage is smallest); --stage-layers 2,1,1 overrides it.

Each rank's rows of a step are cut into M micro-batches (np.array_split: uneven is fine) so that
stages can work on different micro-batches at once. In which order a stage does its forwards,
backwards, sends and receives is the *schedule* (schedules.py: naive, GPipe, 1F1B), a plain list
of steps that `PipelineParallel._run` walks one by one. The loss divides by the GLOBAL batch
(model.softmax_cross_entropy), so micro-batch gradients simply add up in dW, db (+=): after the
last backward each stage holds exactly the serial gradient of its layers.

Messages (category "activation", over mesh.pp_comm, i.e. between ranks with the same dp and tp
coordinates): stage s sends its output (rows x layers[hi_s]) forward as "pp-send-act" and the
gradient w.r.t. its input (rows x layers[lo_s]) backward as "pp-send-grad". Per step, with B_r =
this rank's rows (the global batch / dp, summed over grad-accum micro-steps) and bpe bytes per element:

    sent by a rank of stage s:  B_r * layers[hi_s] * bpe  (if s < S-1)
                              + B_r * layers[lo_s] * bpe  (if s > 0)

i.e. per boundary B*h forward + B*h backward (docs/design.md). With tp > 1 every tp rank sends its own
(identical, replicated) copy. A pure pipeline (dp = 1) sends no "model" bytes at all; with dp > 1
each stage all-reduces its own layers' gradients over mesh.dp_comm once per step (GradientBuckets).

Sends are non-blocking (isend) and receives blocking, so no order of steps a schedule may list can
deadlock as long as its simulation in schedules.ideal_timeline finishes (tests check every schedule).

Combined with tensor parallelism (tp > 1) a stage's layers are a TensorParallelStack: its input and
output are replicated on the tp ranks, so the pipeline code does not change at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import trace
from ..data import distributed_sampler, micro_steps
from ..model import softmax_cross_entropy
from ..optim import make_optimizer
from .base import SerialStack, Strategy
from .data import GradientBuckets
from .schedules import (
    AllReduceGrads,
    Backward,
    Forward,
    RecvAct,
    RecvGrad,
    SendAct,
    SendGrad,
    build_schedule,
    in_flight_peaks,
    partition_layers,
)

ACT, GRAD = 0, 1  # message tags: 2*mb + ACT / GRAD (receives match sends by micro-batch)


def _tag(mb: int, direction: int) -> int:
    return (2 * mb + direction) % 32_000  # MPI guarantees tags up to at least 32767


@dataclass
class InFlight:
    """What one pass of the schedule keeps between its steps, keyed by micro-batch."""

    rows: list[int]  # rows of each micro-batch on this rank
    global_batch: int
    communicate: bool  # last grad-accum micro-step: all-reduce grads
    inputs: dict = field(default_factory=dict)  # mb -> this stage's input
    labels: dict = field(default_factory=dict)  # mb -> labels (last stage only)
    contexts: dict = field(default_factory=dict)  # mb -> what forward kept for backward
    outputs: dict = field(default_factory=dict)  # mb -> output waiting to be sent on
    grads: dict = field(default_factory=dict)  # mb -> dL/d(output): received, or from the loss
    input_grads: dict = field(default_factory=dict)  # mb -> dL/d(input) waiting to be sent back
    sends: list = field(default_factory=list)  # (request, buffer): buffer alive until sent
    loss: float = 0.0


class PipelineParallel(Strategy):
    """This rank's stage of the pipeline; the Strategy interface (see base.py)."""

    def __init__(self, cfg, mesh):
        super().__init__(cfg, mesh)
        self.S, self.s, self.M = mesh.pp, mesh.pp_index, cfg.microbatches
        self.bounds = partition_layers(cfg.layers, self.S, cfg.stage_layers)
        lo, hi = self.bounds[self.s]
        self.width_in, self.width_out = cfg.layers[lo], cfg.layers[hi]
        if mesh.tp > 1:
            from .tensor import TensorParallelStack

            self.stack = TensorParallelStack(cfg, mesh, list(range(lo, hi)))
        else:
            self.stack = SerialStack(cfg, list(range(lo, hi)))
        self.store = self.stack.store
        self.optimizer = make_optimizer(cfg.optimizer, cfg.lr, cfg.momentum)  # this stage's layers only
        self.buckets = GradientBuckets(
            self.store, mesh.dp_comm, cfg.bucket_mb * 2**20, cfg.collectives, cfg.overlap
        )
        self.dtype = np.dtype(cfg.dtype)
        self.steps = build_schedule(cfg.schedule, self.S, self.M)[self.s]
        self.peak_in_flight = in_flight_peaks([self.steps])[0]
        # The stage's gradients are final during its last backward: that one feeds the DP buckets.
        self.last_backward_mb = [st.mb for st in self.steps if isinstance(st, Backward)][-1]
        self._handlers = {
            Forward: self._forward,
            Backward: self._backward,
            RecvAct: self._recv_act,
            SendAct: self._send_act,
            RecvGrad: self._recv_grad,
            SendGrad: self._send_grad,
            AllReduceGrads: self._allreduce,
        }
        self._rows_cache: dict[int, list[list[int]]] = {}

    @property
    def is_first(self) -> bool:
        return self.s == 0

    @property
    def is_last(self) -> bool:
        return self.s == self.S - 1

    # -- one training step -------------------------------------------------------------------------
    def train_step(self, micro_steps_data, global_batch: int) -> float:
        self.store.zero_grad()
        self.watch.reset()
        trace.next_step()
        rows = self._micro_batch_rows(global_batch)
        loss = 0.0
        for k, (x, y) in enumerate(micro_steps_data):
            flight = InFlight(rows[k], global_batch, communicate=k == len(micro_steps_data) - 1)
            if self.is_first:
                assert len(x) == sum(flight.rows), "BatchFeeder and pipeline disagree on the rows"
                flight.inputs = dict(enumerate(np.array_split(x, self.M)))
            if self.is_last:
                flight.labels = dict(enumerate(np.array_split(y, self.M)))
            self._run(flight)
            loss += flight.loss
        self.optimizer.step([self.store.params], [self.store.grads])
        # Only the last stage computes the loss; its tp ranks all hold the same value: count it once.
        return loss if self.is_last and self.mesh.tp_index == 0 else 0.0

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
                for m in micro_steps(every, self.cfg.grad_accum)
            ]
        return self._rows_cache[global_batch]

    def _run(self, flight: InFlight) -> None:
        """Walk this stage's schedule: the steps are data, each handler below does one kind."""
        for step in self.steps:
            self._handlers[type(step)](step, flight)
        with trace.span("wait sends", "comm"):
            self.mesh.pp_comm.waitall([request for request, _ in flight.sends])
        flight.sends.clear()

    # -- the step handlers ---------------------------------------------------------------------------
    def _forward(self, step: Forward, flight: InFlight) -> None:
        mb = step.mb
        with trace.span(
            f"F{mb}",
            "forward",
            mb=mb,
            stage=self.s,
            stages=self.S,
            microbatches=self.M,
            schedule=self.cfg.schedule,
        ):
            y, flight.contexts[mb] = self.stack.forward(flight.inputs.pop(mb), self.meter, self.watch)
            if self.is_last:
                # The gradient of the loss starts the backward; dividing by the GLOBAL batch makes
                # the micro-batches' (and dp ranks') gradients add up to the serial gradient.
                share, flight.grads[mb] = softmax_cross_entropy(y, flight.labels.pop(mb), flight.global_batch)
                flight.loss += share
            else:
                flight.outputs[mb] = y

    def _backward(self, step: Backward, flight: InFlight) -> None:
        mb = step.mb
        hook = self.buckets.grads_ready if flight.communicate and mb == self.last_backward_mb else None
        with trace.span(f"B{mb}", "backward", mb=mb, stage=self.s):
            dx = self.stack.backward(flight.contexts.pop(mb), flight.grads.pop(mb), self.meter, hook)
        if not self.is_first:
            flight.input_grads[mb] = dx

    def _send(self, flight: InFlight, array: np.ndarray, dest: int, op: str, tag: int, name: str) -> None:
        buf = np.ascontiguousarray(array)
        with trace.span(name, "comm"):
            request = self.mesh.pp_comm.isend(buf, dest, "activation", op, tag)
        flight.sends.append((request, buf))  # MPI reads buf until the request completes: keep it

    def _recv(self, shape: tuple, source: int, op: str, tag: int, name: str) -> np.ndarray:
        # A FRESH buffer for every message. Forward keeps its input alive (in the Context) until
        # the backward of that micro-batch; if the next message were received into the same
        # buffer, it would silently overwrite activations a pending backward still needs --
        # the classic pipeline bug. np.empty per message makes that impossible.
        buf = np.empty(shape, dtype=self.dtype)
        with trace.span(name, "comm"):
            return self.mesh.pp_comm.recv(buf, source, "activation", op, tag)

    def _send_act(self, step: SendAct, flight: InFlight) -> None:
        self._send(
            flight, flight.outputs.pop(step.mb), self.s + 1, "pp-send-act", _tag(step.mb, ACT), "send act"
        )

    def _recv_act(self, step: RecvAct, flight: InFlight) -> None:
        flight.inputs[step.mb] = self._recv(
            (flight.rows[step.mb], self.width_in), self.s - 1, "pp-send-act", _tag(step.mb, ACT), "recv act"
        )

    def _send_grad(self, step: SendGrad, flight: InFlight) -> None:
        self._send(
            flight,
            flight.input_grads.pop(step.mb),
            self.s - 1,
            "pp-send-grad",
            _tag(step.mb, GRAD),
            "send grad",
        )

    def _recv_grad(self, step: RecvGrad, flight: InFlight) -> None:
        flight.grads[step.mb] = self._recv(
            (flight.rows[step.mb], self.width_out),
            self.s + 1,
            "pp-send-grad",
            _tag(step.mb, GRAD),
            "recv grad",
        )

    def _allreduce(self, step: AllReduceGrads, flight: InFlight) -> None:
        if flight.communicate:  # gradient accumulation: only after the last micro-step
            self.buckets.finish()

    # -- the rest of the strategy interface ----------------------------------------------------------
    def full_weights(self):
        """World rank 0 gets [(W, b)] for every layer; all ranks must call (control traffic).

        dp replicas hold identical weights, so only dp index 0 contributes; inside it, each
        stage's tp group first assembles its shards on tp rank 0 (stack.full_pieces).
        """
        pieces = self.stack.full_pieces() if self.mesh.dp_index == 0 else None
        gathered = self.mesh.world.gather_object(pieces, root=0)
        if self.mesh.world.rank != 0:
            return None
        by_layer = {index: (W, b) for part in gathered if part for index, W, b in part}
        return [by_layer[i] for i in range(self.cfg.n_layers)]

    def memory(self) -> dict:
        return self.memory_of(
            self.store.params.nbytes, self.store.grads.nbytes, self.optimizer.state_nbytes()
        )

    # -- checkpoints: one position, this stage's flat store (train_step's optimizer.step list) -------
    def optimizer_params(self) -> list:
        return [self.store.params]

    def gather_full(self, local):
        """As full_weights: dp index 0 of each stage assembles its layers, world rank 0 collects."""
        pieces = self.stack.full_pieces(local[0]) if self.mesh.dp_index == 0 else None
        gathered = self.mesh.world.gather_object(pieces, root=0)
        if self.mesh.world.rank != 0:
            return None
        by_layer = {index: (W, b) for part in gathered if part for index, W, b in part}
        return [by_layer[i] for i in range(self.cfg.n_layers)]

    def slice_full(self, full):
        return [self.stack.flat_from_full(full)]
