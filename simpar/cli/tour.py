"""`simpar tour` (the default command): every layout that fits the world size, checked against serial.

mpiexec -n 4 python -m mpi4py -m simpar            # or: ... -m simpar tour --quick
"""

from __future__ import annotations

import argparse

from .train import add_run_arguments, config_from_args


def add_tour_arguments(tour: argparse.ArgumentParser) -> None:
    add_run_arguments(tour, tour=True)
    tour.set_defaults(dtype="float64")  # so "same model as serial" can be checked to 1e-10
    tour.add_argument("--quick", action="store_true", help="fewer steps (for CI)")
    tour.add_argument("--out", default="simpar-out", help="folder for the metrics and plots")


def tour_command(args: argparse.Namespace) -> int:
    from ..tour import tour_main

    return tour_main(config_from_args(args), quick=args.quick, out_dir=args.out)
