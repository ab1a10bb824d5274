"""Collective algorithms built from the Communicator's counted point-to-point messages.

One file per algorithm, all on base.py's generator shape (see its docstring):

  ring.py          ring reduce-scatter, all-gather, all-reduce     (Patarasuk & Yuan 2009)
  tree.py          binomial broadcast; binomial-tree all-reduce     (Thakur et al. 2005, sec. 4)
  rabenseifner.py  recursive halving + doubling all-reduce          (Rabenseifner 2004)
  ps.py            parameter-server all-reduce                      (Li et al. 2014)
  native.py        MPI's own MPI_Allreduce (volume booked as modeled)
  alltoall.py      pairwise-exchange all-to-all of pieces of any size (expert parallelism)
  bruck.py         Bruck's all-to-all: log2 p rounds, pieces forwarded  (Bruck et al. 1997)

Every all-reduce moves 2(p-1) N elements over all ranks; each file's docstrings derive how that
is spread over ranks and rounds. `--collectives NAME` picks the all-reduce from ALLREDUCE_ALGORITHMS.
This module is the API the strategies call: start_allreduce / allreduce / reduce_scatter /
allgather / broadcast.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from ..runtime import flight
from ..runtime.comm import Communicator
from .alltoall import alltoall, pairwise_alltoall_rounds  # noqa: F401
from .base import (  # noqa: F401
    Pending,
    Rounds,
    _flat,
    chunk_bounds,
    new_tag,
    offsets,
    reduce_add,
    run,
    scratch,
)
from .bruck import bruck_alltoall_rounds, bruck_rounds  # noqa: F401
from .native import mpi_allreduce_rounds
from .ps import ps_allreduce_rounds
from .rabenseifner import rabenseifner_allreduce_rounds
from .ring import ring_allgather_rounds, ring_allreduce_rounds, ring_reduce_scatter_rounds
from .tree import binomial_broadcast_rounds, tree_allreduce_rounds

ALLREDUCE_ALGORITHMS: dict[str, Callable[..., Rounds]] = {
    "ring": ring_allreduce_rounds,
    "rabenseifner": rabenseifner_allreduce_rounds,
    "tree": tree_allreduce_rounds,
    "ps": ps_allreduce_rounds,
    "mpi": mpi_allreduce_rounds,
    "auto": ring_allreduce_rounds,  # moves the ring's bytes; the simulated clock prices it as NCCL picks
}


def _call(comm: Communicator, buf: np.ndarray, category: str, op: str, kind: str = "", ring: bool = False,
          nvls: bool = False) -> dict:  # fmt: skip
    """What the flight recorder and --check-collectives know of a call, and what the simulated clock
    prices it by: `kind` of a `ring` collective (NCCL's protocols), `nvls` allowed (--collectives auto)."""
    return {"comm": comm, "op": op, "category": category, "nbytes": buf.nbytes, "dtype": buf.dtype,
            "kind": kind, "ring": ring, "nvls": nvls}  # fmt: skip


def _skipped(comm: Communicator, buf: np.ndarray, category: str, op: str) -> Pending:
    """--inject desync: this rank skips the collective its peers make, as a rank whose code took
    another branch would: its call count and tags move on, its peers wait for messages that never
    come (the watchdog, the flight recorder and --check-collectives then say so)."""
    new_tag(comm)
    comm.runtime.recorder.record(
        "collective",
        f"{op} (skipped)",
        category,
        comm.name,
        "its group",
        buf.nbytes,
        members=comm.world_ranks,
    )
    return Pending(iter(()))


def start_allreduce(
    comm: Communicator, buf: np.ndarray, category: str, op: str = "allreduce", algorithm: str = "ring"
) -> Pending:
    """Begin summing `buf` over the group, in place; returns the in-flight collective."""
    if flight.take_desync(comm.runtime.recorder):
        return _skipped(comm, buf, category, op)
    rounds = ALLREDUCE_ALGORITHMS[algorithm](comm, _flat(buf), category, op)
    ring, nvls = algorithm in ("ring", "auto"), algorithm == "auto"
    return Pending(rounds, comm, _call(comm, buf, category, op, "all-reduce", ring, nvls))


def allreduce(
    comm: Communicator, buf: np.ndarray, category: str, op: str = "allreduce", algorithm: str = "ring"
) -> np.ndarray:
    start_allreduce(comm, buf, category, op, algorithm).wait()
    return buf


def reduce_scatter(
    comm: Communicator, buf: np.ndarray, category: str, op: str = "reduce-scatter"
) -> np.ndarray:
    """Sum over the group; returns a view of this rank's chunk (chunk `comm.rank`) of `buf`."""
    flat = _flat(buf)
    if flight.take_desync(comm.runtime.recorder):
        _skipped(comm, buf, category, op)
    else:
        call = _call(comm, buf, category, op, "reduce-scatter", ring=True)
        run(ring_reduce_scatter_rounds(comm, flat, category, op), comm, call)
    bounds = offsets(flat.size, comm.size)
    return flat[bounds[comm.rank] : bounds[comm.rank + 1]]


def allgather(comm: Communicator, buf: np.ndarray, category: str, op: str = "all-gather") -> np.ndarray:
    """Every rank has written its chunk `comm.rank` of `buf`; fill in everyone else's."""
    if flight.take_desync(comm.runtime.recorder):
        _skipped(comm, buf, category, op)
    else:
        call = _call(comm, buf, category, op, "all-gather", ring=True)
        run(ring_allgather_rounds(comm, _flat(buf), category, op), comm, call)
    return buf


def broadcast(
    comm: Communicator, buf: np.ndarray, root: int, category: str, op: str = "broadcast"
) -> np.ndarray:
    run(binomial_broadcast_rounds(comm, buf, root, category, op), comm, _call(comm, buf, category, op))
    return buf
