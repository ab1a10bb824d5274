"""Pieces shared by the transformer's tensor-parallel units (tensor_gpt.py, vocab_parallel.py): a unit
whose flat vector is split piece by piece over the tp group, and the row all-gather / reduce-scatter of
sequence parallelism (Korthikanti et al. 2022, sec. 4.2.2)."""

from __future__ import annotations

import math

import numpy as np

from .. import collectives
from ..model.gpt import _cut


def gather_rows(comm, shard: np.ndarray, op: str) -> np.ndarray:
    """All-gather contiguous row shards (n x w each) into all t n rows, in tp rank order (ring)."""
    t, k, n = comm.size, comm.rank, shard.shape[0]
    full = np.empty((n * t, shard.shape[1]), shard.dtype)
    full[k * n : (k + 1) * n] = shard
    return collectives.allgather(comm, full, "activation", op)


def scatter_rows(comm, partial: np.ndarray, op: str) -> np.ndarray:
    """Reduce-scatter r x w partial sums over rows: this rank's r/t rows of the sum (ring)."""
    rows = partial.shape[0] // comm.size
    mine = collectives.reduce_scatter(comm, np.ascontiguousarray(partial), "activation", op)
    return mine.reshape(rows, partial.shape[1])


class Sharded:
    """This rank's share of a unit whose flat vector is a list of pieces, each split along one axis
    over t ranks (rank k takes the k-th of t equal slices) or replicated (axis None)."""

    def __init__(self, unit, pieces: list, t: int, k: int):
        self.unit, self.index, self.rt, self.t, self.k = unit, unit.index, unit.rt, t, k
        self.pieces = pieces  # [(full shape, axis or None)]
        self.local = [
            tuple(n // t if i == axis else n for i, n in enumerate(shape)) for shape, axis in pieces
        ]
        self.size = sum(math.prod(s) for s in self.local)

    def views(self, flat):
        return _cut(flat, self.local)

    def _slice(self, arr, axis):
        n = arr.shape[axis] // self.t
        return arr.take(range(self.k * n, (self.k + 1) * n), axis=axis)

    def cut(self, full_flat: np.ndarray) -> np.ndarray:
        """This rank's flat vector from the whole unit's (initial weights or a checkpoint's)."""
        full = _cut(full_flat, [s for s, _ in self.pieces])
        parts = [p if axis is None else self._slice(p, axis) for p, (_, axis) in zip(full, self.pieces)]
        return np.concatenate([p.reshape(-1) for p in parts])

    def join(self, shards: list[np.ndarray]) -> np.ndarray:
        """The whole unit's flat vector from every rank's (in tp rank order)."""
        views = [self.views(s) for s in shards]
        parts = [
            views[0][n] if axis is None else np.concatenate([v[n] for v in views], axis=axis)
            for n, (_, axis) in enumerate(self.pieces)
        ]
        return np.concatenate([p.reshape(-1) for p in parts])

    def replicated_grads(self, gflat) -> list:
        """Views of the replicated pieces' gradients (what --sp must sum over tp)."""
        return [g for g, (_, axis) in zip(self.views(gflat), self.pieces) if axis is None]
