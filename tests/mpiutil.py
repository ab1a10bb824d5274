"""Launch real MPI jobs from tests: `mpiexec -n K python -m mpi4py -m simpar ...` in a subprocess.

`python -m mpi4py` turns an uncaught exception on any rank into MPI_Abort, so a broken rank ends
the job instead of hanging it; the timeout is the last line of defence. The launching itself is
simpar.run.launch's (the same code the notebooks use).
"""

from __future__ import annotations

import subprocess
import sys

from simpar.run.launch import _env as env
from simpar.run.launch import mpiexec_path as mpiexec
from simpar.run.launch import run as _run
from tests.paths import ROOT  # noqa: F401  (kept for callers of tests.mpiutil.ROOT)


def run_mpi(n: int, args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m mpi4py -m simpar ARGS` on n ranks (n=0: plain python, no mpiexec)."""
    return _run(n, list(args), timeout=timeout)


def run_script(n: int, script, args=(), timeout: float = 120) -> subprocess.CompletedProcess:
    """Run a Python file on n ranks under `python -m mpi4py`."""
    cmd = [mpiexec(), "-n", str(n), sys.executable, "-m", "mpi4py", str(script), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env())
