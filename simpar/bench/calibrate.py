"""`python -m simpar bench --calibrate`: measure this machine for the `local` hardware profile.

GEMM rate on one thread (fp64, fp32), the speed of `dst += src` on 64 MiB (gamma: main memory, as
large reductions see it), the link between 2 local ranks (alpha, beta: fitted to simpar's own ring
all-reduce at 16 KiB and 4 MiB, the path training's messages take; the raw MPI ping-pong if the fit
fails), and the per-layer call overhead of a tiny model. The result is a
costmodel.hardware.Hardware, saved as JSON.
"""

from __future__ import annotations

import json
import os

from ..config import SimparError
from ..costmodel.hardware import Hardware
from ..units import one_thread_env


def measure_gemm(dtype: str, rows: int = 512, width: int = 1024, seconds: float = 0.6) -> float:
    """Single-thread GEMM rate in FLOP/s (the caller has capped BLAS at one thread), on the three
    products of a training layer -- x @ W, x.T @ dz, dz @ W.T for `rows` x `width` x `width` -- since
    OpenBLAS runs tall, transposed shapes slower than the square ones a textbook benchmark uses."""
    import time

    import numpy as np

    rng = np.random.default_rng(0)
    x, W, dz = (rng.standard_normal(s).astype(dtype) for s in ((rows, width), (width, width), (rows, width)))
    products = (lambda: x @ W, lambda: x.T @ dz, lambda: dz @ W.T)
    for f in products:
        f()
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for f in products:
            f()
        count += 1
    return 3 * 2.0 * rows * width * width * count / (time.perf_counter() - start)


