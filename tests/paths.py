"""Where things are, for tests at any depth of tests/unit/ and tests/mpi/: the repository's root and
the scripts the MPI tests launch. One place, so moving a test file never breaks a path."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository: simpar/, kernels/, tests/, README.md
# the programs MPI tests launch: fault_rank.py, full_disk.py, mutate_executor.py, train_each.py (several
# runs on all ranks), train_layouts.py (several runs, each on the first n ranks: serial and layouts in one
# launch) and option_sweep.py. A folder of their own: a launched script's folder comes first on sys.path,
# and tests/mpi/kernels/ (a package, the mirror of kernels/) would then be imported as `kernels`.
MPI_SCRIPTS = ROOT / "tests" / "mpi" / "scripts"
