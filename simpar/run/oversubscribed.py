"""More ranks than cores (the tour's `mpiexec -n 4` on a 2-core machine): what it costs, measured.

MPICH waits by polling: a rank blocked in MPI keeps its core busy (calling sched_yield only every
MPIR_CVAR_POLLS_BEFORE_YIELD = 1000 polls), so with 4 ranks on 2 cores a rank that has work may sit
on the run queue behind one that only spins, and a message round waits until the scheduler gives
the sender a core again -- a time slice, milliseconds, not microseconds. docs/oversubscription.md
has the measurements (benchmarks/oversubscribed.py) and the MPICH settings tried.

Two things here:
- `wait_yielding`: ranks with nothing to do (those outside a layout while it runs, e.g. ranks 1-3
  during the serial reference) wait in a nonblocking barrier, testing it and sleeping in between,
  so the ranks that compute get the cores (measured: the serial reference's step on 4 ranks).
- `message_round_s`: the median time of one 8-byte ring round (every rank sends right and receives
  left) on the whole world, the unit every collective is built of; and `gap_per_round_s`: how far the
  tour's measured steps exceed the prediction, per message round of the step (from the ledger).
  The tour prints both when ranks outnumber cores: a round alone is cheap, a round between uneven
  compute is not, and that is the measured reason its prediction misses.
"""

from __future__ import annotations

import time

import numpy as np

IDLE_SLEEP_S = 200e-6  # between tests of an idle rank's barrier: long enough to free the core,
# short next to a layout's run (a second or so), so the idle ranks rejoin at once


def oversubscribed(world_size: int, cores: int) -> bool:
    """True when the ranks on this node outnumber its cores (one node: the local profile)."""
    return cores > 0 and world_size > cores


def wait_yielding(mpi_comm, sleep_s: float = IDLE_SLEEP_S) -> None:
    """A barrier that does not spin: test a nonblocking barrier, sleep between tests."""
    request = mpi_comm.Ibarrier()
    while not request.Test():
        time.sleep(sleep_s)


def message_round_s(mpi_comm, rounds: int = 10, batches: int = 31) -> tuple[float, float]:
    """Seconds of one ring round of 8 bytes on all ranks of `mpi_comm`: the median and the 90th
    percentile over batches (the slowest rank's) -- oversubscribed, rounds cost microseconds or a
    whole time slice, so the spread is the finding, not noise to hide."""
    from mpi4py import MPI

    rank, size = mpi_comm.Get_rank(), mpi_comm.Get_size()
    right, left = (rank + 1) % size, (rank - 1) % size
    send, recv = np.zeros(8, np.uint8), np.zeros(8, np.uint8)
    times = []
    for _ in range(batches):
        mpi_comm.Barrier()
        start = time.perf_counter()
        for _ in range(rounds):
            MPI.Request.Waitall([mpi_comm.Irecv(recv, source=left), mpi_comm.Isend(send, dest=right)])
        times.append((time.perf_counter() - start) / rounds)
    median, p90 = float(np.median(times)), float(np.percentile(times, 90))
    return tuple(max(values) for values in zip(*mpi_comm.allgather((median, p90))))


def rounds_per_step(m: dict) -> float:
    """The message rounds one step waits on, from a layout's ledger (the busiest rank): every
    point-to-point message it sent, plus each blocking MPI_Allreduce of the loss (booked as 2
    control messages per call, runtime/comm.py allreduce_scalar)."""
    steps = max(m["steps"], 1)
    per_rank = []
    for r in m["comm"]["ranks"]:
        scalar = r["by_op"].get("control/allreduce-scalar", {}).get("messages", 0) / 2
        per_rank.append(sum(r["messages"].values()) + scalar)
    return max(per_rank) / steps


def gap_per_round_s(results: list) -> float | None:
    """The median, over layouts with more than one rank, of (measured step - predicted step) /
    rounds per step: what a round costs on this machine beyond what the cost model charges."""
    gaps = [
        (m["time"]["step_s_median"] - m["predicted"]["time"]["step_s"]) / rounds_per_step(m)
        for _, m in results
        if m["world_size"] > 1 and rounds_per_step(m) > 0
    ]
    return float(np.median(gaps)) if gaps else None


def oversubscription_note(
    world_size: int, cores: int, round_s: tuple[float, float], gap_s: float | None, alpha_s: float
) -> str:
    """The line the tour prints under its wall-clock table when ranks outnumber cores."""
    median, p90 = (1e6 * t for t in round_s)
    gap = (
        ""
        if gap_s is None
        else f"the steps above exceed pred by a median {1e6 * gap_s:.0f} us per message round, "
    )
    return (
        f"(pred err n/a*: {world_size} ranks on {cores} cores: {gap}while an 8-byte round alone measured "
        f"{median:.0f} us (slowest tenth {p90:.0f} us; the profile's alpha {1e6 * alpha_s:.0f} us): "
        "with ranks out of step a round waits until its peer gets a core, and waiting ranks busy-poll "
        "in MPI; the cost model prices a core share, not that wait (docs/oversubscription.md), "
        "so here pred is a lower bound and --clock sim gives the model's own clock)"
    )
