"""--arch resmlp under tensor, sequence AND pipeline parallelism (--tp 2 --sp --pp 2): between stages
the residual stream is sequence-sharded, so tp rank k of a stage sends only its rows to tp rank k of
the next stage (Korthikanti et al. 2022, sec. 4.2.2), 1/t of what --tp --pp sends.

Over MPI, every schedule (1f1b with --grad-accum 2 and --recompute full, zb-h1 with --recompute
selective, gpipe, interleaved, zb-v) on four ranks and 1f1b with --dp 2 on eight trains the serial
model (float64 1e-12, losses and final weights); each rank's ledger equals the closed forms below;
params/grads memory is this rank's shards; the activation peak is the cost model's (and for gpipe the
formula below); the cost model's step time is the simulated clock's. Bad input is one line.

Per step, on the rank with tp index k of stage s, for every micro-batch of b rows on its dp rank
(b = np.array_split sizes; --sp needs t | b), d the residual width, N = b*d, c = np.array_split
sizes of N over t (ring: an all-gather sends N - c_(k+1), a reduce-scatter N - c_k):
  each block of its chunks   2 all-gathers ("sp-gather") + 2 reduce-scatters ("sp-scatter") of N;
                             one more of each under --recompute full (the forward re-runs)
  each chunk boundary        (b/t)*d elements forward ("pp-send-act") to the next chunk's stage,
                             (b/t)*d back ("pp-send-grad"): 1/t of --tp --pp's b*d
  once per step              ring all-reduce over tp ("sp-grad-allreduce", category model) of each
                             of its blocks' gamma, beta (2d) and of its projections' parameters
  with --dp 2                each gradient bucket all-reduced over 2 ranks: 2n - c_0 - c_1 = n, so
                             its parameters' bytes once
  gpipe's activation peak    every micro-batch alive: per b rows, an input projection's d_in and an
                             output projection's d on b/t rows, a block's x, xh, s (2d + 1) on b/t
                             rows and its gathered h, z1, u (d + 2d/t) on all b
"""

from __future__ import annotations

import pytest

from tests.conftest import assert_same_model, split_sizes, train_json
from tests.mpi.parallel.pipeline.test_resmlp_pipeline import BATCH, F64, STEPS
from tests.mpi.parallel.pipeline.test_tensor_resmlp_pipeline import (
    SIM,
    assert_cost_model_agrees,
    local_unit_params,
    stage_of,
)
from tests.mpi.parallel.test_tensor_parallel import ring_allreduce_sent
from tests.mpi.parallel.test_tensor_resmlp import ring_allgather_sent, ring_reduce_scatter_sent
from tests.mpiutil import run_mpi
from tests.unit.parallel.pipeline.test_resmlp_pipeline import LAYERS, unit_split

T, S, D, BPE = 2, 2, LAYERS[1], 8


def is_block(i: int) -> bool:
    return 0 < i < len(LAYERS) - 2


def rows_per_micro_batch(dp: int, dp_index: int, accum: int, M: int) -> list[list[int]]:
    """Rows of each micro-batch on dp rank dp_index, per accumulation step: the batch split into
    accum steps, each over dp ranks, each into M micro-batches (np.array_split's sizes each time)."""
    return [split_sizes(split_sizes(k_rows, dp)[dp_index], M) for k_rows in split_sizes(BATCH, accum)]


