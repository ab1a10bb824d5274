"""Context parallelism inside pipeline stages (--cp 2 --pp 2) on the simulated clock: predict == simulate,
with --recompute full and selective and the zero-bubble schedules' B and W halves too.

The real run charges the clock as it goes: context_attention.py charges each ring hop's blocks between
posting its K/V transfers and waiting for them (Ulysses' all-to-alls block), the pipeline engine its
b n h boundary sends and receives, the gradient buckets their all-reduce over the stage's dp x cp ranks.
costmodel/cp_pipeline_time.py writes the same step in closed form (steptime.py's recurrences over
cp_time.py's hops), never calling that code; both are deterministic, so they agree to rounding.
On a GPU node, on the CPU profile and on nodes of two devices (there the pipeline's link leaves the node).
"""

from __future__ import annotations

import json

import pytest

from simpar.run.launch import run
from tests.mpi.runtime.test_gpt_simclock import hardware_option

SHAPE = ["--arch", "gpt", "--n-layers", "2", "--hidden", "16", "--heads", "4", "--seq-len", "16"]
SHAPE += ["--vocab", "16", "--dataset", "copy", "--samples", "16", "--batch", "4", "--steps", "2"]

CASES = [
    ("dgx-h100", "gpipe", "ring", ["--recompute", "selective"]),  # the ring's forward hops again
    ("dgx-h100", "1f1b", "ulysses", ["--precision", "mixed-bf16", "--recompute", "full"]),
    ("local", "1f1b", "ring", []),
    ("local", "zb-h1", "ulysses", ["--recompute", "selective"]),  # its heads' P rebuilt locally
    ("two-per-node", "zb-h1", "ring", ["--grad-accum", "2", "--microbatches", "2"]),
    ("two-per-node", "interleaved", "ulysses", ["--n-layers", "6", "--virtual-stages", "2"]),
    # two micro-batches: the embedding's backward is all W (in B it missed the bucket hook) -- issue 24
    ("dgx-h100", "zb-v", "ring", ["--recompute", "full", "--precision", "mixed-bf16", "--microbatches", "2"]),
]


@pytest.mark.parametrize("hardware, schedule, algo, extra", CASES)
def test_cp_inside_pipeline_stages_agrees(tmp_path, hardware, schedule, algo, extra):
    path = tmp_path / "m.json"
    args = ["train", *SHAPE, "--cp", "2", "--pp", "2", "--schedule", schedule, "--cp-algo", algo, *extra]
    args += ["--clock", "sim", "--hardware", hardware_option(tmp_path, hardware), "--quiet"]
    res = run(4, [*args, "--metrics-out", str(path)])
    assert res.returncode == 0, res.stderr[-3000:]
    m = json.loads(path.read_text())
    sim, pred = m["time"]["sim"], m["predicted"]["time"]["step_s"]
    assert abs(pred / sim["step_s"] - 1) <= 1e-6, (hardware, schedule, algo, sim["step_s"], pred)
    assert m["prediction_mismatches"] == []
    # the pipeline's sends and (ring) the K/V hops are on the clock: communication was charged
    assert min(r["comm_exposed_s"] + r["comm_overlapped_s"] for r in sim["per_rank"]) > 0, sim["per_rank"]
