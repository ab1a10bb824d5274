"""Launch real MPI jobs from Python (a notebook, a script) and get their metrics back.

    from .launch import launch
    m = launch(4, dp=2, tp=2, steps=20, dtype="float64")        # mpiexec -n 4 ... simpar train
    m["comm"]["per_step"]["activation"], m["losses"][-1], m["weights"][0][0].shape

`launch` runs `mpiexec -n N python -m mpi4py -m simpar train ...` with the SAME interpreter (so a
notebook's virtual environment is used), one compute thread per rank, and returns the metrics
dict with the final full-shape weights under "weights". Keyword arguments become options:
dp=2 -> --dp 2, no_overlap=True -> --no-overlap, layers=[64, 32, 10] -> --layers 64,32,10.
A failed run raises LaunchError carrying the `simpar: error: ...` line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ..units import one_thread_env


class LaunchError(RuntimeError):
    pass


def mpiexec_path() -> str:
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else (shutil.which("mpiexec") or "mpiexec")


def _env() -> dict:
    env = one_thread_env(dict(os.environ))
    root = str(Path(__file__).resolve().parents[2])  # so an un-installed checkout works too
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return env


def options(**kwargs) -> list[str]:
    """Keyword arguments -> command-line options (True -> a bare flag, False/None -> left out)."""
    out = []
    for key, value in kwargs.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, (list, tuple)):
            out += [flag, ",".join(str(v) for v in value)]
        else:
            out += [flag, str(value)]
    return out


def run(n: int, args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    """`mpiexec -n n python -m mpi4py -m simpar ARGS` (n=0: plain python, no mpiexec)."""
    cmd = [sys.executable, "-m", "mpi4py", "-m", "simpar", *args]
    if n:
        cmd = [mpiexec_path(), "-n", str(n), *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env())


def launch(n: int, timeout: float = 300, trace: bool = False, **kwargs) -> dict:
    """Train on n ranks; return the metrics (plus "weights", and "trace" events if trace=True)."""
    import numpy as np

    with tempfile.TemporaryDirectory(prefix="simpar-") as tmp:
        metrics, weights, trace_file = (os.path.join(tmp, f) for f in ("m.json", "w.npz", "t.json"))
        extra = ["--trace", trace_file] if trace else []
        res = run(
            n,
            [
                "train",
                *options(**kwargs),
                "--quiet",
                "--metrics-out",
                metrics,
                "--weights-out",
                weights,
                *extra,
            ],
            timeout=timeout,
        )
        if res.returncode != 0:
            lines = [line for line in res.stderr.splitlines() if line.strip()]
            raise LaunchError(
                next(
                    (line for line in lines if line.startswith("simpar: error")),
                    "\n".join(lines[-15:]) or f"exit status {res.returncode}",
                )
            )
        with open(metrics) as f:
            out = json.load(f)
        with np.load(weights) as z:
            out["weights"] = [(z[f"W{i}"], z[f"b{i}"]) for i in range(len(z.files) // 2)]
        if trace:
            with open(trace_file) as f:
                out["trace"] = json.load(f)["traceEvents"]
        return out
