"""`python -m simpar bench ...`: micro-benchmarks and hardware calibration (the code is in simpar/bench/).

python -m simpar bench matmul [--sizes 256,512,1024 --dtype float64 --repeat 7 --json --breakdown]
mpiexec -n 2 python -m mpi4py -m simpar bench allreduce [--sizes 1K,...,64M --algorithms ring,tree]
mpiexec -n 4 python -m mpi4py -m simpar bench alltoall [--sizes 64,1K,16K,256K --iters N]   pairwise
                                                 vs Bruck vs MPI_Alltoallv, pieces of SIZE bytes
python -m simpar bench --fit-profile LOG... -o my.json   a profile fitted to nccl-tests logs (fitprofile.py)
python -m simpar bench --calibrate [-o FILE]     measure this machine (< 30 s) and save a hardware
                                                 profile for `plan --hardware local`
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from ..collectives import ALLREDUCE_ALGORITHMS
from ..config import SimparError
from ..files import atomic_write
from ..units import parse_buffer_size
from .base import Parser

USAGE = (
    "usage: simpar bench matmul [ARGS] | simpar bench allreduce [ARGS] | simpar bench alltoall [ARGS] | "
    "simpar bench --calibrate [-o FILE]"
)


def bench_main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if argv[0] == "matmul":
        return matmul_main(argv[1:])
    if argv[0] == "allreduce":
        return allreduce_main(argv[1:])
    if argv[0] == "alltoall":
        return alltoall_main(argv[1:])
    if argv[0].startswith("--calibrate"):
        return calibrate_main(argv)
    if argv[0].startswith("--fit-profile"):
        from .fitprofile import fit_profile_main

        return fit_profile_main(argv)
    raise SimparError(f"unknown benchmark {argv[0]!r}; {USAGE}")


# -- bench matmul ------------------------------------------------------------------------------------


def matmul_parser() -> argparse.ArgumentParser:
    from ..bench import matmul

    p = Parser(
        prog="simpar bench matmul",
        description="GFLOP/s of NumPy vs simpar's Numba matmul and fused linear layer (1 thread).",
    )
    p.add_argument("--sizes", default="256,512,1024", help="square sizes n, comma-separated")
    p.add_argument("--dtype", default="float32", help="float32 | float64")
    p.add_argument("--repeat", type=int, default=5, help="timed calls per measurement (median)")
    p.add_argument("--batch", type=int, default=128, help="rows of x for the fused-layer comparison")
    p.add_argument("--act", default="relu", help=" | ".join(matmul.ACTS))
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument(
        "--breakdown",
        action="store_true",
        help="also time the Numba GEMM's parts alone: packing B, packing A, the micro-kernel (and in L1)",
    )
    return p


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise SimparError(
            f"--sizes {text!r}: expected comma-separated whole numbers, e.g. 256,512,1024"
        ) from None
    if not sizes or any(not 1 <= n <= 8192 for n in sizes):
        raise SimparError(f"--sizes {text!r}: each size must be between 1 and 8192")
    return sizes


def matmul_main(argv: list[str]) -> int:
    from ..bench import matmul

    args = matmul_parser().parse_args(argv)
    sizes = parse_sizes(args.sizes)
    if args.dtype not in ("float32", "float64"):
        raise SimparError(f"--dtype {args.dtype!r}: choose float32 or float64")
    if args.repeat < 1:
        raise SimparError("--repeat must be at least 1")
    if args.batch < 1:
        raise SimparError("--batch must be at least 1")
    if args.act not in matmul.ACTS:
        raise SimparError(f"--act {args.act!r}: choose from {', '.join(matmul.ACTS)}")
    dtype = np.dtype(args.dtype)
    threads = os.environ.get("OPENBLAS_NUM_THREADS", "unset (OpenBLAS uses every core)")

    t0 = time.perf_counter()
    from kernels import cpu

    tiny = np.ones((2, 2), dtype)
    cpu.matmul(tiny, tiny)
    cpu.NumbaKernels.linear_act_forward(tiny, tiny, tiny[0], args.act)
    ready_s = time.perf_counter() - t0

    rows = [matmul.measure(n, dtype, args.repeat, args.batch, args.act) for n in sizes]
    parts = [matmul.breakdown(n, dtype, args.repeat) for n in sizes] if args.breakdown else None
    if args.json:
        print(
            json.dumps(
                {
                    "dtype": args.dtype,
                    "blas_threads": threads,
                    "repeat": args.repeat,
                    "numba_ready_s": ready_s,
                    "results": rows,
                    "breakdown": parts,
                }
            )
        )
    else:
        print(matmul.format_table(rows, args.dtype, threads, ready_s))
        if parts:
            print()
            print(matmul.format_breakdown(parts, args.dtype))
    return 0


# -- bench allreduce --------------------------------------------------------------------------------


def allreduce_args(argv: list[str]) -> argparse.Namespace:
    from ..bench import allreduce

    ap = Parser(
        prog="simpar bench allreduce",
        description=allreduce.__doc__.split("\n")[0],
        error_prefix="bench allreduce: ",
    )
    ap.add_argument(
        "--sizes",
        default=allreduce.DEFAULT_SIZES,
        help=f"message sizes in bytes (default {allreduce.DEFAULT_SIZES})",
    )
    ap.add_argument(
        "--algorithms",
        default=allreduce.DEFAULT_ALGORITHMS,
        help=f"from {', '.join(ALLREDUCE_ALGORITHMS)}; MPI's native one always runs too",
    )
    ap.add_argument("--dtype", default="float32", choices=allreduce.DTYPES)
    ap.add_argument("--iters", type=int, default=20, help="timed iterations at 1 MiB and below (fewer above)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    args = ap.parse_args(argv)
    args.sizes = buffer_sizes("allreduce", args.sizes)
    names = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    unknown = [a for a in names if a not in ALLREDUCE_ALGORITHMS]
    if unknown or not names:
        raise SimparError(
            f"bench allreduce: unknown algorithm {', '.join(unknown) or '(none)'} "
            f"(choose from {', '.join(ALLREDUCE_ALGORITHMS)})"
        )
    args.algorithms = [allreduce.NATIVE] + [a for a in dict.fromkeys(names) if a != allreduce.NATIVE]
    bpe = np.dtype(args.dtype).itemsize
    for size in args.sizes:
        if size % bpe:
            raise SimparError(f"bench allreduce: size {size} is not a multiple of {bpe} bytes ({args.dtype})")
    if args.iters < 1:
        raise SimparError("bench allreduce: --iters must be at least 1")
    return args


def allreduce_main(argv: list[str]) -> int:
    from ..bench import allreduce

    args = allreduce_args(argv)
    from mpi4py import MPI

    comm = bench_world("allreduce", 2)
    world = comm.mpi
    # MPICH switches Allreduce to its shared-memory algorithm only after a few collective calls
    # (MPIR_CVAR_POSIX_NUM_COLLS_THRESHOLD = 5): time its steady state, not its start-up.
    for _ in range(8):
        world.Allreduce(MPI.IN_PLACE, np.ones(1))
    rows = []
    for size in args.sizes:
        # The memory roofline's bandwidth is measured again just before each size: this machine's
        # speed drifts over minutes, and a fraction of a roofline is only honest if both are taken together.
        bandwidth = comm.mpi.allreduce(allreduce.stream_bandwidth(comm), op=MPI.MIN)
        measured = allreduce.measure(comm, size, args.dtype, args.algorithms, args.iters)
        allreduce.add_roofline(measured, comm.size, bandwidth)
        rows += measured
    if comm.rank == 0:
        doc = {"ranks": comm.size, "dtype": args.dtype, "rows": rows}
        print(
            json.dumps(doc, indent=1) if args.json else allreduce.format_table(rows, comm.size, args.dtype),
            flush=True,
        )
    return 0


def buffer_sizes(name: str, text: str) -> list[int]:
    """--sizes 1K,4M -> bytes; an empty list is one error line."""
    sizes = [parse_buffer_size(s) for s in text.split(",") if s.strip()]
    if not sizes:
        raise SimparError(f"bench {name}: --sizes is empty")
    return sizes


def bench_world(name: str, ranks: int):
    """MPI's world as a counted Communicator, for a benchmark that needs at least 2 ranks."""
    from mpi4py import MPI

    from ..runtime.comm import Communicator, Ledger

    if MPI.COMM_WORLD.Get_size() < 2:
        raise SimparError(
            f"bench {name} needs at least 2 ranks: mpiexec -n {ranks} python -m mpi4py -m simpar bench {name}"
        )
    return Communicator(MPI.COMM_WORLD, Ledger())