def measure_gamma(nbytes: int = 1 << 26, seconds: float = 0.5) -> float:
    """Seconds per byte of `dst += src` (the reduction inside every reducing collective).

    On 64 MiB, i.e. from main memory, not cache: the buffers that matter (gradient buckets, the
    optimizer's sweep over all parameters) are that large; a 4 MiB measurement ran 2.4x too fast."""
    import time

    import numpy as np

    dst = np.ones(nbytes // 8)
    src = np.ones_like(dst)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        np.add(dst, src, out=dst)
        count += 1
    return (time.perf_counter() - start) / (count * dst.nbytes)


def measure_layer_overhead(repeats: int = 400) -> float:
    """Seconds per layer per micro-batch of forward + backward + optimizer on a model so small that
    its arithmetic is nothing: what remains is the cost of the calls themselves."""
    import time

    import numpy as np

    from ..model.mlp import forward_backward, serial_store
    from ..model.optim import SGD

    store, opt = serial_store([8, 8, 8, 8, 8], "relu", 0, np.float64), SGD(0.01, 0.9)
    x, y = np.ones((1, 8)), np.zeros(1, dtype=np.int64)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        store.zero_grad()
        forward_backward(store, x, y, 1)
        opt.step([store.params], [store.grads])
        times.append(time.perf_counter() - start)
    return float(np.median(times)) / len(store.layers)


def pingpong_main() -> None:
    """Run on 2 ranks: fit alpha and beta from round trips of a small and a large message."""
    import time

    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, peer = comm.Get_rank(), 1 - comm.Get_rank()
    result = {}
    for size, reps in ((8, 2000), (1 << 22, 40)):
        buf = np.zeros(size, dtype=np.uint8)
        for phase in ("warm", "time"):
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(reps if phase == "time" else 5):
                if rank == 0:
                    comm.Send(buf, dest=peer)
                    comm.Recv(buf, source=peer)
                else:
                    comm.Recv(buf, source=peer)
                    comm.Send(buf, dest=peer)
            result[size] = (time.perf_counter() - start) / (2 * reps)  # one-way time
    ring = time_ring_allreduce(comm)
    # Both ranks multiply at once: what one rank's GEMM rate becomes when every core runs one
    # (shared caches and memory bus, lower turbo clocks) -- the local profile's busy_share.
    comm.Barrier()
    busy = comm.gather(measure_gemm("float32"), root=0)
    # And numpy.add on 64 MiB on both at once: memory-bound work shares the memory bus (busy_stream_share).
    comm.Barrier()
    busy_gamma = comm.gather(measure_gamma(), root=0)
    if rank == 0:
        small, big = result[8], result[1 << 22]
        alpha = small
        beta = max(big - alpha, 1e-12) / (1 << 22)
        out = {"alpha": alpha, "beta": beta, "busy_gemm": sum(busy) / len(busy), "ring": ring}
        print(json.dumps(out | {"busy_gamma": max(busy_gamma)}))


RING_SIZES = (1 << 14, 1 << 22)  # bytes: one all-reduce latency-bound, one bandwidth-bound


def time_ring_allreduce(mpi_comm, repeats: int = 30) -> dict:
    """Seconds of one float32 all-reduce of each of RING_SIZES through simpar's own path -- the
    Communicator (ledger included) and the ring of collectives/ring.py, as training runs it -- the
    slower rank's median. A raw MPI ping-pong misses what each round of that path costs (Python,
    the generator, both ranks sending at once); fit_link turns these into alpha and beta."""
    import time

    import numpy as np

    from ..collectives import allreduce
    from ..runtime.comm import Communicator, Ledger

    comm = Communicator(mpi_comm, Ledger())
    out = {}
    for size in RING_SIZES:
        buf = np.ones(size // 4, dtype=np.float32)
        times = []
        for _ in range(repeats + 3):
            buf.fill(1)
            mpi_comm.Barrier()
            start = time.perf_counter()
            allreduce(comm, buf, "model", algorithm="ring")
            times.append(time.perf_counter() - start)
        out[size] = max(mpi_comm.allgather(float(np.median(times[3:]))))
    return out


def fit_link(ring: dict, gamma: float) -> tuple[float, float] | None:
    """(alpha, beta) such that the cost model's ring all-reduce on 2 ranks -- rounds x alpha +
    elements on its critical path x 4 x beta + elements reduced x 4 x gamma (costmodel.collectives,
    Thakur et al. 2005) -- takes the measured time at both sizes; None when the fit is not
    positive (noise), and the caller keeps the ping-pong's numbers."""
    from ..costmodel.collectives import ring_allreduce

    (n1, t1), (n2, t2) = ((n // 4, ring[n]) for n in RING_SIZES)
    c1, c2 = ring_allreduce(n1, 2, 0), ring_allreduce(n2, 2, 0)
    rest1, rest2 = t1 - 4 * c1.reduced * gamma, t2 - 4 * c2.reduced * gamma
    beta = (rest2 - rest1 * c2.rounds / c1.rounds) / (
        4 * (c2.round_elems - c1.round_elems * c2.rounds / c1.rounds)
    )
    alpha = (rest1 - 4 * c1.round_elems * beta) / c1.rounds
    return (alpha, beta) if alpha > 0 and beta > 0 else None


def calibrate(timeout: float = 25.0) -> Hardware:
    """Measure this machine (< 30 s): GEMM rates, reduction speed, and MPI ping-pong on 2 ranks."""
    import subprocess
    import sys
    from pathlib import Path

    flops = {"fp64": measure_gemm("float64"), "fp32": measure_gemm("float32")}
    flops["mixed"] = flops["fp32"]  # NumPy has no fast half-precision GEMM: mixed runs at fp32 speed
    gamma = measure_gamma()
    mpiexec = Path(sys.executable).parent / "mpiexec"
    cmd = [
        str(mpiexec) if mpiexec.exists() else "mpiexec",
        "-n",
        "2",
        sys.executable,
        "-c",
        "from simpar.bench.calibrate import pingpong_main; pingpong_main()",
    ]
    env = one_thread_env(dict(os.environ))
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2]) + os.pathsep + env.get("PYTHONPATH", "")
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SimparError(f"calibration: could not run the MPI ping-pong ({exc})") from None
    if out.returncode != 0 or not out.stdout.strip():
        raise SimparError(f"calibration: the MPI ping-pong failed: {out.stderr.strip()[-300:]}")
    pp = json.loads(out.stdout.strip().splitlines()[-1])
    fitted = fit_link({int(k): v for k, v in pp["ring"].items()}, gamma)
    if fitted:  # the link as simpar's own messages see it (fit_link); else the raw ping-pong's
        pp["alpha"], pp["beta"] = fitted
    try:
        memory = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        memory = 0.0
    return Hardware(
        name="local",
        description=f"this machine, calibrated ({os.cpu_count()} cores, 1 thread per rank)",
        flops=flops,
        gamma=gamma,
        intra_alpha=pp["alpha"],
        intra_bw=1.0 / pp["beta"],
        devices_per_node=1 << 30,
        memory_bytes=memory,
        intra_name="shared-memory",
        inter_name="none",
        cores=os.cpu_count() or 1,
        busy_share=min(1.0, pp["busy_gemm"] / flops["fp32"]),
        busy_stream_share=min(1.0, gamma / pp["busy_gamma"]),
        layer_overhead=measure_layer_overhead(),
        host_progress=True,  # MPI on CPU cores: collectives take the rank's own time (hardware.py)
        sources=[
            "measured by `python -m simpar bench --calibrate`: the three GEMMs of a 512x1024x1024 layer "
            "on one thread (alone, and with every core doing the same: busy_share), numpy.add "
            "on 64 MiB (alone, and on every core at once: busy_stream_share), alpha and beta "
            "fitted to simpar's ring all-reduce of 16 KiB and 4 MiB on 2 "
            "local ranks (else an MPI ping-pong of 8 B and 4 MiB, one-way time), "
            "forward+backward+SGD of a 4-layer 8-wide MLP on one row (per-layer call overhead)"
        ],
    )
