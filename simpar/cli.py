"""Command line: tour (default) | train | plan | bench | plot.

    mpiexec -n 4 python -m mpi4py -m simpar                       # the tour
    mpiexec -n 4 python -m mpi4py -m simpar train --dp 2 --tp 2 --metrics-out run.json
    python -m simpar plan --layers 784,4096,4096,10 --batch 1024 --dp 8 --tp 4 --pp 2
    python -m simpar bench matmul ;  mpiexec -n 2 python -m mpi4py -m simpar bench allreduce
    python -m simpar plot run1.json run2.json -o compare.png

Bad input becomes ONE line `simpar: error: ...` on stderr (from rank 0 only) and exit status 2 on
every rank. Errors are found collectively (every rank validates the same inputs; a non-finite loss
is seen by all ranks through the reduced loss), so all ranks leave together and MPI shuts down
cleanly -- no hang, no traceback per rank.
"""
from __future__ import annotations

import argparse
import os
import sys

from .config import (ACTIVATIONS, COLLECTIVES, DATA_SOURCES, DATASETS, DTYPES, KERNELS, OPTIMIZERS,
                     SCHEDULES, RunConfig, SimparError)

SUBCOMMANDS = ("tour", "train", "plan", "bench", "plot")
DEFAULT_LAYERS = {"digits": [64, 128, 128, 128, 10], "mnist": [784, 256, 256, 10]}  # synthetic: say --layers


