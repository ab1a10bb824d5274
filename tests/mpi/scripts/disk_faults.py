"""`simpar ARGS` with a checkpoint disk that misbehaves (tests/mpi/test_hostile.py,
 tests/mpi/test_fault_contract.py).

SIMPAR_DISK_FAULT picks how, each time rank 0 writes a checkpoint:
  slow        the write takes 2.5 s longer (a slow network disk): not a hang
  full@STEP   from the checkpoint of step STEP on, the disk is full: the file-size limit
              (RLIMIT_FSIZE) is lowered just before the write, which then fails for real, in the
              kernel (EFBIG, handled on the same path as ENOSPC); see tests/mpi/scripts/full_disk.py
"""

import os
import resource
import sys
import time

import simpar.__main__  # noqa: F401  (the thread caps, before NumPy loads)
from simpar.cli import main
from simpar.run import checkpoint

FAULT = os.environ.get("SIMPAR_DISK_FAULT", "")
_original = checkpoint.save


def _save(root, step, state, info, keep=checkpoint.KEEP):
    if FAULT == "slow":
        time.sleep(2.5)
    elif FAULT.startswith("full@") and step >= int(FAULT[5:]):
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    return _original(root, step, state, info, keep)


checkpoint.save = _save
sys.exit(main(sys.argv[1:]))
