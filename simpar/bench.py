"""`python -m simpar bench ...`: micro-benchmarks and hardware calibration.

    python -m simpar bench matmul [ARGS]                         -> simpar.bench_matmul.main(ARGS)
    mpiexec -n 2 python -m mpi4py -m simpar bench allreduce [ARGS] -> simpar.bench_allreduce.main(ARGS)
    python -m simpar bench --calibrate [-o FILE]                 -> measure this machine (< 30 s) and save
                                                                    a hardware profile for `plan --hardware local`
"""
from __future__ import annotations

import argparse
import importlib
import json
import os

from .config import SimparError

USAGE = ("usage: simpar bench matmul [ARGS] | simpar bench allreduce [ARGS] | "
         "simpar bench --calibrate [-o FILE]")


def bench_main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if argv[0] in ("matmul", "allreduce"):
        module_name = f"simpar.bench_{argv[0]}"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                raise SimparError(f"`bench {argv[0]}` is not available in this version ({module_name} is missing)") from None
            raise
        return module.main(argv[1:]) or 0
    if argv[0].startswith("--calibrate"):
        return calibrate_main(argv)
    raise SimparError(f"unknown benchmark {argv[0]!r}; {USAGE}")


def calibrate_main(argv: list[str]) -> int:
    from . import hardware

    class Parser(argparse.ArgumentParser):
        def error(self, message):
            raise SimparError(message)

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
    print("calibrating (about 5-20 s): GEMM on one thread, numpy.add, MPI ping-pong on 2 ranks ...", flush=True)
    hw = hardware.calibrate()
    from .report import atomic_write
    atomic_write(path, lambda f: json.dump(hw.to_dict(), f, indent=1))
    print(f"  GEMM      fp64 {hw.flops['fp64'] / 1e9:7.1f} GFLOP/s   fp32 {hw.flops['fp32'] / 1e9:7.1f} GFLOP/s")
    print(f"  reduce    {1 / hw.gamma / 1e9:7.1f} GB/s (gamma = {hw.gamma:.3g} s/byte)")
    print(f"  MPI       alpha {hw.intra_alpha * 1e6:.2f} us, bandwidth {hw.intra_bw / 1e9:.2f} GB/s "
          f"(beta = {1 / hw.intra_bw:.3g} s/byte)")
    print(f"saved to {path}; use it with `python -m simpar plan --hardware {'local' if args.out is None else path}`")
    return 0
