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

import numpy as np
from mpi4py import MPI

from ..collectives import ALLREDUCE_ALGORITHMS, allreduce  # noqa: F401  (cli/bench.py reads it here)
from ..runtime.comm import Communicator, Ledger  # noqa: F401  (cli/bench.py builds them)

DEFAULT_SIZES = "1K,4K,16K,64K,256K,1M,4M,16M,64M"
DEFAULT_ALGORITHMS = "ring,rabenseifner,tree,ps"
DTYPES = ("float32", "float64")
UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}
NATIVE = "mpi"


def iterations(size: int, iters: int) -> tuple[int, int]:
    """(warm-up, timed) for a message: `iters` up to 1 MiB, then fewer, so each size costs about the
    same wall time (but at least 5 timed unless `iters` is less: a median needs several). Warm-up
    rounds (2 up to 1 MiB, then 1) let first-touch page faults, the scratch pool's first allocation and MPI's
    connection setup happen off the clock."""
    timed = max(min(5, iters), min(iters, iters * 2**20 // size))
    return (2 if size <= 2**20 else 1), timed


def stream_bandwidth(comm: Communicator, nbytes: int = 1 << 26, repeats: int = 5) -> float:
    """Bytes per second ONE rank moves through memory while every rank does the same: `dst = a + b`
    on arrays of `nbytes` (3 x nbytes moved per call), the median of `repeats`, all ranks at once
    (they share the memory bus, as they do inside an all-reduce)."""
    a = np.ones(nbytes // 8)
    b, dst = a.copy(), np.empty_like(a)
    times = []
    for _ in range(repeats + 1):
        comm.mpi.Barrier()
        t0 = MPI.Wtime()
        np.add(a, b, out=dst)
        times.append(MPI.Wtime() - t0)
    return 3 * nbytes / float(np.median(times[1:]))


def ring_roofline_s(size: int, p: int, bandwidth: float) -> float:
    """The least time a ring all-reduce of `size` bytes can take when memory is the limit.

    Over shared memory a message is one copy (MPICH's single-copy path: the receiver reads the
    sender's buffer): 2 bytes moved per byte sent. Per rank, with chunks c = size/p: the
    reduce-scatter's p-1 rounds each copy a chunk in (2c) and add it (read 2c, write c: 3c); the
    all-gather's p-1 rounds each copy a chunk (2c). That is 7 (p-1)/p x size bytes per rank, at the
    bandwidth one rank gets while all of them stream (`stream_bandwidth`)."""
    return 7 * (p - 1) / p * size / bandwidth


def measure(comm: Communicator, size: int, dtype: str, algorithms: list[str], iters: int) -> list[dict]:
    """Time every algorithm on one message size; the rows, identical on every rank."""
    p = comm.size
    buf = np.empty(size // np.dtype(dtype).itemsize, dtype=dtype)
    warm, timed = iterations(size, iters)
    times = {a: [] for a in algorithms}
    for it in range(warm + timed):
        for alg in algorithms:
            buf.fill(1)  # a fresh input each time (outside the clock): no overflow
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
        comm.mpi.Allreduce(np.array(times[alg]), slowest, op=MPI.MAX)  # the slowest rank, per iteration
        t = float(np.median(slowest))
        algbw = size / t / 1e9
        rows.append(
            {
                "size": size,
                "count": buf.size,
                "algorithm": alg,
                "iters": timed,
                "time_us": t * 1e6,
                "best_us": float(slowest.min()) * 1e6,  # less noisy on a shared machine
                "algbw_GBps": algbw,
                "busbw_GBps": algbw * 2 * (p - 1) / p,
            }
        )
    native = rows[0]["busbw_GBps"]
    for row in rows:
        row["vs_native"] = row["busbw_GBps"] / native if native > 0 else float("nan")
    return rows


def add_roofline(rows: list[dict], p: int, bandwidth: float) -> None:
    """Each row gets the memory roofline's time and the fraction of it the algorithm reaches."""
    for row in rows:
        row["stream_GBps"] = bandwidth / 1e9
        row["roofline_us"] = ring_roofline_s(row["size"], p, bandwidth) * 1e6
        row["of_roofline"] = row["roofline_us"] / row["time_us"]


def format_table(rows: list[dict], p: int, dtype: str) -> str:
    lines = [
        f"# simpar bench allreduce: {p} ranks, {dtype}, in place, SUM; "
        "time = median over iterations of the slowest rank",
        "# busbw = algbw * 2(p-1)/p (nccl-tests); vs native = busbw / MPI_Allreduce's busbw",
        "# roofline = 7(p-1)/p x size / stream: the memory traffic a shared-memory ring must make, at the "
        "bandwidth (GB/s)",
        "# each rank gets while all stream, measured just before each size; of roof = roofline / time",
        f"#{'size(B)':>11} {'count':>10}  {'algorithm':<14}{'iters':>5} {'time(us)':>11} "
        f"{'algbw(GB/s)':>12} {'busbw(GB/s)':>12} {'vs native':>10} {'stream':>7} "
        f"{'roof(us)':>9} {'of roof':>8}",
    ]
    for row in rows:
        name = "mpi (native)" if row["algorithm"] == NATIVE else row["algorithm"]
        lines.append(
            f"{row['size']:>12} {row['count']:>10}  {name:<14}{row['iters']:>5} {row['time_us']:>11.1f} "
            f"{row['algbw_GBps']:>12.3f} {row['busbw_GBps']:>12.3f} {row['vs_native']:>9.2f}x "
            f"{row['stream_GBps']:>7.2f} {row['roofline_us']:>9.1f} {row['of_roofline']:>7.0%}"
        )
    return "\n".join(lines)
