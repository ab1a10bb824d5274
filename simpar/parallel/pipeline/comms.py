"""The pipeline's messages: every byte a stage sends to or receives from another stage.

pipeline.py says WHAT a stage computes in which order; this file says how a chunk's output reaches
the next chunk and its input gradient the previous one, when those live on other ranks:

    SendAct(mb, c)   isend of (mb, c)'s output to chunk c+1's rank      "pp-send-act"
    RecvAct(mb, c)   blocking recv of (mb, c)'s input from chunk c-1's rank
    SendGrad(mb, c)  isend of dL/d(input of (mb, c)) to chunk c-1's rank  "pp-send-grad"
    RecvGrad(mb, c)  blocking recv of dL/d(output of (mb, c)) from chunk c+1's rank

Which rank holds a chunk is the schedule's placement (Schedule.rank_of: c mod S, or zb-v's V). All
of it goes over the stage's pp communicator (self.pp_comm: mesh.pp_comm, with bfloat16 sent as
uint16 views under --precision mixed-bf16) in category "activation", so the ledger counts exactly these bytes.
Under --sp a message carries one tp rank's row shard of the micro-batch, to and from the same tp
rank of the neighbouring stage: 1/t of the bytes (_row_shard).
A message is matched by its tag, 2*(mb*C + receiving chunk) + ACT / GRAD, so several chunks and
micro-batches can be in flight between the same two ranks without mixing up. Sends are non-blocking:
the buffer is kept in `flight.sends` until pipeline._run waits for them at the end of the pass
(schedule_check proves with these semantics, before the run, that no schedule can deadlock).
"""

from __future__ import annotations

import numpy as np

from ...runtime import trace
from .schedules import RecvAct, RecvGrad, SendAct, SendGrad

ACT, GRAD = 0, 1  # the direction part of a tag


def message_tag(mb: int, chunk: int, chunks: int, direction: int) -> int:
    """The tag of the message INTO `chunk` for micro-batch mb (activation or gradient)."""
    return (2 * (mb * chunks + chunk) + direction) % 32_000  # MPI guarantees tags up to at least 32767


class StageMessages:
    """The four message steps of a pipeline stage (mixed into PipelineParallel, which provides
    pp_comm, model and layout (config sections), mesh, kind, S, C, bounds and dtype)."""

    def _send(self, flight, array: np.ndarray, dest: int, op: str, tag: int, name: str) -> None:
        buf = np.ascontiguousarray(array)
        with trace.span(self.pp_comm.runtime, name, "comm"):
            request = self.pp_comm.isend(buf, dest, "activation", op, tag)
        flight.sends.append((request, buf))  # MPI reads buf until the request completes: keep it

    def _recv(self, shape: tuple, source: int, op: str, tag: int, name: str) -> np.ndarray:
        # A FRESH buffer for every message. Forward keeps its input alive (in the Context) until
        # the backward of that micro-batch; if the next message were received into the same
        # buffer, it would silently overwrite activations a pending backward still needs --
        # the classic pipeline bug. np.empty per message makes that impossible.
        buf = np.empty(shape, dtype=self.dtype)
        with trace.span(self.pp_comm.runtime, name, "comm"):
            return self.pp_comm.recv(buf, source, "activation", op, tag)

    def _send_act(self, step: SendAct, flight) -> None:
        mb, c = step.mb, step.chunk
        dest = self.kind.rank_of(c + 1, self.S)
        tag = message_tag(mb, c + 1, self.C, ACT)
        self._send(flight, flight.outputs.pop((mb, c)), dest, "pp-send-act", tag, "send act")

    def _recv_act(self, step: RecvAct, flight) -> None:
        mb, c = step.mb, step.chunk
        shape = self._boundary_shape(flight.rows[mb], self.bounds[c][0])
        source = self.kind.rank_of(c - 1, self.S)
        tag = message_tag(mb, c, self.C, ACT)
        flight.inputs[(mb, c)] = self._recv(shape, source, "pp-send-act", tag, "recv act")

    def _send_grad(self, step: SendGrad, flight) -> None:
        mb, c = step.mb, step.chunk
        dest = self.kind.rank_of(c - 1, self.S)
        tag = message_tag(mb, c - 1, self.C, GRAD)
        self._send(flight, flight.input_grads.pop((mb, c)), dest, "pp-send-grad", tag, "send grad")

    def _recv_grad(self, step: RecvGrad, flight) -> None:
        mb, c = step.mb, step.chunk
        shape = self._boundary_shape(flight.rows[mb], self.bounds[c][1])
        source = self.kind.rank_of(c + 1, self.S)
        tag = message_tag(mb, c, self.C, GRAD)
        flight.grads[(mb, c)] = self._recv(shape, source, "pp-send-grad", tag, "recv grad")

    def _boundary_shape(self, rows: int, layer: int) -> tuple[int, int]:
        """The array that crosses the boundary before `layer`: (rows, its input width), or for --arch gpt
        the residual stream of `rows` sequences, (rows * s, h) (model/gpt.py); under --sp this tp rank's
        contiguous shard of those token rows, rows * s / t (a shard may cut a sequence: t divides s,
        not necessarily the micro-batch's sequences)."""
        if self.model.arch == "gpt":
            rows_s = rows * self.model.seq_len
            return (rows_s // self.mesh.tp if self.layout.sp else rows_s, self.model.hidden)
        return (rows, self.model.layers[layer])

    def _row_shard(self, rows_or_array):
        """--sp (Korthikanti et al. 2022, sec. 4.2.2): the residual stream between stages is sequence-
        sharded, so tp rank k of a stage works on, sends and receives only rows k*r/t .. (k+1)*r/t of
        each micro-batch of r rows (config.validate makes t divide r). Given a micro-batch's array (the
        first stage's inputs, the loss stage's labels): those rows; given the micro-batches' row
        counts: r/t each. Without --sp: unchanged (every tp rank holds every row)."""
        if not self.layout.sp:
            return rows_or_array
        t, k = self.mesh.tp, self.mesh.tp_index
        if isinstance(rows_or_array, list):
            return [r // t for r in rows_or_array]
        n = len(rows_or_array) // t
        return rows_or_array[k * n : (k + 1) * n]

    def _hand_on(self, key: tuple, y: np.ndarray, flight) -> None:
        """(mb, c)'s output for chunk c+1: in memory if this rank holds it too (zb-v's turn), else
        it waits in flight.outputs for its SendAct."""
        mb, c = key
        if self.kind.rank_of(c + 1, self.S) == self.s:
            flight.inputs[(mb, c + 1)] = y
        else:
            flight.outputs[key] = y

    def _hand_back(self, key: tuple, dx: np.ndarray, flight) -> None:
        """dL/d(input of (mb, c)) for chunk c-1: in memory if this rank holds it, else for SendGrad."""
        mb, c = key
        if self.kind.rank_of(c - 1, self.S) == self.s:
            flight.grads[(mb, c - 1)] = dx
        else:
            flight.input_grads[key] = dx