def kept_per_micro_batch(b: int, units: list[int]) -> int:
    """Elements a stage keeps for backward for one micro-batch of b rows (no recomputation)."""
    shard, n = b // T, 0
    for i in units:
        n += shard * (2 * D + 1) + b * (D + 2 * (D // T)) if is_block(i) else shard * LAYERS[i]
    return n


def check_ledger_and_memory(m: dict, schedule: str, M: int, accum: int, recompute: str, dp: int) -> None:
    C = 2 * S if schedule == "zb-v" else S * (2 if schedule == "interleaved" else 1)
    bounds = unit_split(LAYERS, C)
    again = 1 if recompute == "full" else 0
    for r in m["comm"]["ranks"]:
        s, d, k, ops = r["coords"]["pp"], r["coords"]["dp"], r["coords"]["tp"], r["by_op"]
        got = lambda op: ops.get(op, {"sent": 0})["sent"]
        stage = lambda c: c % S if schedule == "interleaved" else stage_of(c, schedule)  # c mod S, or a V
        chunks = [c for c in range(C) if stage(c) == s]
        units = [i for c in chunks for i in range(*bounds[c])]
        blocks = sum(1 for i in units if is_block(i))
        gather = scatter = act = grad = 0
        for b in (b for step in rows_per_micro_batch(dp, d, accum, M) for b in step):
            gather += blocks * (2 + again) * ring_allgather_sent(b * D, T, k)
            scatter += blocks * (2 + again) * ring_reduce_scatter_sent(b * D, T, k)
            act += sum(b // T * D for c in chunks if c < C - 1 and stage(c + 1) != s)
            grad += sum(b // T * D for c in chunks if c > 0 and stage(c - 1) != s)
        assert got("activation/sp-gather") == STEPS * gather * BPE, (r["rank"], schedule)
        assert got("activation/sp-scatter") == STEPS * scatter * BPE, (r["rank"], schedule)
        assert got("activation/pp-send-act") == STEPS * act * BPE, (r["rank"], schedule)
        assert got("activation/pp-send-grad") == STEPS * grad * BPE, (r["rank"], schedule)
        assert r["sent"]["activation"] == STEPS * (gather + scatter + act + grad) * BPE
        params = sum(local_unit_params(i) for i in units)
        sp_grads = sum(
            ring_allreduce_sent(2 * D if is_block(i) else local_unit_params(i), T, k) for i in units
        )
        assert got("model/sp-grad-allreduce") == STEPS * sp_grads * BPE
        assert r["sent"]["model"] == STEPS * (sp_grads + (params if dp == 2 else 0)) * BPE
        assert r["sent"]["data"] == 0
        mem = m["memory"]["ranks"][r["rank"]]
        assert mem["params"] == mem["grads"] == params * BPE and mem["optimizer"] == 2 * params * BPE
        if schedule == "gpipe" and recompute == "none" and accum == 1:
            peak = sum(kept_per_micro_batch(b, units) for b in rows_per_micro_batch(dp, d, 1, M)[0])
            assert mem["activations_peak"] == peak * BPE, r["rank"]
    assert_cost_model_agrees(m)


LAYOUTS = [  # (schedule, micro-batches, grad-accum, recompute, dp, more options)
    ("1f1b", 3, 2, "full", 1, SIM),
    ("zb-h1", 3, 1, "selective", 1, SIM),
    ("gpipe", 6, 1, "none", 1, []),
    ("interleaved", 2, 1, "selective", 1, ["--virtual-stages", "2"]),
    ("zb-v", 3, 1, "none", 1, SIM),
    ("1f1b", 3, 1, "none", 2, SIM),  # eight ranks: dp2 x tp2 x pp2
]


@pytest.mark.parametrize(
    "schedule,M,accum,recompute,dp,more",
    LAYOUTS,
    ids=[f"{lay[0]}-dp{lay[4]}-{lay[3]}" for lay in LAYOUTS],
)
def test_sp_inside_pp_trains_the_serial_model_and_sends_row_shards(
    tmp_path, serial, schedule, M, accum, recompute, dp, more
):
    layout = ["--dp", str(dp), "--tp", str(T), "--sp", "--pp", str(S), "--schedule", schedule]
    layout += ["--microbatches", str(M), "--grad-accum", str(accum), "--recompute", recompute, *more]
    m = train_json(dp * T * S, [*F64, *layout], tmp_path, timeout=240)
    assert_same_model(m, serial(F64), 1e-12)
    check_ledger_and_memory(m, schedule, M, accum, recompute, dp)


def test_sp_with_pp_needs_whole_row_shards_per_micro_batch():
    res = run_mpi(
        4,
        ["train", "--steps", "1", "--arch", "resmlp", "--tp", "2", "--pp", "2", "--sp", "--batch", "36"],
        timeout=60,
    )
    assert res.returncode == 2 and res.stderr.count("simpar: error:") == 1, res.stderr[-2000:]
    assert "must be a multiple of dp*grad-accum*microbatches*tp = 8" in res.stderr
    assert "Traceback" not in res.stderr
