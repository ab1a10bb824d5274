"""What a message round and a core cost when ranks outnumber cores (docs/oversubscription.md).

    OPENBLAS_NUM_THREADS=1 mpiexec -n 4 python benchmarks/oversubscribed.py      (the peer: -n 2)
    MPIR_CVAR_CH4_PROGRESS_THROTTLE=1 MPIR_CVAR_CH4_PROGRESS_THROTTLE_NO_PROGRESS_COUNT=64 mpiexec ...

Prints one JSON line (microseconds for ring_*/chain_*, milliseconds for gemm_*), the slowest rank's
median: ring rounds of 8 B and 64 KiB (every rank sends right, receives left: the unit of simpar's
collectives); the same round after 5 small GEMMs per rank (37 us each alone); a chain in which rank k
waits for k-1, computes 5 GEMMs and sends to k+1 (a pipeline); a 256x512x512 GEMM with every rank
computing, with the others waiting in MPI, and alone after a barrier. Run it against -n 2 (as many
ranks as cores) and under the MPICH settings you want to compare: the numbers are the ratios.
"""

import json
import os
import time

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
out = {}


def med(ts):
    return float(np.median(ts))


# 1. ring rounds: every rank sends right, receives left (the shape of simpar's ring collectives)
for nbytes in (8, 65536):
    sbuf, rbuf = np.zeros(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
    right, left = (rank + 1) % size, (rank - 1) % size
    ts = []
    for rep in range(60):
        comm.Barrier()
        t = time.perf_counter()
        for _ in range(20):
            r = [comm.Irecv(rbuf, source=left), comm.Isend(sbuf, dest=right)]
            MPI.Request.Waitall(r)
        ts.append((time.perf_counter() - t) / 20)
    out[f"ring_round_{nbytes}"] = max(comm.allgather(med(ts[5:])))

# 2. ring round with a little compute between rounds (as a collective's reduce step, or a layer)
x = np.ones((64, 128))
w = np.ones((128, 128))
tc = []
for _ in range(200):
    t = time.perf_counter()
    x @ w
    tc.append(time.perf_counter() - t)
comm.Barrier()
out["gemm_us_alone_ish"] = med(tc) * 1e6
ts = []
sbuf, rbuf = np.zeros(8, np.uint8), np.zeros(8, np.uint8)
right, left = (rank + 1) % size, (rank - 1) % size
for rep in range(60):
    comm.Barrier()
    t = time.perf_counter()
    for _ in range(20):
        for _ in range(5):
            x @ w
        r = [comm.Irecv(rbuf, source=left), comm.Isend(sbuf, dest=right)]
        MPI.Request.Waitall(r)
    ts.append((time.perf_counter() - t) / 20)
out["ring_round_8_after_5gemm"] = max(comm.allgather(med(ts[5:])))

# 3. pipeline-like chain: rank k waits for k-1, computes, sends to k+1 (others wait meanwhile)
ts = []
for rep in range(60):
    comm.Barrier()
    t = time.perf_counter()
    for _ in range(10):
        if rank > 0:
            comm.Recv(rbuf, source=rank - 1)
        for _ in range(5):
            x @ w
        if rank < size - 1:
            comm.Send(sbuf, dest=rank + 1)
    comm.Barrier()
    ts.append((time.perf_counter() - t) / 10)
out["chain_5gemm_per_hop"] = max(comm.allgather(med(ts[5:])))

# 4. all ranks compute at once, no MPI: the compute share
comm.Barrier()
big_x = np.ones((256, 512))
big_w = np.ones((512, 512))
tc = []
t0 = time.perf_counter()
while time.perf_counter() - t0 < 0.5:
    t = time.perf_counter()
    big_x @ big_w
    tc.append(time.perf_counter() - t)
out["gemm_big_ms_all_busy"] = max(comm.allgather(med(tc))) * 1e3
comm.Barrier()
# 5. rank 0 computes while the others wait in MPI (a Recv from rank 0): stolen core?
tc = []
if rank == 0:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.5:
        t = time.perf_counter()
        big_x @ big_w
        tc.append(time.perf_counter() - t)
    for p in range(1, size):
        comm.Send(sbuf, dest=p)
    out["gemm_big_ms_others_wait_in_mpi"] = med(tc) * 1e3
else:
    comm.Recv(rbuf, source=0)
comm.Barrier()
if rank == 0:
    t0 = time.perf_counter()
    tc = []
    while time.perf_counter() - t0 < 0.3:
        t = time.perf_counter()
        big_x @ big_w
        tc.append(time.perf_counter() - t)
    out["gemm_big_ms_alone"] = med(tc) * 1e3
    out = {k: (v * 1e6 if k.startswith(("ring", "chain")) else v) for k, v in out.items()}
    print(
        json.dumps({"env": os.environ.get("TAG", ""), "n": size, **{k: round(v, 1) for k, v in out.items()}})
    )
