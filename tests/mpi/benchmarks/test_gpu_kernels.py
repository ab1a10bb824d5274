"""benchmarks/gpu_kernels.py run as a user runs it, without a GPU: one line, exit 2.

The in-process tests (no MPI job): tests/unit/benchmarks/test_gpu_kernels.py.
"""

import os
import subprocess
import sys

from tests.paths import ROOT
from tests.unit.benchmarks.test_gpu_kernels import SCRIPT


def test_without_a_gpu_it_says_so_in_one_line_and_exits_2():
    """NUMBA_DISABLE_CUDA=1 makes numba's driver fail the same way on any machine, GPU or not."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env.update(NUMBA_DISABLE_CUDA="1", PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(
        "gpu_kernels: no CUDA GPU here (numba: CUDA is disabled due to setting NUMBA_DISABLE"
    )
    assert lines[0].endswith("); run with --sim for the simulator")
