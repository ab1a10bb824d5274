"""--arch resmlp under tensor AND pipeline parallelism (--tp 2 --pp 2): each pipeline chunk's units
with their blocks split over the tp group (W1 by columns, W2 by rows, restensor.py), the residual
stream sent whole between stages by every tp rank.

Over MPI on four ranks, three schedules -- 1f1b (grad-accum 2, --recompute full, simulated clock),
gpipe, and zb-v (whose B/W halves split the sharded blocks' backward; --recompute selective,
simulated clock) -- each train the serial model (float64 1e-12, losses and weights), and each rank's
ledger equals the closed forms below; params/grads/optimizer memory and activation peaks are the cost
model's, and its step time is the simulated clock's.

Per step, on the rank with tp index k of stage s, for every micro-batch of b rows (d = the residual
width, N = b*d, ring all-reduce over t = 2 ranks sends 2N - c_k - c_(k+1) elements, c = the
np.array_split sizes of N):
  each block of its chunks   g: one all-reduce of N forward ("tp-g-allreduce"; twice under
                             --recompute full, which re-runs the forward), f: one backward
                             ("tp-f-allreduce")
  each chunk boundary        b*d elements forward ("pp-send-act") to the next chunk's stage, b*d
                             back ("pp-send-grad"), unless both chunks are on this stage (zb-v's turn)
A pure tp x pp layout sends no "model" bytes: each rank updates its own shards.
"""

from __future__ import annotations

import pytest

from tests.conftest import assert_same_model, split_sizes, train_json
from tests.mpi.parallel.pipeline.test_resmlp_pipeline import BATCH, F64, STEPS
from tests.mpi.parallel.test_tensor_parallel import ring_allreduce_sent
from tests.unit.parallel.pipeline.test_resmlp_pipeline import LAYERS, unit_split

T, S, D, BPE = 2, 2, LAYERS[1], 8
SIM = ["--clock", "sim", "--hardware", "dgx-h100"]


def local_unit_params(i: int) -> int:
    """Parameters of unit i on one tp rank: a projection whole; a block's gamma, beta, b2 whole
    (3d), W1's d/t columns and W2's d/t rows (2 d d/t), b1's d/t columns."""
    if 0 < i < len(LAYERS) - 2:
        return 3 * D + 2 * D * (D // T) + D // T
    return LAYERS[i] * LAYERS[i + 1] + LAYERS[i + 1]


def stage_of(chunk: int, schedule: str) -> int:
    """Chunk c runs on stage c; zb-v's 2S chunks go down the stages and back up (a V)."""
    return chunk if schedule != "zb-v" or chunk < S else 2 * S - 1 - chunk


def micro_batch_rows(accum: int, M: int) -> list[int]:
    """Rows of every micro-batch of one step: each accumulation step's rows, np.array_split M ways."""
    return [b for k_rows in split_sizes(BATCH, accum) for b in split_sizes(k_rows, M)]


def check_ledger_and_memory(m: dict, schedule: str, M: int, accum: int, recompute: str) -> None:
    C = 2 * S if schedule == "zb-v" else S
    bounds = unit_split(LAYERS, C)
    g_times = 2 if recompute == "full" else 1
    for r in m["comm"]["ranks"]:
        s, k, ops = r["coords"]["pp"], r["coords"]["tp"], r["by_op"]
        got = lambda op: ops.get(op, {"sent": 0})["sent"]
        chunks = [c for c in range(C) if stage_of(c, schedule) == s]
        blocks = sum(1 for c in chunks for i in range(*bounds[c]) if 0 < i < len(LAYERS) - 2)
        g = f = act = grad = 0
        for b in micro_batch_rows(accum, M):
            g += blocks * g_times * ring_allreduce_sent(b * D, T, k)
            f += blocks * ring_allreduce_sent(b * D, T, k)
            act += sum(b * D for c in chunks if c < C - 1 and stage_of(c + 1, schedule) != s)
            grad += sum(b * D for c in chunks if c > 0 and stage_of(c - 1, schedule) != s)
        assert got("activation/tp-g-allreduce") == STEPS * g * BPE, (r["rank"], schedule)
        assert got("activation/tp-f-allreduce") == STEPS * f * BPE, (r["rank"], schedule)
        assert got("activation/pp-send-act") == STEPS * act * BPE, (r["rank"], schedule)
        assert got("activation/pp-send-grad") == STEPS * grad * BPE, (r["rank"], schedule)
        assert r["sent"]["activation"] == STEPS * (g + f + act + grad) * BPE
        assert r["sent"]["model"] == r["sent"]["data"] == 0
        mem = m["memory"]["ranks"][r["rank"]]
        params = sum(local_unit_params(i) for c in chunks for i in range(*bounds[c])) * BPE
        assert mem["params"] == mem["grads"] == params and mem["optimizer"] == 2 * params  # Adam: m, v
    assert_cost_model_agrees(m)


def assert_cost_model_agrees(m: dict) -> None:
    """The cost model's bytes and memory are the ledger's, its activation peaks the meters', and its
    step time the simulated clock's within 5% (when the run had --clock sim)."""
    assert m["prediction_mismatches"] == []
    got = [r["activations_peak"] for r in m["memory"]["ranks"]]
    assert got == [r["activations_peak"] for r in m["predicted"]["memory"]["ranks"]]
    if "sim" in m["time"]:  # predict == simulate, as for every other layout
        sim, pred = m["time"]["sim"]["step_s"], m["predicted"]["time"]["step_s"]
        assert abs(pred / sim - 1) <= 0.05, (sim, pred)


LAYOUTS = [  # (schedule, micro-batches, grad-accum, recompute, more options)
    ("1f1b", 3, 2, "full", SIM),
    ("gpipe", 2, 1, "none", []),
    ("zb-v", 4, 1, "selective", SIM),
]


@pytest.mark.parametrize("schedule,M,accum,recompute,more", LAYOUTS, ids=[lay[0] for lay in LAYOUTS])
def test_tp_inside_pp_trains_the_serial_model_and_moves_the_formula_bytes(
    tmp_path, serial, schedule, M, accum, recompute, more
):
    layout = ["--tp", str(T), "--pp", str(S), "--schedule", schedule, "--microbatches", str(M)]
    layout += ["--grad-accum", str(accum), "--recompute", recompute, *more]
    m = train_json(4, [*F64, *layout], tmp_path)
    assert_same_model(m, serial(F64), 1e-12)
    check_ledger_and_memory(m, schedule, M, accum, recompute)
