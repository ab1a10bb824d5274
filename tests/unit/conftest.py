"""The unit tier's rule, enforced: a test here runs in this process only -- no mpiexec, no child
Python, no `python -m simpar` in a subprocess. A test that needs one belongs in tests/mpi/.

Libraries probing their environment may still run their helper tools (Numba's `ldconfig -p` when it
looks for CUDA, matplotlib's `fc-list` when it builds its font cache): those are not jobs.
"""

from __future__ import annotations

import os
import subprocess

import pytest

PROBES = ("ldconfig", "fc-list")


def _refuse(what) -> None:
    raise AssertionError(
        f"the unit tier runs in-process; this test started {what!r:.160}: move it to tests/mpi/"
    )


class _InProcessOnly(subprocess.Popen):
    def __init__(self, args, *rest, **kwargs):
        program = args.split()[0] if isinstance(args, str) else str(args[0])
        if not program.endswith(PROBES):
            _refuse(args)
        super().__init__(args, *rest, **kwargs)


@pytest.fixture(autouse=True)
def _in_process_only(monkeypatch):
    monkeypatch.setattr(subprocess, "Popen", _InProcessOnly)
    monkeypatch.setattr(os, "system", _refuse)
