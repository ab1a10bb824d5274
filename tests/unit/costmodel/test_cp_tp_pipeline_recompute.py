"""costmodel/cp_tp_pipeline.py and cp_tp_pipeline_time.py with --recompute and the zero-bubble schedules,
no MPI: the closed forms against values written here (the 8-rank MPI test,
tests/mpi/parallel/pipeline/test_cp_tp_pipeline.py, checks them on real runs and the simulated clock).

Shape: L = 2 blocks, h = 16, a = 4 heads, s = 16, V = 18; dp 2 x cp 2 x tp 2 x pp 2 = 16 ranks, n = s/C = 8
tokens per cp rank, M = 2 micro-batches of b = B/(dp M) = 2 sequences, R = b n rows, float64 (bpe = 8,
the wide type too). 1f1b cuts two chunks: embedding + block 1 | block 2 + head. Per micro-batch, what
--recompute sends AGAIN (elements; an all-reduce of N over T ranks sends 2(T-1)/T N):
  cp      per block: ring 2(C-1) b n h/T (full and selective: the ring's forward rebuilds its log-sum-exp);
          Ulysses 4 (C-1) (b n h/T)/C under full (its 4 forward all-to-alls), nothing under selective
  tp      full only: each block's 2 g all-reduces of R h (--sp: 2 all-gathers and 2 reduce-scatters,
          the same bytes), the embedding's all-reduce of R h (--sp: its reduce-scatter, (T-1)/T R h), the
          head's nothing (--sp: its all-gather, (T-1)/T R h)
Kept per sequence (bytes): a block (4 n h + 12 n h/T + 2 n) bpe + the softmax part (ring: the lse, a n/T in
the wide type; Ulysses: P of its heads, a s n/T); --sp (2 n h + 14 n h/T + 2 n/T) bpe + the same; the
embedding 8 n (token ids); the head (2 n h + n) bpe, --sp (n h + n h/T + n/T) bpe. Selective drops the
softmax parts, full keeps the chunk's input alone (8 n, or n h bpe; n h/T bpe under --sp). 1f1b holds on
stage st S - st - 1 micro-batches kept and one rebuilt.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from simpar.config import RunConfig
from simpar.costmodel import predict_from_config
from simpar.costmodel.cp_time import ring_seconds
from simpar.costmodel.cp_tp_pipeline_time import CpTpChunkCosts
from simpar.costmodel.gpt_time import clock_rates
from simpar.costmodel.hardware import LOCAL_DEFAULTS, group_link

L, H, A, S, V, B, M = 2, 16, 4, 16, 18, 8, 2
DP, C, T, PP = 2, 2, 2, 2
N, b, BPE = S // C, B // (DP * M), 8
R = b * N
SHAPE = dict(arch="gpt", dataset="copy", blocks=L, hidden=H, heads=A, seq_len=S, vocab=V, batch=B)
SHAPE |= dict(dp=DP, cp=C, tp=T, pp=PP, microbatches=M, dtype="float64", steps=1)
CHUNKS = [(0, 2), (2, 4)]


def allreduce(n: int) -> int:
    return 2 * (T - 1) * n // T


def again(unit: int, algo: str, mode: str, sp: bool) -> int:
    """Elements one rank sends again per micro-batch for a unit (module docstring)."""
    if mode == "none":
        return 0
    block = 0 < unit <= L
    if algo == "ring":
        cp = 2 * (C - 1) * b * N * H // T if block else 0
    else:
        cp = 4 * (C - 1) * (b * N * H // T // C) if block and mode == "full" else 0
    if mode == "selective":
        return cp
    if unit == 0:
        return (T - 1) * R * H // T if sp else allreduce(R * H)
    if unit == L + 1:
        return (T - 1) * R * H // T if sp else 0
    return cp + 2 * allreduce(R * H)


def predict(**extra) -> dict:
    return predict_from_config(RunConfig(**SHAPE, **extra), DP * C * T * PP, steps=1, hw=LOCAL_DEFAULTS)


@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("algo", ["ring", "ulysses"])
@pytest.mark.parametrize("mode", ["full", "selective"])
def test_recompute_sends_the_forward_messages_again(mode, algo, sp):
    base = predict(schedule="1f1b", cp_algo=algo, sp=sp)
    redo = predict(schedule="1f1b", cp_algo=algo, sp=sp, recompute=mode)
    for r0, r1 in zip(base["comm"]["ranks"], redo["comm"]["ranks"]):
        units = range(*CHUNKS[r0["coords"]["pp"]])
        want = M * sum(again(u, algo, mode, sp) for u in units) * BPE
        assert r1["sent"]["activation"] - r0["sent"]["activation"] == want, (r0["rank"], mode, algo, sp)
        assert r1["sent"]["model"] == r0["sent"]["model"]


@pytest.mark.parametrize("schedule", ["zb-h1", "zb-v"])
def test_the_zero_bubble_schedules_send_what_their_fused_backward_sends(schedule):
    """zb-v's V puts both blocks on stage 1 (no boundary between them); zb-h1 cuts as 1f1b does."""
    zb, fused = predict(schedule=schedule, sp=True), predict(schedule="1f1b", sp=True)
    for r0, r1 in zip(fused["comm"]["ranks"], zb["comm"]["ranks"]):
        if schedule == "zb-h1":
            assert r1["by_op"] == r0["by_op"]
        else:  # per stage the same units' cp and tp bytes; the pipeline: one boundary each way
            stage = r1["coords"]["pp"]
            stream = b * N * H // T * BPE * M  # the tp rank's rows of the residual stream
            assert r1["by_op"]["activation/pp-send-act"]["sent"] == stream
            assert r1["by_op"]["activation/pp-send-grad"]["sent"] == stream
            assert ("activation/cp-kv" in r1["by_op"]) == (stage == 1)