def int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage + exiting on every rank."""

    def error(self, message):
        raise SimparError(message)


def add_run_arguments(p: argparse.ArgumentParser, tour: bool = False) -> None:
    d = RunConfig()
    g = p.add_argument_group("model")
    g.add_argument("--layers", type=int_list, default=None, help="widths, input first (default 64,128,128,128,10 for digits, 784,256,256,10 for mnist)")
    g.add_argument("--activation", default=d.activation, choices=ACTIVATIONS)
    g.add_argument("--dtype", default=d.dtype, choices=DTYPES)
    g.add_argument("--seed", type=int, default=d.seed)
    g = p.add_argument_group("data")
    g.add_argument("--dataset", default=d.dataset, choices=DATASETS)
    g.add_argument("--samples", type=int, default=d.samples, help="synthetic: number of samples")
    g.add_argument("--data-dir", default=None, help="mnist: folder with the four IDX files")
    g.add_argument("--data-source", default=d.data_source, choices=DATA_SOURCES,
                   help="local: each rank reads its own rows (no traffic); root: rank 0 scatters every batch (data traffic)")
    g = p.add_argument_group("optimisation")
    g.add_argument("--batch", type=int, default=d.batch, help="global batch size")
    g.add_argument("--steps", type=int, default=None)
    g.add_argument("--epochs", type=int, default=None)
    g.add_argument("--lr", type=float, default=d.lr)
    g.add_argument("--momentum", type=float, default=d.momentum)
    g.add_argument("--optimizer", default=d.optimizer, choices=OPTIMIZERS)
    g.add_argument("--grad-accum", type=int, default=d.grad_accum, help="micro-steps per optimizer step")
    g = p.add_argument_group("layout")
    if not tour:
        g.add_argument("--dp", type=int, default=None, help="data-parallel ranks (default: world / (tp*pp))")
        g.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks")
        g.add_argument("--pp", type=int, default=1, help="pipeline stages")
        g.add_argument("--zero", type=int, default=0, help="ZeRO stage 0-3 (with data parallelism)")
        g.add_argument("--stage-layers", type=int_list, default=None, help="layers per pipeline stage, e.g. 2,1,1")
    g.add_argument("--schedule", default=d.schedule, choices=SCHEDULES, help="pipeline schedule")
    g.add_argument("--microbatches", type=int, default=d.microbatches)
    g.add_argument("--bucket-mb", type=float, default=d.bucket_mb, help="gradient bucket size in MiB")
    g.add_argument("--no-overlap", action="store_true", help="all-reduce gradients only after backward")
    g.add_argument("--collectives", default=d.collectives, choices=COLLECTIVES, help="all-reduce algorithm")
    g.add_argument("--kernels", default=d.kernels, choices=KERNELS, help="compute kernels")
    g = p.add_argument_group("output")
    g.add_argument("--metrics-out", default=None, help="write the metrics JSON here (rank 0)")
    g.add_argument("--weights-out", default=None, help="write the final full-shape weights (.npz, rank 0)")
    g.add_argument("--trace", default=None, help="write a Chrome trace JSON (open in Perfetto)")
    g.add_argument("--quiet", action="store_true")


def config_from_args(args: argparse.Namespace) -> RunConfig:
    layers = args.layers
    if layers is None:
        layers = DEFAULT_LAYERS.get(args.dataset)
    cfg = RunConfig(
        layers=layers or [], activation=args.activation, dtype=args.dtype, seed=args.seed,
        dataset=args.dataset, samples=args.samples, data_dir=args.data_dir, data_source=args.data_source,
        batch=args.batch, steps=args.steps, epochs=args.epochs, lr=args.lr, momentum=args.momentum,
        optimizer=args.optimizer, grad_accum=args.grad_accum,
        dp=getattr(args, "dp", None), tp=getattr(args, "tp", 1), pp=getattr(args, "pp", 1),
        zero=getattr(args, "zero", 0), stage_layers=getattr(args, "stage_layers", None),
        schedule=args.schedule, microbatches=args.microbatches, bucket_mb=args.bucket_mb,
        overlap=not args.no_overlap, collectives=args.collectives, kernels=args.kernels,
        metrics_out=args.metrics_out, weights_out=args.weights_out, trace=args.trace, quiet=args.quiet)
    if not cfg.layers:
        raise SimparError(f"--dataset {args.dataset} needs --layers (input width first, number of classes last)")
    return cfg


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="simpar", description="Distributed training, for real and small, every byte counted.")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    tour = sub.add_parser("tour", help="every layout that fits the world size, checked against serial (default)")
    add_run_arguments(tour, tour=True)
    tour.set_defaults(dtype="float64")   # so "same model as serial" can be checked to 1e-10
    tour.add_argument("--quick", action="store_true", help="fewer steps (for CI)")
    tour.add_argument("--out", default="simpar-out", help="folder for the metrics and plots")
    train = sub.add_parser("train", help="train one layout")
    add_run_arguments(train)
    for name in ("plan", "bench", "plot"):
        p = sub.add_parser(name, add_help=False, help=f"see `simpar {name} --help`")
        p.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def _finish_error(message: str) -> int:
    """Print the one line (rank 0 only), shut MPI down cleanly, exit 2 without an MPI abort."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        rank = mpi.COMM_WORLD.Get_rank()
    else:  # failed before MPI started (e.g. a bad option): the launcher tells us who we are
        rank = next((int(os.environ[v]) for v in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
                     if v in os.environ), 0)
    if rank == 0:
        print(f"simpar: error: {message}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        # Every rank is here together (errors are collective), so a clean Finalize cannot hang.
        # Finalizing first matters: MPICH's mpiexec kills the other ranks (and prints a banner) when
        # one leaves non-zero while they are still inside MPI; `python -m mpi4py` then sees MPI
        # finalised and lets the exit status through instead of calling MPI_Abort.
        mpi.Finalize()
    return 2


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and not argv[0].startswith("-") and argv[0] not in SUBCOMMANDS:
            raise SimparError(f"unknown command {argv[0]!r} (choose from {', '.join(SUBCOMMANDS)})")
        if not argv or argv[0] not in SUBCOMMANDS + ("-h", "--help"):
            argv = ["tour", *argv]        # no command: the tour, with whatever options were given
        if argv[0] in ("plan", "bench", "plot"):
            return _dispatch(argv[0], argv[1:])
        args = build_parser().parse_args(argv)
        if args.command == "train":
            from .train import train_main
            return train_main(config_from_args(args))
        from .tour import tour_main
        return tour_main(config_from_args(args), quick=args.quick, out_dir=args.out)
    except SimparError as exc:
        return _finish_error(str(exc))
    except BrokenPipeError:         # `simpar plan ... | head`: the reader left; nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except SystemExit as exc:  # --help
        if exc.code in (0, None):
            return 0
        raise


def _dispatch(command: str, rest: list[str]) -> int:
    if command == "plan":
        from .costmodel import plan_main
        return plan_main(rest)
    if command == "plot":
        from .report import plot_main
        return plot_main(rest)
    from .bench import bench_main
    return bench_main(rest)
