"""Several `simpar train` runs, one after another, in ONE mpiexec launch (a launch's start-up costs more
than a tiny run: CI's MPI tier keeps few of them).

    mpiexec -n K python -m mpi4py tests/mpi/scripts/train_each.py TRAIN-ARGS... :: TRAIN-ARGS... [:: ...]

Each "::"-separated list is one run's arguments; a later run may resume a checkpoint an earlier one
wrote. Exits with the first non-zero status, after which nothing else runs.
"""

import sys

from simpar.cli import main

runs, current = [], []
for arg in sys.argv[1:]:
    if arg == "::":
        runs.append(current)
        current = []
    else:
        current.append(arg)
runs.append(current)
for argv in runs:
    rc = main(["train", *argv])
    if rc:
        raise SystemExit(rc)