def kept(unit: int, sp: bool) -> tuple[int, int]:
    """(bytes one sequence keeps in a unit under selective, without) -- ring (module docstring)."""
    if unit == 0:
        return 8 * N, 8 * N
    if unit == L + 1:
        head = ((N * H + N * H // T + N // T) if sp else (2 * N * H + N)) * BPE
        return head, head
    rest = (2 * N * H + 14 * N * H // T + 2 * N // T) if sp else (4 * N * H + 12 * N * H // T + 2 * N)
    return rest * BPE, rest * BPE + A * N // T * BPE


@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("mode", ["none", "full", "selective"])
def test_1f1b_activation_peak_under_recompute(mode, sp):
    pred = predict(schedule="1f1b", sp=sp, recompute=mode)
    for r in pred["comm"]["ranks"]:
        st = r["coords"]["pp"]
        lo, hi = CHUNKS[st]
        full = sum(kept(u, sp)[1] for u in range(lo, hi))
        held = {"none": full, "selective": sum(kept(u, sp)[0] for u in range(lo, hi))}.get(
            mode, 8 * N if lo == 0 else (N * H // T if sp else N * H) * BPE
        )
        want = (PP - st - 1) * b * held + b * full
        assert pred["memory"]["ranks"][r["rank"]]["activations_peak"] == want, (mode, sp, st)


def chunk_costs(algo: str, mode: str, bounds: tuple[int, int]) -> CpTpChunkCosts:
    """One chunk's costs as cp_tp_pipeline_step_seconds builds them (dp 1, cp rank 0)."""
    cfg = RunConfig(**(SHAPE | dict(dp=1)), cp_algo=algo, recompute=mode, schedule="zb-h1")
    hw, world = LOCAL_DEFAULTS, C * T * PP
    spec = SimpleNamespace(dp=1, world=world, prec=SimpleNamespace(act=BPE, grad=BPE))
    links = {"cp": group_link(hw, "dp", C, T, PP), "dp": group_link(hw, "dp", C, T, PP)}
    links |= {"pp": group_link(hw, "pp", C, T, PP), "tp": group_link(hw, "tp", C, T, PP)}
    local = [V * H // T + S * H] + [12 * H * H // T + 7 * H // T + 6 * H] * L + [2 * H + V * H // T]
    return CpTpChunkCosts(cfg, spec, hw, links, bounds, local, 0.0, 0)


def test_the_w_pass_and_the_recompute_seconds_on_a_tp_rank():
    """zb's W pass of a block: the dW of its six shards on R = b n rows, 2 R 12 h (h/T) / rate, and 3
    stream passes over its P_T parameters; the head's 2 R h (V/T) / rate and the same. Selective: the
    ring's forward again over the rank's a/T heads of width h/T (cp_time.ring_seconds' F), or Ulysses'
    q k^T of its a/(C T) heads, 2 b s (h/(C T)) s / rate, per block. B is the backward less W."""
    rate, stream, _ = clock_rates(LOCAL_DEFAULTS, "fp64", C * T * PP)
    costs = chunk_costs("ring", "selective", (L, L + 2))  # block L and the head
    block_p, head_p = 12 * H * H // T + 7 * H // T + 6 * H, 2 * H + V * H // T
    expected = [
        2 * R * H * (V // T) / rate + 3 * head_p * BPE * stream,
        2 * R * 12 * H * (H // T) / rate + 3 * block_p * BPE * stream,
    ]
    assert costs.weight_layers(b) == pytest.approx(expected, rel=1e-12)
    F = ring_seconds(b, N, H // T, A // T, C, BPE, rate, stream, costs.links["cp"])[0]
    assert costs.recompute(b) == pytest.approx(F, rel=1e-12)
    uly = chunk_costs("ulysses", "selective", (L, L + 2)).recompute(b)
    assert uly == pytest.approx(2 * b * S * (H // (C * T)) * S / rate, rel=1e-12)
    assert costs.backward_input(b) == pytest.approx(costs.backward(b) - sum(expected), rel=1e-12)
