"""The steps a pipeline schedule is made of: small frozen records, one per thing a rank does.

schedules.py lists, for every rank, a sequence of these; engine.py executes them (compute steps on the
rank's model chunks, message steps as point-to-point sends and receives through comms.py), check.py
executes them symbolically to refuse a schedule that could deadlock, and the cost model's recurrences
(costmodel/steptime.py) price them. Each names a micro-batch `mb` and the model chunk it concerns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union


@dataclass(frozen=True)
class Forward:
    """Run chunk `chunk`'s layers on micro-batch `mb`; keep what backward needs. Last chunk: + loss."""

    mb: int
    chunk: int = 0


@dataclass(frozen=True)
class Backward:
    """Differentiate the chunk's layers for micro-batch `mb`: dx, and dW, db added in (+=)."""

    mb: int
    chunk: int = 0


@dataclass(frozen=True)
class BackwardInput:
    """B: only dL/dx of the chunk's layers (dz W^T); the weight gradients wait for BackwardWeight."""

    mb: int
    chunk: int = 0


@dataclass(frozen=True)
class BackwardWeight:
    """W: dW += x^T dz, db += sum(dz) of the chunk's layers; frees the micro-batch's activations."""

    mb: int
    chunk: int = 0


@dataclass(frozen=True)
class RecvAct:
    """Receive (mb, chunk)'s input from chunk-1's rank (blocking)."""

    mb: int
    chunk: int = 0


@dataclass(frozen=True)
class SendAct:
    """Send (mb, chunk)'s output to chunk+1's rank (non-blocking)."""

    mb: int
    chunk: int = 0


@dataclass(frozen=True)
class RecvGrad:
    """Receive the gradient w.r.t. (mb, chunk)'s output from chunk+1's rank (blocking)."""

    mb: int
    chunk: int = 0


@dataclass(frozen=True)
class SendGrad:
    """Send the gradient w.r.t. (mb, chunk)'s input to chunk-1's rank (non-blocking)."""

    mb: int
    chunk: int = 0


@dataclass(frozen=True)
class AllReduceGrads:
    """Sum this rank's gradients over its data-parallel group (no-op when dp = 1)."""


Step = Union[
    Forward, Backward, BackwardInput, BackwardWeight, RecvAct, SendAct, RecvGrad, SendGrad, AllReduceGrads
]
COMPUTE = (Forward, Backward, BackwardInput, BackwardWeight)
LETTER = {Forward: "F", Backward: "B", BackwardInput: "B", BackwardWeight: "W"}


def forward_steps(c: int, C: int, mb: int) -> list[Step]:
    """Receive (unless chunk 0), compute, send (unless the last chunk)."""
    return ([RecvAct(mb, c)] if c > 0 else []) + [Forward(mb, c)] + ([SendAct(mb, c)] if c < C - 1 else [])


def backward_steps(c: int, C: int, mb: int, kind=Backward) -> list[Step]:
    """Receive the output gradient (unless the last chunk), compute (Backward or BackwardInput),
    send the input gradient (unless chunk 0)."""
    return ([RecvGrad(mb, c)] if c < C - 1 else []) + [kind(mb, c)] + ([SendGrad(mb, c)] if c > 0 else [])