# -- bench alltoall ---------------------------------------------------------------------------------


def alltoall_args(argv: list[str]) -> argparse.Namespace:
    from ..bench import alltoall

    ap = Parser(
        prog="simpar bench alltoall",
        description=alltoall.__doc__.split("\n")[0],
        error_prefix="bench alltoall: ",
    )
    ap.add_argument(
        "--sizes", default=alltoall.DEFAULT_SIZES, help=f"bytes per piece (default {alltoall.DEFAULT_SIZES})"
    )
    ap.add_argument(
        "--iters", type=int, default=40, help="timed iterations up to 64 KiB pieces (fewer above)"
    )
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    args = ap.parse_args(argv)
    args.sizes = buffer_sizes("alltoall", args.sizes)
    for size in args.sizes:
        if size < 8 or size % 8:
            raise SimparError(f"bench alltoall: size {size} is not a positive multiple of 8 bytes (float64)")
    if args.iters < 1:
        raise SimparError("bench alltoall: --iters must be at least 1")
    return args


def alltoall_main(argv: list[str]) -> int:
    from ..bench import alltoall

    args = alltoall_args(argv)
    comm = bench_world("alltoall", 4)
    rows = [row for size in args.sizes for row in alltoall.measure(comm, size, args.iters)]
    if comm.rank == 0:
        doc = {"ranks": comm.size, "rows": rows}
        print(json.dumps(doc, indent=1) if args.json else alltoall.format_table(rows, comm.size), flush=True)
    return 0


