"""`simpar bench allreduce`: simpar's all-reduce algorithms against MPI's own, nccl-tests style.

    mpiexec -n 2 python -m mpi4py -m simpar bench allreduce [--sizes 1K,4K,...,64M]
        [--algorithms ring,rabenseifner,tree,ps] [--dtype float32] [--iters N] [--json]

For each message size and algorithm: the time of one all-reduce (median over the timed
iterations of the slowest rank's time, after warm-up), and the two bandwidths nccl-tests prints
(NVIDIA nccl-tests, doc/PERFORMANCE.md):
  algbw = bytes / time           -- how fast the user's buffer got reduced;
  busbw = algbw * 2(p-1)/p       -- what each rank's link carried if the algorithm were the
                                    bandwidth-optimal ring: comparable across world sizes, and with
                                    the link's peak bandwidth.
MPI's native MPI_Allreduce ("mpi") always runs too, as the yardstick; the last column is each
algorithm's busbw divided by native's. Algorithms take turns inside each iteration, so a noisy
neighbour on a shared machine slows all of them alike instead of whichever ran at the time.
"""
from __future__ import annotations

import argparse
import json
import re

import numpy as np
from mpi4py import MPI

from .collectives import ALLREDUCE_ALGORITHMS, allreduce
from .comm import Communicator, Ledger
from .config import SimparError

