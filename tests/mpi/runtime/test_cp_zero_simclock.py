"""--cp with --zero on the simulated clock: predict == simulate (costmodel/cp_zero_time.py, which writes
the step again -- cp's ring hops overlapping their blocks, ZeRO's blocking rings over dp x cp, every
rank followed through every ring round and every cp hop -- never calling the code that runs it).

dp2 x cp2 with ZeRO-1 on `local` (the ring's blocks outlast their transfers); the others with chunks
that p = dp cp does not divide, so ZeRO's rings end a few elements' time apart and a cp hop waits on
a late neighbour (cp_hop_time.py): h = 10 on dp2 x cp2 (blocks of 1330 parameters: chunks 333, 333,
332, 332), Ulysses under ZeRO-2 with --grad-accum 2 on `local`, the ring under ZeRO-3 on nodes of
two devices (dp x cp's rings leave the node); cp3 with ZeRO-3 (p = 3 divides no block) and
--grad-accum 2. Agreement to 1e-9: pricing each block's attention as if the cp ranks reached it
together is off by 4e-7 (zero3-nodes) and 5e-6 (cp3-uneven).
"""

from __future__ import annotations

import json

import pytest

from simpar.run.launch import run
from tests.mpi.runtime.test_simclock import TWO_PER_NODE

SHAPE = ["--arch", "gpt", "--n-layers", "2", "--hidden", "16", "--heads", "4", "--vocab", "16"]
SHAPE += ["--dataset", "copy", "--samples", "32", "--batch", "8", "--steps", "2", "--dtype", "float64"]

H10 = ["--hidden", "10", "--heads", "2"]  # units of 320, 1330 and 180 parameters (model/gpt.py)
ZERO2_ACCUM = ["--zero", "2", "--grad-accum", "2"]
CASES = [  # (ranks, layout, hardware)
    (4, ["--seq-len", "32", "--dp", "2", "--cp", "2", "--zero", "1"], "local"),
    (4, [*H10, "--seq-len", "16", "--dp", "2", "--cp", "2", "--cp-algo", "ulysses", *ZERO2_ACCUM], "local"),
    (4, [*H10, "--seq-len", "16", "--dp", "2", "--cp", "2", "--zero", "3"], "two-per-node"),
    (3, ["--seq-len", "12", "--cp", "3", "--zero", "3", "--grad-accum", "2"], "local"),
]


@pytest.mark.parametrize(
    "ranks,layout,hardware", CASES, ids=["zero1", "zero2-ulysses-accum", "zero3-nodes", "cp3-uneven"]
)
def test_predict_equals_simulate(tmp_path, ranks, layout, hardware):
    hw, path = hardware, tmp_path / "m.json"
    if hardware == "two-per-node":
        hw = str(tmp_path / "hw.json")
        (tmp_path / "hw.json").write_text(json.dumps(TWO_PER_NODE))
    args = [
        "train",
        *SHAPE,
        *layout,
        "--clock",
        "sim",
        "--hardware",
        hw,
        "--quiet",
        "--metrics-out",
        str(path),
    ]
    res = run(ranks, args, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    m = json.loads(path.read_text())
    assert m["predicted"]["time"]["step_s"] == pytest.approx(m["time"]["sim"]["step_s"], rel=1e-9)
    assert m["prediction_mismatches"] == []
