"""Command line: tour (default) | train | plan | bench | plot | debug | validate. One file per subcommand.

    mpiexec -n 4 python -m mpi4py -m simpar                       # the tour          (tour.py)
    mpiexec -n 4 python -m mpi4py -m simpar train --dp 2 --tp 2 --metrics-out run.json   (train.py)
    python -m simpar plan --layers 784,4096,4096,10 --batch 1024 --dp 8 --tp 4 --pp 2     (plan.py)
    python -m simpar bench matmul ;  mpiexec -n 2 python -m mpi4py -m simpar bench allreduce  (bench.py)
    python -m simpar plot run1.json run2.json -o compare.png                             (plot.py)
    python -m simpar debug simpar-flight/      what the watchdog's flight recorders say  (debug.py)
    python -m simpar validate [--json] [-o PNG] [--data FILE]   the model vs published numbers (validate.py)

Bad input becomes ONE line `simpar: error: ...` on stderr (from rank 0 only) and exit status 2 on
every rank (base.finish_error). Errors are found collectively (agree.py: every rank checks, then
the ranks exchange verdicts; a non-finite or diverging loss is seen by all ranks through the reduced
loss), so all ranks leave together and MPI shuts down cleanly -- no hang, no traceback per rank.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

from .. import console, job
from ..config import SimparError
from ..runtime import flight
from ..runtime.agree import same_command
from .base import Parser, finish_error, launcher_rank
from .tour import add_tour_arguments, tour_command
from .train import add_run_arguments, train_command

SUBCOMMANDS = ("tour", "train", "plan", "bench", "plot", "debug", "validate")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="simpar", description="Distributed training, for real and small, every byte counted."
    )
    sub = parser.add_subparsers(dest="command", parser_class=Parser)
    add_tour_arguments(
        sub.add_parser("tour", help="every layout that fits the world size, checked against serial (default)")
    )
    add_run_arguments(sub.add_parser("train", help="train one layout"))
    for name in ("plan", "bench", "plot", "debug", "validate"):
        p = sub.add_parser(name, add_help=False, help=f"see `simpar {name} --help`")
        p.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    console.safe_streams()
    try:
        same_command(argv)  # first: ranks running different commands would wait for each other forever
        if argv and not argv[0].startswith("-") and argv[0] not in SUBCOMMANDS:
            raise SimparError(f"unknown command {argv[0]!r} (choose from {', '.join(SUBCOMMANDS)})")
        if not argv or argv[0] not in SUBCOMMANDS + ("-h", "--help"):
            argv = ["tour", *argv]  # no command: the tour, with whatever options were given
        if argv[0] == "plan":
            from .plan import plan_main

            return plan_main(argv[1:])
        if argv[0] == "plot":
            from .plot import plot_main

            return plot_main(argv[1:])
        if argv[0] == "bench":
            from .bench import bench_main

            return bench_main(argv[1:])
        if argv[0] == "debug":
            from .debug import debug_main

            return debug_main(argv[1:])
        if argv[0] == "validate":
            from .validate import validate_main

            return validate_main(argv[1:])
        args = build_parser().parse_args(argv)
        return train_command(args) if args.command == "train" else tour_command(args)
    except SimparError as exc:
        return finish_error(str(exc))
    except KeyboardInterrupt:  # Ctrl-C: one line, exit 130, no traceback on any rank
        recorder = flight.last()  # rank 0's bar may be on screen even if another rank says it
        step, bar = (recorder.step + 1, recorder.progress_bar) if recorder else (None, False)
        saved = job.last_checkpoint()
        if job.checkpoint_root():  # the newest on disk: rank 0 may have finished one this rank waits on
            from ..run.checkpoint import complete

            found = complete(job.checkpoint_root())
            if found:
                saved, step = found[-1][1], max(step or 0, found[-1][0] + 1)
        return console.interrupted(step, saved, bar)
    except BrokenPipeError:  # `simpar plan ... | head`: the reader left; nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except SystemExit as exc:  # --help
        if exc.code in (0, None):
            return 0
        raise
    except Exception as exc:  # noqa: BLE001  a bug, or an MPI error, on this rank alone
        # The other ranks cannot join a clean exit (they may be inside a collective), so this rank
        # ends the job: one line, then MPI_Abort. SIMPAR_TRACEBACK=1 shows where it happened.
        if os.environ.get("SIMPAR_TRACEBACK"):
            traceback.print_exc()
        kind = "MPI error" if type(exc).__module__.startswith("mpi4py") else type(exc).__name__
        if kind == "MPI error":  # often a peer that died: let its guardian (job.py) name it first
            time.sleep(0.5)
        message = f"rank {launcher_rank()}: {kind}: {exc} (unexpected; SIMPAR_TRACEBACK=1 shows where)"
        flight.fatal(message if flight.first_to_report() else None)  # every rank may have hit it