DEFAULT_SIZES = "1K,4K,16K,64K,256K,1M,4M,16M,64M"
DEFAULT_ALGORITHMS = "ring,rabenseifner,tree,ps"
DTYPES = ("float32", "float64")
UNITS = {"": 1, "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30}
NATIVE = "mpi"


class _Parser(argparse.ArgumentParser):
    def error(self, message):           # argparse would print usage and exit on every rank
        raise SimparError(f"bench allreduce: {message}")

    def print_help(self, file=None):    # --help: once, not once per rank
        if MPI.COMM_WORLD.Get_rank() == 0:
            super().print_help(file)


def parse_size(text: str) -> int:
    """'1K' -> 1024, '64M' -> 67108864, '4096' -> 4096 (bytes; K, M, G are powers of 1024)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", text, flags=re.IGNORECASE)
    if not m or int(m.group(1)) == 0:
        raise SimparError(f"bench allreduce: bad size {text!r} (use bytes like 4096, 1K, 64M)")
    return int(m.group(1)) * UNITS[m.group(2).upper()]


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = _Parser(prog="simpar bench allreduce", description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default=DEFAULT_SIZES, help=f"message sizes in bytes (default {DEFAULT_SIZES})")
    ap.add_argument("--algorithms", default=DEFAULT_ALGORITHMS,
                    help=f"from {', '.join(ALLREDUCE_ALGORITHMS)}; MPI's native one always runs too")
    ap.add_argument("--dtype", default="float32", choices=DTYPES)
    ap.add_argument("--iters", type=int, default=20, help="timed iterations at 1 MiB and below (fewer above)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    args = ap.parse_args(argv)
    args.sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    if not args.sizes:
        raise SimparError("bench allreduce: --sizes is empty")
    names = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    unknown = [a for a in names if a not in ALLREDUCE_ALGORITHMS]
    if unknown or not names:
        raise SimparError(f"bench allreduce: unknown algorithm {', '.join(unknown) or '(none)'} "
                          f"(choose from {', '.join(ALLREDUCE_ALGORITHMS)})")
    args.algorithms = [NATIVE] + [a for a in dict.fromkeys(names) if a != NATIVE]
    bpe = np.dtype(args.dtype).itemsize
    for size in args.sizes:
        if size % bpe:
            raise SimparError(f"bench allreduce: size {size} is not a multiple of {bpe} bytes ({args.dtype})")
    if args.iters < 1:
        raise SimparError("bench allreduce: --iters must be at least 1")
    return args


def iterations(size: int, iters: int) -> tuple[int, int]:
    """(warm-up, timed) for a message: `iters` up to 1 MiB, then fewer, so each size costs about the
    same wall time (64 MiB: 3 timed). Warm-up rounds (2 up to 1 MiB, then 1) let first-touch page
    faults, the scratch pool's first allocation and MPI's connection setup happen off the clock."""
    timed = max(3, min(iters, iters * 2 ** 20 // size))
    return (2 if size <= 2 ** 20 else 1), timed


def measure(comm: Communicator, size: int, dtype: str, algorithms: list[str], iters: int) -> list[dict]:
    """Time every algorithm on one message size; the rows, identical on every rank."""
    p = comm.size
    buf = np.empty(size // np.dtype(dtype).itemsize, dtype=dtype)
    warm, timed = iterations(size, iters)
    times = {a: [] for a in algorithms}
    for it in range(warm + timed):
        for alg in algorithms:
            buf.fill(1)                 # a fresh input each time (outside the clock): no overflow
            comm.mpi.Barrier()
            t0 = MPI.Wtime()
            allreduce(comm, buf, "model", algorithm=alg)
            elapsed = MPI.Wtime() - t0
            if it >= warm:
                times[alg].append(elapsed)
            if it == 0 and not np.all(buf == p):
                raise RuntimeError(f"{alg} all-reduce gave a wrong sum")
    rows = []
    for alg in algorithms:
        slowest = np.empty(timed)
        comm.mpi.Allreduce(np.array(times[alg]), slowest, op=MPI.MAX)   # the slowest rank, per iteration
        t = float(np.median(slowest))
        algbw = size / t / 1e9
        rows.append({"size": size, "count": buf.size, "algorithm": alg, "iters": timed, "time_us": t * 1e6,
                     "best_us": float(slowest.min()) * 1e6,    # less noisy on a shared machine
                     "algbw_GBps": algbw, "busbw_GBps": algbw * 2 * (p - 1) / p})
    native = rows[0]["busbw_GBps"]
    for row in rows:
        row["vs_native"] = row["busbw_GBps"] / native if native > 0 else float("nan")
    return rows


def format_table(rows: list[dict], p: int, dtype: str) -> str:
    lines = [f"# simpar bench allreduce: {p} ranks, {dtype}, in place, SUM; "
             "time = median over iterations of the slowest rank",
             "# busbw = algbw * 2(p-1)/p (nccl-tests); vs native = busbw / MPI_Allreduce's busbw",
             f"#{'size(B)':>11} {'count':>10}  {'algorithm':<14}{'iters':>5} {'time(us)':>11} "
             f"{'algbw(GB/s)':>12} {'busbw(GB/s)':>12} {'vs native':>10}"]
    for row in rows:
        name = "mpi (native)" if row["algorithm"] == NATIVE else row["algorithm"]
        lines.append(f"{row['size']:>12} {row['count']:>10}  {name:<14}{row['iters']:>5} {row['time_us']:>11.1f} "
                     f"{row['algbw_GBps']:>12.3f} {row['busbw_GBps']:>12.3f} {row['vs_native']:>9.2f}x")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    world = MPI.COMM_WORLD
    if world.Get_size() < 2:
        raise SimparError("bench allreduce needs at least 2 ranks: "
                          "mpiexec -n 2 python -m mpi4py -m simpar bench allreduce")
    comm = Communicator(world, Ledger())
    # MPICH switches Allreduce to its shared-memory algorithm only after a few collective calls
    # (MPIR_CVAR_POSIX_NUM_COLLS_THRESHOLD = 5): time its steady state, not its start-up.
    for _ in range(8):
        world.Allreduce(MPI.IN_PLACE, np.ones(1))
    rows = []
    for size in args.sizes:
        rows += measure(comm, size, args.dtype, args.algorithms, args.iters)
    if comm.rank == 0:
        print(json.dumps({"ranks": comm.size, "dtype": args.dtype, "rows": rows}, indent=1) if args.json
              else format_table(rows, comm.size, args.dtype), flush=True)
    return 0
