"""costmodel/cp_tp_pipeline.py and cp_tp_pipeline_time.py on layouts too large for CI's MPI tier.

dp2 x cp2 x tp2 x pp2 needs 16 ranks: here the closed form's bookkeeping for it against formulas
written in this test (the 8-rank MPI test, tests/mpi/parallel/pipeline/test_cp_tp_pipeline.py, checks
dp = 1 against a real ledger and the simulated clock). World rank ((stage dp + d) C + c) T + j
(mesh.py; tests/unit/runtime/test_mesh.py checks those groups for 16 ranks). Per micro-batch of
b = B / (dp M) sequences, n = s/C tokens per cp rank, R = b n rows, elements:
  pp       every tp rank sends its copy of the cp rank's residual stream, b n h, on (forward, stage
           0) and its gradient back (stage 1); --sp: its shard of the rows, b n h / T
  cp-kv    per block: 2(C-1) b n h/T forward + 4(C-1) b n h/T backward
  grads    the stage's P_T shards ring-all-reduced over the dp C = 4 ranks of the same tp index:
           2 (4-1)/4 P_T sent per step (P_T divisible by 4 here, so every rank sends the same)
And the time: with --tp 1 the closed form is cp_pipeline_time.py's, term for term (tp's collectives
vanish, a/T = a heads over h/T = h of the width, the same links), with --recompute and zb-h1/zb-v too
(test_cp_tp_pipeline_recompute.py writes their tp terms).
"""

from __future__ import annotations

import pytest

from simpar.config import RunConfig
from simpar.costmodel import hardware, predict_from_config
from simpar.costmodel.cp_pipeline_time import cp_pipeline_step_seconds
from simpar.costmodel.cp_tp_pipeline_time import cp_tp_pipeline_step_seconds
from simpar.costmodel.gpt import unit_sizes

L, H, A, S, V, B, M = 2, 16, 4, 16, 18, 8, 2
DP, C, T, PP = 2, 2, 2, 2
SHAPE = dict(arch="gpt", dataset="copy", blocks=L, hidden=H, heads=A, seq_len=S, vocab=V, batch=B)
SHAPE["dtype"] = "float64"
N, b = S // C, B // (DP * M)
EMB, BLOCK, HEAD = V * H // T + S * H, 12 * H * H // T + 7 * H // T + 6 * H, 2 * H + V * H // T
P_STAGE = (EMB + BLOCK, BLOCK + HEAD)  # embedding + block 1 | block 2 + head


@pytest.mark.parametrize("sp", [False, True])
def test_dp2_cp2_tp2_pp2_coordinates_and_bytes_per_rank(sp):
    cfg = RunConfig(**SHAPE, dp=DP, cp=C, tp=T, pp=PP, microbatches=M, schedule="1f1b", sp=sp, steps=1)
    pred = predict_from_config(cfg, DP * C * T * PP, steps=1, hw=hardware.load("local"))
    assert pred["stage_units"] == [(0, 2), (2, 4)]
    stream = b * N * H // T if sp else b * N * H
    kv = 2 * (C - 1) * b * N * H // T + 4 * (C - 1) * b * N * H // T
    for w, rank in enumerate(pred["comm"]["ranks"]):
        st, d, c, j = w // (DP * C * T), (w // (C * T)) % DP, (w // T) % C, w % T
        assert rank["coords"] == {"pp": st, "dp": d, "cp": c, "tp": j}
        send = "activation/pp-send-act" if st == 0 else "activation/pp-send-grad"
        assert rank["by_op"][send]["sent"] == M * stream * 8, w
        assert rank["by_op"]["activation/cp-kv"]["sent"] == M * kv * 8  # one block per stage
        assert P_STAGE[st] % (DP * C) == 0
        assert rank["by_op"]["model/grad-allreduce"]["sent"] == 2 * (DP * C - 1) * P_STAGE[st] // (DP * C) * 8
        assert pred["memory"]["ranks"][w]["params"] == P_STAGE[st] * 8


@pytest.mark.parametrize("profile", ["local", "dgx-h100"])
@pytest.mark.parametrize(
    "schedule, recompute",
    [("gpipe", "none"), ("1f1b", "full"), ("interleaved", "selective"), ("zb-h1", "none"), ("zb-v", "full")],
)
def test_with_tp_1_the_step_is_cp_pipeline_times(profile, schedule, recompute):
    extra = dict(virtual_stages=2) if schedule == "interleaved" else {}
    extra |= dict(recompute=recompute, schedule=schedule)
    cfg = RunConfig(**SHAPE, dp=DP, cp=C, pp=PP, microbatches=M, steps=1, **extra)
    hw, sizes = hardware.load(profile), unit_sizes(L, H, S, V)
    mine = cp_tp_pipeline_step_seconds(cfg, DP, sizes, sizes, hw)
    theirs = cp_pipeline_step_seconds(cfg, DP, sizes, hw)
    assert mine == pytest.approx(theirs, rel=1e-12)
    assert mine["step_s"] > 0
