"""The kernels in child processes: CUDA kernels under the simulator, and training with each backend.

The in-process tests (no MPI job): tests/unit/kernels/test_kernels.py.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.paths import ROOT

CUDA_SCRIPT = textwrap.dedent("""
    import json, os, time
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"          # before numba is imported
    import numpy as np
    import kernels
    from kernels import cuda as kc
    t0 = time.time()
    rng = np.random.default_rng(0)
    N = kernels.NumpyKernels
    def ok(got, ref, tol):
        assert got.dtype == ref.dtype and got.shape == ref.shape
        np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)
    def layer(m, k, n, dtype, acts, bias, need_dx, tol):
        x = rng.standard_normal((m, k)).astype(dtype); W = rng.standard_normal((k, n)).astype(dtype)
        b = rng.standard_normal(n).astype(dtype) if bias else None
        for act in acts:
            z, y = kc.CudaKernels.linear_act_forward(x, W, b, act)
            z0, y0 = N.linear_act_forward(x, W, b, act)
            ok(z, z0, tol); ok(y, y0, tol)
            dy = rng.standard_normal((m, n)).astype(dtype)
            got = kc.CudaKernels.linear_act_backward(dy, x, W, z0, y0, act, need_dx)
            ref = N.linear_act_backward(dy, x, W, z0, y0, act, need_dx)
            for g, r in zip(got, ref):
                assert (g is None) == (r is None)
                if g is not None:
                    ok(g, r, tol)
    layer(5, 17, 3, np.float64, ["none", "relu", "tanh", "gelu"], True, True, 1e-12)   # K crosses a tile
    layer(20, 6, 18, np.float64, ["relu"], False, False, 1e-12)                          # 2 x 2 blocks
    layer(3, 4, 40, np.float32, ["gelu"], True, True, 1e-5)                             # N > TILE > M
    a = rng.standard_normal((32, 7)); b = rng.standard_normal((32, 7))
    ok(kc.matmul(a, b, trans_b=True), a @ b.T, 1e-12)
    d = rng.standard_normal(300).astype(np.float32); s = rng.standard_normal(300).astype(np.float32)
    e = d + s; kc.CudaKernels.reduce_add(d, s); ok(d, e, 0)
    assert kernels.load("cuda").name == "cuda"
    print(json.dumps({"ok": True, "seconds": time.time() - t0}))
""")


def test_cuda_kernels_under_the_simulator():
    env = dict(
        os.environ,
        NUMBA_ENABLE_CUDASIM="1",
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    proc = subprocess.run(
        [sys.executable, "-c", CUDA_SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["ok"]


@pytest.mark.parametrize("backend,env", [("numba", {}), ("cuda", {"NUMBA_ENABLE_CUDASIM": "1"})])
def test_end_to_end_training_with_each_backend_matches_numpy(tmp_path, backend, env):
    """A tiny float64 run (2 data-parallel ranks, so the reduce-add kernel runs inside the ring)
    trains the same model with every backend: every step's loss equals the default (NumPy) run's to 1e-12."""
    import json
    import subprocess
    import sys

    from simpar.run.launch import _env, mpiexec_path

    args = [
        "train",
        "--layers",
        "64,16,16,10",
        "--batch",
        "16",
        "--steps",
        "3",
        "--dtype",
        "float64",
        "--quiet",
    ]
    runs = {}
    # the reference as `auto` (the default), which runs NumPy's kernels even on these tiny layers (8 rows
    # x 64 x 16 = 16,384 multiply-adds a call, where it once chose Numba's: kernels.AUTO)
    for name, extra_env in (("auto", {}), (backend, env)):
        out = tmp_path / f"{name}.json"
        cmd = [
            mpiexec_path(),
            "-n",
            "2",
            sys.executable,
            "-m",
            "mpi4py",
            "-m",
            "simpar",
            *args,
            "--kernels",
            name,
            "--metrics-out",
            str(out),
        ]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env={**_env(), **extra_env})
        assert res.returncode == 0, res.stderr[-2000:]
        runs[name] = json.loads(out.read_text())
    assert runs["auto"]["kernels"] == "numpy" and runs[backend]["kernels"] == backend
    np.testing.assert_allclose(runs[backend]["losses"], runs["auto"]["losses"], rtol=1e-12)
