"""Run under mpiexec by test_collectives.py (beside it): every collective, every size and dtype, one launch.

Starting MPI is the slow part of an MPI test (seconds with 8 ranks on 2 cores), so this script does
all the cases of one world size in one job and rank 0 prints ONE line, `REPORT {json}`, which the
test parses. It only measures -- what each rank got, what its ledger booked -- and leaves the
judging (against the closed-form formulas) to the test.

Each case records, per rank: `err`, the largest error against NumPy's float64 sum of every rank's
input, relative to the sum of magnitudes; `digest`, a hash of the result (replicas must agree
bit for bit); the ledger's `sent`/`received` bytes and `messages` for the call; and `reduced`, the
elements the call added up through the reduce kernel (so a Numba kernel sees every reduction).
"""

from __future__ import annotations

import hashlib
import json
import sys

import numpy as np
from mpi4py import MPI

from simpar import collectives as C
from simpar.runtime.comm import Communicator, Ledger

SIZES = (1, 3, 7, 1000, 1001)
DTYPES = ("float64", "float32")
PER_RANK = ("err", "digest", "sent", "received", "messages", "reduced", "exact")


def contribution(n: int, dtype: str, rank: int) -> np.ndarray:
    """What rank `rank` puts in; every rank can compute everyone's, hence the exact reference."""
    return np.random.default_rng([n, rank, len(dtype)]).standard_normal(n).astype(dtype)


def reference(n: int, dtype: str, p: int) -> tuple[np.ndarray, np.ndarray]:
    """NumPy's float64 sum of all contributions, and the sum of their magnitudes (the error scale)."""
    parts = np.stack([contribution(n, dtype, k).astype(np.float64) for k in range(p)])
    return parts.sum(axis=0), np.abs(parts).sum(axis=0)


def rel_err(got: np.ndarray, want: np.ndarray, scale: np.ndarray) -> float:
    if got.size == 0:
        return 0.0
    return float(np.max(np.abs(got.astype(np.float64) - want) / np.maximum(scale, 1e-300)))


_reduced = [0]


def counting_add(dst: np.ndarray, src: np.ndarray) -> None:
    """The reduce kernel, counting the elements it adds: every reduction must go through it."""
    _reduced[0] += src.size
    np.add(dst, src, out=dst)


class CountingKernels:
    reduce_add = staticmethod(counting_add)


def counted(comm: Communicator, call) -> dict:
    """Run `call` on a fresh ledger; return its bytes and messages (all under category "model")
    and the elements it reduced through the installed kernel."""
    comm.ledger = Ledger()
    _reduced[0] = 0
    result = call()
    led = comm.ledger
    return {
        "result": result,
        "sent": int(led.sent["model"]),
        "received": int(led.received["model"]),
        "messages": int(led.messages["model"]),
        "reduced": _reduced[0],
        "modeled": sorted(led.modeled_ops),
    }


def digest(a: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]


def cases(comm: Communicator):
    p, r = comm.size, comm.rank
    for dtype in DTYPES:
        for n in SIZES:
            want, scale = reference(n, dtype, p)
            for alg in C.ALLREDUCE_ALGORITHMS:
                buf = contribution(n, dtype, r)
                rec = counted(comm, lambda: C.allreduce(comm, buf, "model", algorithm=alg))
                yield {
                    "kind": "allreduce",
                    "alg": alg,
                    "n": n,
                    "dtype": dtype,
                    "err": rel_err(buf, want, scale),
                    "digest": digest(buf),
                    **rec,
                }

            # Which chunk is this rank's: np.array_split's rule written out (tests/conftest.split_sizes),
            # not the collectives' own chunk_bounds, which would agree with a wrong cut.
            sizes = [n // p + (i < n % p) for i in range(p)]
            mine = slice(sum(sizes[:r]), sum(sizes[: r + 1]))
            buf = contribution(n, dtype, r)
            rec = counted(comm, lambda: C.reduce_scatter(comm, buf, "model"))
            yield {
                "kind": "reduce-scatter",
                "n": n,
                "dtype": dtype,
                "err": rel_err(rec["result"], want[mine], scale[mine]),
                **rec,
            }

            full = contribution(n, dtype, 0)  # everyone's chunk of one known array
            buf = np.zeros(n, dtype=dtype)
            buf[mine] = full[mine]
            rec = counted(comm, lambda: C.allgather(comm, buf, "model"))
            yield {
                "kind": "all-gather",
                "n": n,
                "dtype": dtype,
                "exact": bool(np.array_equal(buf, full)),
                **rec,
            }

            for root in sorted({0, p - 1}):
                buf = full.copy() if r == root else np.zeros(n, dtype=dtype)
                rec = counted(comm, lambda: C.broadcast(comm, buf, root, "model"))
                yield {
                    "kind": "broadcast",
                    "root": root,
                    "n": n,
                    "dtype": dtype,
                    "exact": bool(np.array_equal(buf, full)),
                    **rec,
                }


def concurrent(comm: Communicator):
    """Two all-reduces in flight at once, advanced in a different order on odd and even ranks."""
    p, r = comm.size, comm.rank
    for alg in C.ALLREDUCE_ALGORITHMS:
        a, b = contribution(1001, "float64", r), contribution(1000, "float32", r)  # sizes differ: a
        first = C.start_allreduce(comm, a, "model", algorithm=alg)  # cross-matched message
        second = C.start_allreduce(comm, b, "model", algorithm="ring")  # would be an MPI error
        order = (first, second) if r % 2 == 0 else (second, first)
        while not (first.done and second.done):
            for pending in order:
                pending.progress()
        first.wait()
        second.wait()
        err = max(rel_err(a, *reference(1001, "float64", p)), rel_err(b, *reference(1000, "float32", p)))
        yield {"kind": "concurrent", "alg": alg, "err": err}


def main() -> None:
    comm = Communicator(MPI.COMM_WORLD, Ledger())
    comm.runtime.kernels = CountingKernels  # this run's reduce kernel: the collectives find it on comm
    mine = []
    for case in [*cases(comm), *concurrent(comm)]:
        case.pop("result", None)
        mine.append(case)
    everyone = comm.mpi.gather(mine, root=0)  # raw MPI: not part of what is being measured
    if comm.rank == 0:
        merged = []
        for i, case in enumerate(everyone[0]):
            row = {k: v for k, v in case.items() if k not in PER_RANK}
            for key in PER_RANK:
                if key in case:
                    row[key] = [everyone[k][i][key] for k in range(comm.size)]
            merged.append(row)
        print("REPORT " + json.dumps({"p": comm.size, "cases": merged}))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
