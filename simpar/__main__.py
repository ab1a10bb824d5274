"""Entry point: `python -m simpar ...` or, under MPI, `mpiexec -n 4 python -m mpi4py -m simpar ...`.

One compute thread per rank, set BEFORE numpy or numba are imported: several ranks share the
cores, and each BLAS/Numba library spawning a thread per core oversubscribes the machine (measured
here: 2 threads per rank on 2 cores with 4 ranks makes a step about 5x slower).
"""

import os

from .units import THREAD_VARS  # pure Python: loads no NumPy

for _var in THREAD_VARS:
    os.environ[_var] = "1"

from .cli import main  # noqa: E402  (must follow the thread caps)


def entry() -> None:
    """The `simpar` console script: importing this module set the thread caps first."""
    raise SystemExit(main())


if __name__ == "__main__":
    entry()
