"""`simpar ARGS` with a disk that fills up while rank 0 writes its outputs (tests/mpi/test_errors.py).

Without root there is no tiny tmpfs to fill, so the file-size limit (RLIMIT_FSIZE) is lowered just
before simpar writes an output file: the write then fails for real, in the kernel (EFBIG, handled
on the same path as ENOSPC). Lowered only then, because MPI's shared-memory setup writes files too.
"""

import resource
import sys

import simpar.__main__  # noqa: F401  (the thread caps, before NumPy loads)
from simpar import files
from simpar.cli import main

LIMIT = 1024  # bytes: smaller than any metrics JSON
_original = files.atomic_write


def _atomic_write_on_a_full_disk(path, write_fn, binary=False):
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    return _original(path, write_fn, binary)


files.atomic_write = _atomic_write_on_a_full_disk
sys.exit(main(sys.argv[1:]))
