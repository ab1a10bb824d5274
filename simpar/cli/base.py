"""What every subcommand shares: the argument parser that raises instead of exiting, and the one
way a run ends on bad input (`finish_error`: one line `simpar: error: ...`, exit status 2).

Why a parser of our own: argparse prints usage and calls sys.exit on error -- on every rank at
once. Raising SimparError instead lets the command line report it once, from one place.
"""

from __future__ import annotations

import argparse
import os
import sys

from .. import console
from ..config import SimparError


class Parser(argparse.ArgumentParser):
    """argparse that raises SimparError (one line, exit 2) instead of printing usage and exiting,
    and prints --help once (rank 0), not once per rank."""

    def __init__(self, *args, error_prefix: str = "", **kwargs):
        super().__init__(*args, **kwargs)
        self.error_prefix = error_prefix

    def error(self, message):
        raise SimparError(self.error_prefix + message)

    def print_help(self, file=None):
        if launcher_rank() == 0:
            super().print_help(file)


def int_list(text: str) -> list[int]:
    """'64,128,10' -> [64, 128, 10] (an argparse type)."""
    try:  # an empty item (64,,10 or a trailing comma) is a typo, not a layer to drop
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    return values


def launcher_rank() -> int:
    """This process's rank: from MPI once it runs, else from the launcher's environment, else 0."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        return mpi.COMM_WORLD.Get_rank()
    return next(
        (int(os.environ[v]) for v in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK") if v in os.environ), 0
    )


def finish_error(message: str) -> int:
    """Print the one line (rank 0 only), shut MPI down cleanly, exit 2 without an MPI abort."""
    if launcher_rank() == 0:
        console.say(f"simpar: error: {message}")
    sys.stdout.flush()
    sys.stderr.flush()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        # Every rank is here together (errors are collective), so a clean Finalize cannot hang.
        # Finalizing first matters: MPICH's mpiexec kills the other ranks (and prints a banner) when
        # one leaves non-zero while they are still inside MPI; `python -m mpi4py` then sees MPI
        # finalised and lets the exit status through instead of calling MPI_Abort.
        mpi.Finalize()
    return 2
