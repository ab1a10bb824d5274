"""`simpar bench alltoall`: the pairwise exchange against Bruck's algorithm and MPI's own MPI_Alltoallv.

    mpiexec -n 4 python -m mpi4py -m simpar bench alltoall [--sizes 64,1K,16K,256K] [--iters N] [--json]

A size is the bytes of ONE piece: every rank sends that much (float64) to every other rank, as an
expert-parallel group does under balanced routing. For each size and algorithm: the time of one
all-to-all (the median over the timed iterations of the slowest rank's time), what one rank sent and
in how many messages (simpar's own, from the ledger; MPI hides its messages), and the time as a ratio
of the pairwise exchange's and of MPI's. The lesson it measures: Bruck sends ceil(log2 p) messages
instead of p-1 but forwards pieces, (p/2) log2 p of them per rank instead of p-1 for p a power of two,
so it wins where a message's fixed cost dominates (small pieces) and loses where bytes do. The
algorithms take turns inside each iteration, so a noisy neighbour slows them alike.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..collectives import alltoall
from ..runtime.comm import Communicator, Ledger

DEFAULT_SIZES = "64,1K,16K,256K"
ALGORITHMS = ("pairwise", "bruck", "mpi")
NATIVE = "mpi"


def iterations(size: int, iters: int) -> tuple[int, int]:
    """(warm-up, timed): `iters` up to 64 KiB per piece, then fewer (at least 5 unless `iters` is less)."""
    return 2, max(min(5, iters), min(iters, iters * 2**16 // max(size, 1)))


def piece(n: int, src: int, dst: int) -> np.ndarray:
    """What rank src sends rank dst: every rank can compute everyone's, so the result is checked exactly."""
    return np.arange(n, dtype=np.float64) + 1000.0 * src + dst


def native_alltoall(comm: Communicator, send: list[np.ndarray], n: int) -> list[np.ndarray]:
    """MPI_Alltoallv of equal pieces of n float64 (MPI's own algorithm; nothing booked)."""
    p = comm.size
    counts, displs = [n] * p, [i * n for i in range(p)]
    recv = np.empty(p * n)
    comm.mpi.Alltoallv([np.concatenate(send), counts, displs, MPI.DOUBLE], [recv, counts, displs, MPI.DOUBLE])
    return np.split(recv, p)


def measure(comm: Communicator, size: int, iters: int) -> list[dict]:
    """Time every algorithm on pieces of `size` bytes; the rows, identical on every rank."""
    p, r, n = comm.size, comm.rank, size // 8
    send = [piece(n, r, q) for q in range(p)]
    rows = [[n] * p for _ in range(p)]
    warm, timed = iterations(size, iters)
    times = {a: [] for a in ALGORITHMS}
    booked = {}
    for it in range(warm + timed):
        for alg in ALGORITHMS:
            comm.ledger = Ledger()
            comm.mpi.Barrier()
            t0 = MPI.Wtime()
            if alg == NATIVE:
                got = native_alltoall(comm, send, n)
            else:
                got = alltoall(comm, send, rows, "activation", "bench-alltoall", alg)
            elapsed = MPI.Wtime() - t0
            if it >= warm:
                times[alg].append(elapsed)
            if it == 0:
                if not all(np.array_equal(got[q], piece(n, q, r)) for q in range(p)):
                    raise RuntimeError(f"{alg} all-to-all delivered wrong pieces")
                booked[alg] = (int(comm.ledger.sent["activation"]), int(comm.ledger.messages["activation"]))
    out = []
    for alg in ALGORITHMS:
        slowest = np.empty(timed)
        comm.mpi.Allreduce(np.array(times[alg]), slowest, op=MPI.MAX)
        sent, messages = comm.mpi.allreduce(booked[alg][0], op=MPI.MAX), booked[alg][1]
        out.append(
            {
                "size": size,
                "algorithm": alg,
                "iters": timed,
                "time_us": float(np.median(slowest)) * 1e6,
                "sent": None if alg == NATIVE else sent,  # the busiest rank's bytes
                "messages": None if alg == NATIVE else messages,
            }
        )
    pairwise, native = out[0]["time_us"], out[-1]["time_us"]
    for row in out:
        row["vs_pairwise"] = row["time_us"] / pairwise
        row["vs_native"] = row["time_us"] / native
    return out


def format_table(rows: list[dict], p: int) -> str:
    lines = [
        f"# simpar bench alltoall: {p} ranks, equal float64 pieces (size = bytes per piece); time = median "
        "over iterations of the slowest rank",
        "# sent, msgs: one rank's bytes and messages per all-to-all (the ledger; MPI hides its own); "
        "ratios are times (< 1: faster)",
        f"#{'size(B)':>9}  {'algorithm':<15}{'iters':>5} {'time(us)':>10} {'sent(B)':>10} {'msgs':>5} "
        f"{'vs pairwise':>12} {'vs native':>10}",
    ]
    for row in rows:
        name = "mpi (Alltoallv)" if row["algorithm"] == NATIVE else row["algorithm"]
        sent = "-" if row["sent"] is None else f"{row['sent']}"
        msgs = "-" if row["messages"] is None else f"{row['messages']}"
        lines.append(
            f"{row['size']:>10}  {name:<15}{row['iters']:>5} {row['time_us']:>10.1f} {sent:>10} {msgs:>5} "
            f"{row['vs_pairwise']:>11.2f}x {row['vs_native']:>9.2f}x"
        )
    return "\n".join(lines)
