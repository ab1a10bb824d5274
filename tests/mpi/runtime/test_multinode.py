"""As if every rank were on another node: MPICH's network path instead of shared memory.

MPIR_CVAR_NOLOCAL=1 makes MPICH treat every rank as remote, so messages go through its network
module (TCP here) as they would between machines. The layouts must still equal the serial run and
move exactly the predicted bytes.
"""

from __future__ import annotations

import os

import pytest

from simpar.run.launch import launch


@pytest.fixture()
def network_path(monkeypatch):
    monkeypatch.setenv("MPIR_CVAR_NOLOCAL", "1")  # simpar.run.launch passes the environment on
    yield
    assert os.environ["MPIR_CVAR_NOLOCAL"] == "1"


@pytest.mark.parametrize("layout", [{"dp": 2}, {"pp": 2, "schedule": "1f1b"}])
def test_layouts_over_the_network_path_equal_serial_with_exact_bytes(network_path, layout):
    common = dict(dtype="float64", steps=4, batch=32)
    serial = launch(1, **common)
    run = launch(2, **common, **layout)
    assert max(abs(a - b) / abs(b) for a, b in zip(run["losses"], serial["losses"])) <= 1e-12
    for (W, b), (Ws, bs) in zip(run["weights"], serial["weights"]):
        assert abs(W - Ws).max() <= 1e-12 * abs(Ws).max() and abs(b - bs).max() <= 1e-12 * abs(bs).max()
    assert run["prediction_mismatches"] == []
    assert sum(r["sent"]["model"] + r["sent"]["activation"] for r in run["comm"]["ranks"]) > 0