# -- bench --calibrate -------------------------------------------------------------------------------


def calibrate_main(argv: list[str]) -> int:
    from ..bench.calibrate import calibrate
    from ..costmodel import hardware

    p = Parser(prog="simpar bench --calibrate")
    p.add_argument("--calibrate", action="store_true")
    p.add_argument("-o", "--out", default=None, help=f"where to save (default {hardware.cache_path()})")
    args = p.parse_args(argv)
    path = args.out or hardware.cache_path()
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise SimparError(f"cannot create {folder}: {exc.strerror}") from None
    print(
        "calibrating (about 5-20 s): GEMM on one thread, numpy.add, MPI and simpar's ring on 2 ranks ...",
        flush=True,
    )
    hw = calibrate()
    atomic_write(path, lambda f: json.dump(hw.to_dict(), f, indent=1))
    print(
        f"  GEMM      fp64 {hw.flops['fp64'] / 1e9:7.1f} GFLOP/s   fp32 {hw.flops['fp32'] / 1e9:7.1f} GFLOP/s"
    )
    print(f"  reduce    {1 / hw.gamma / 1e9:7.1f} GB/s (gamma = {hw.gamma:.3g} s/byte)")
    print(
        f"  MPI       alpha {hw.intra_alpha * 1e6:.2f} us, bandwidth {hw.intra_bw / 1e9:.2f} GB/s "
        f"(beta = {1 / hw.intra_bw:.3g} s/byte)"
    )
    hardware = "local" if args.out is None else path
    print(f"saved to {path}; use it with `python -m simpar plan --hardware {hardware}`")
    return 0
