"""`simpar tour` (the default command): every layout that fits the world size, checked against serial.

mpiexec -n 4 python -m mpi4py -m simpar            # or: ... -m simpar tour --quick
mpiexec -n 4 python -m mpi4py -m simpar tour --experts 4 --top-k 2     # serial, dp4, dp4xep2, dp4xep4
"""

from __future__ import annotations

import argparse

from .train import add_run_arguments, config_from_args


def add_tour_arguments(tour: argparse.ArgumentParser) -> None:
    add_run_arguments(tour, tour=True)
    tour.set_defaults(dtype="float64")  # so "same model as serial" can be checked to 1e-10
    tour.add_argument("--quick", action="store_true", help="fewer steps (for CI)")
    tour.add_argument("--out", default="simpar-out", help="folder for the metrics and plots")
    tour.add_argument(
        "--no-plots", action="store_true", help="write the metrics only (the plots take seconds to draw)"
    )


# Under --clock sim the tour trains a model on which parallelism can pay off on a cluster: on an
# H100 node the digits MLP's step is a microsecond of compute against 3 us per message, so every
# layout loses. Data parallelism pays when each rank's share of the batch does more work than the
# gradients cost to move; tensor and pipeline parallelism when the layers are wide enough. This one
# (3.4 M parameters, batch 2048; see the README) still runs for real on a laptop, in about a second
# per step.
CLUSTER_MODEL = dict(
    dataset="synthetic", layers=[256, 1024, 1024, 1024, 1024, 10], batch=2048, samples=8192, lr=0.01
)


def tour_command(args: argparse.Namespace) -> int:
    from ..run.tour import tour_main

    cfg = config_from_args(args)
    if cfg.mixed:  # the tour's float64 default is for fp32 runs; mixed precision's master is float32
        cfg.dtype = "float32"
    if cfg.clock == "sim" and args.layers is None and args.dataset == "digits":
        for key, value in CLUSTER_MODEL.items():
            setattr(cfg, key, value)
        if cfg.steps is None and cfg.epochs is None:
            cfg.steps = 2 if args.quick else 3
    return tour_main(cfg, quick=args.quick, out_dir=args.out, plots=not args.no_plots)
