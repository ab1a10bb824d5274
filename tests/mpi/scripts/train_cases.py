"""Run under mpiexec by MPI tests: several `simpar train` runs in ONE launch, one after another on the
same ranks (the interpreter, NumPy and mpi4py start once: what a launch costs on CI's 2 cores).

    python -m mpi4py train_cases.py CASES_JSON

CASES_JSON: a file holding [[name, [train options...]], ...]; each case writes metrics to DIR/name.json
and its final weights to DIR/name.npz, DIR being the file's folder. Exits 1 at the first case whose
`simpar train` fails (every rank fails alike: the options are the same on all of them).
"""

import json
import os
import sys
from pathlib import Path

from simpar.units import THREAD_VARS

for var in THREAD_VARS:  # one compute thread a rank, before NumPy loads (simpar/__main__.py's reason)
    os.environ[var] = "1"

from simpar.cli import main  # noqa: E402

cases_file = Path(sys.argv[1])
for name, args in json.loads(cases_file.read_text()):
    out = cases_file.parent / name
    code = main(["train", *args, "--quiet", "--metrics-out", f"{out}.json", "--weights-out", f"{out}.npz"])
    if code:
        sys.exit(1)
