"""benchmarks/gpu_kernels.py without a GPU: the no-GPU message, and the cuBLAS peer's bookkeeping.

No GPU and no CUDA CuPy exist where these tests run, so the peer's real calls cannot run here. A tiny
fake stands in for `cupy` to test only what does not depend on CuPy's behaviour: which calls the
peer makes and how its timings turn into GFLOP/s, ratios, printed lines and JSON. The expected
figures are written from the formulas (GFLOP/s = 2 n^3 / time; ratio = peer time / simpar time).
"""

import importlib.util
import json
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from tests.paths import ROOT

SCRIPT = ROOT / "benchmarks" / "gpu_kernels.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("gpu_kernels_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FakeEvent:
    def record(self):
        pass

    def synchronize(self):
        pass


def fake_cupy(elapsed_ms, ptr_offset=0):
    """Just enough of cupy for CublasPeer: records every launch; events report `elapsed_ms` in turn."""
    calls = []
    elapsed = iter(elapsed_ms)

    def asarray(device_array):
        info = device_array.__cuda_array_interface__
        ptr = info["data"][0] + ptr_offset
        return SimpleNamespace(
            data=SimpleNamespace(ptr=ptr), shape=info["shape"], dtype=np.dtype(info["typestr"])
        )

    def elementwise(in_params, out_params, operation, name):
        calls.append(("compile", in_params, out_params, operation))
        return lambda *args: calls.append(("bias_gelu", *args))

    cp = SimpleNamespace(
        __version__="0.0-fake",
        ElementwiseKernel=elementwise,
        asarray=asarray,
        empty=lambda shape, dtype: SimpleNamespace(shape=shape, dtype=dtype),
        matmul=lambda a, b, out: calls.append(("matmul", a, b, out)),
        asnumpy=lambda a: np.zeros(a.shape),
        cuda=SimpleNamespace(Event=FakeEvent, get_elapsed_time=lambda start, end: next(elapsed)),
    )
    return cp, calls


def device_array(ptr, shape):
    return SimpleNamespace(__cuda_array_interface__={"data": (ptr, False), "shape": shape, "typestr": "<f4"})


def test_peer_figures_ratios_lines_and_json_with_a_fake_cupy(bench, monkeypatch):
    monkeypatch.delenv("CUPY_TF32", raising=False)
    # repeat = 3: the matmul's three timed calls take 2, 1, 3 ms (median 2); the layer's 5, 4, 6 (median 5)
    cp, calls = fake_cupy([2.0, 1.0, 3.0, 5.0, 4.0, 6.0])
    peer = bench.CublasPeer(cp)
    assert peer.label == "CuPy 0.0-fake, cuBLAS FP32"
    A, B, bias = device_array(1000, (8, 8)), device_array(2000, (8, 8)), device_array(3000, (8,))
    ms, (z, y) = peer.measure(A, B, bias, repeat=3)
    assert ms == {"matmul": 2.0, "layer": 5.0}
    assert z.shape == y.shape == (8, 8)
    kinds = [c[0] for c in calls]
    # one compile; matmul alone 1 warm-up + 3 timed; then (matmul, bias_gelu) 1 + 3 times
    assert kinds == ["compile"] + ["matmul"] * 4 + ["matmul", "bias_gelu"] * 4
    compile_ = calls[0]
    assert compile_[1:3] == ("T z, T b", "T zb, T y") and "tanh" in compile_[3]
    matmuls = [c for c in calls if c[0] == "matmul"]
    assert [(a.data.ptr, b.data.ptr) for _, a, b, _ in matmuls] == [(1000, 2000)] * 8  # simpar's arrays
    z_buf = matmuls[0][3]
    bias_gelu = [c for c in calls if c[0] == "bias_gelu"]
    assert all(c[1] is z_buf and c[2].data.ptr == 3000 for c in bias_gelu)  # reads the product z and b

    # n = 1000: 2 n^3 = 2 GFLOP. simpar: matmul 4 ms, fused 5 ms, unfused 10 ms.
    row = bench.speed_row(1000, {"matmul": 4.0, "fused": 5.0, "unfused": 10.0}, ms)
    expect = {
        "matmul_gflops": 2 / 4e-3,
        "fused_gflops": 2 / 5e-3,
        "unfused_gflops": 2 / 10e-3,
        "cublas_matmul_gflops": 2 / 2e-3,
        "cublas_layer_gflops": 2 / 5e-3,
        "matmul_over_cublas": 2.0 / 4.0,
        "fused_over_cublas": 5.0 / 5.0,
        "unfused_over_cublas": 5.0 / 10.0,
    }
    for key, value in expect.items():
        assert row[key] == pytest.approx(value, rel=1e-12), key
    lines = bench.speed_lines(row)
    assert len(lines) == 3
    assert "tiled matmul" in lines[0] and "500.0 GFLOP/s" in lines[0] and "1000.0 GFLOP/s" in lines[0]
    assert lines[0].endswith("simpar/cuBLAS 0.500")
    assert lines[1].endswith("simpar/cuBLAS 1.000") and lines[2].endswith("simpar/cuBLAS 0.500")

    # without the peer: simpar's figures stay, the peer's fields are null in the JSON, no ratio printed
    bare = bench.speed_row(1000, {"matmul": 4.0, "fused": 5.0, "unfused": 10.0})
    assert bare["matmul_gflops"] == row["matmul_gflops"]
    loaded = json.loads(json.dumps(bare))
    assert all(loaded[key] is None for key in expect if "cublas" in key)
    assert all("cuBLAS" not in line for line in bench.speed_lines(bare))


def test_peer_refuses_a_copy_and_reports_tf32_and_a_missing_cupy(bench, monkeypatch):
    cp, _ = fake_cupy([], ptr_offset=64)  # asarray hands back other memory: a copy, not a view
    with pytest.raises(AssertionError, match="CuPy copied"):
        bench.CublasPeer(cp).view(device_array(1000, (2, 2)))
    monkeypatch.setenv("CUPY_TF32", "1")
    assert bench.CublasPeer(cp).label.endswith("cuBLAS TF32")
    monkeypatch.setitem(sys.modules, "cupy", None)  # `import cupy` raises ImportError
    assert bench.load_cupy() == (None, "cuBLAS peer: CuPy not installed (pip install cupy-cuda12x)")
