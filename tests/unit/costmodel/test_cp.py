"""Context parallelism in closed form (costmodel/cp.py), no MPI: the plan of a long-sequence GPT-3 run
whose activation memory per GPU falls as 1/C, the cp traffic, and the prediction of a small run.

The long run: GPT-3 175B (L 96, h 12288, a 96; Brown et al. 2020, Table 2.1) at s = 131072 tokens (Llama
3's long-context stage length), tp 8 + sp, pp 16, selective recomputation, 16 micro-batches of one
sequence each, mixed-precision Adam. Per layer and sequence Korthikanti et al. 2022 (Table 2, tp + sp +
selective) keep 34 s h / t bytes; with cp C a GPU holds s/C of the tokens: 34 (s/C) h / t. The first
stage holds ceil(96/16) = 6 layers of min(pp, M) = 16 micro-batches.
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import pytest

from simpar.cli.plan import plan_main
from simpar.config import SimparError
from simpar.costmodel import gpt as cg
from simpar.costmodel import gpt_plan as gp
from simpar.costmodel import hardware
from simpar.costmodel.cp import cp_activation_bytes, cp_kv_elems, plan_cp, ring_block_map
from simpar.model.ring_attention import block_relation

L, h, a, s, V = 96, 12288, 96, 131072, 50257
t, p, M = 8, 16, 16
LAYOUT = dict(tp=t, pp=p, sp=True, microbatches=M, recompute="selective", precision="mixed", optimizer="adam")


def activations(C: int) -> float:
    """Bytes of activations on the first stage's GPU, from the closed form in the module docstring."""
    return 6 * M * 34 * (s / C) * h / t


@pytest.mark.parametrize("C", [1, 2, 4, 8, 16])
def test_long_sequence_plan_activations_fall_as_one_over_C(C):
    shape = cg.Shape(L, h, a, s, V)
    hw = hardware.load("dgx-h100")
    plan = plan_cp(shape, M, hw, C, "ring", **LAYOUT)
    mem = plan["memory_per_gpu"]
    assert mem["activations"] == pytest.approx(activations(C), rel=1e-12)
    states = mem["params"] + mem["grads"] + mem["optimizer"]
    assert states == 16 * gp.stage_params(shape, t, p)  # mixed Adam: 2 + 2 + 12 bytes, not split by cp
    assert mem["total"] == pytest.approx(states + activations(1) / C, rel=1e-12)
    assert plan["world"] == C * t * p and plan["layout"]["cp"] == C
    # cp traffic per GPU per step (ring), per layer and micro-batch of b = 1 sequence, n = s/C, h/t wide:
    # K, V forward and backward 4 (C-1) b n h/t elements of 2 bytes, dK, dV 2 (C-1) b n h/t of 4 bytes
    per = 4 * (C - 1) * (s / C) * (h / t) * 2 + 2 * (C - 1) * (s / C) * (h / t) * 4
    assert plan["cp_bytes_per_gpu"] == pytest.approx(per * 6 * M)


def test_without_cp_the_long_run_does_not_fit_an_80_gb_gpu_and_cp16_is_far_closer():
    """The reason cp exists: 657 GB of activations per GPU at s = 131072 even with tp 8, sp and
    selective recomputation; cp 16 brings them to 41 GB."""
    assert activations(1) > 80e9 and activations(16) < 45e9


def run_plan(*argv) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        assert plan_main(list(argv)) == 0
    return out.getvalue()


def test_plan_command_prints_the_memory_with_and_without_cp():
    args = ["--arch", "gpt", "--model", "gpt3-175b", "--seq-len", str(s), "--tp", "8", "--pp", "16"]
    args += [
        "--batch",
        "16",
        "--microbatches",
        "16",
        "--sp",
        "--recompute",
        "selective",
        "--precision",
        "mixed",
    ]
    args += ["--optimizer", "adam", "--hardware", "dgx-h100"]
    one, four = (json.loads(run_plan(*args, "--cp", str(C), "--json")) for C in (1, 4))
    assert four["memory_per_gpu"]["activations"] == pytest.approx(one["memory_per_gpu"]["activations"] / 4)
    text = run_plan(*args, "--cp", "4")
    assert "context parallelism: cp 4 (ring)" in text and "without" in text
    assert "blocks per rank: [9, 9, 9, 9]" in text


def test_bad_plan_cp_is_refused():
    with pytest.raises(SimparError, match="--cp 7 cuts every sequence"):
        plan_main(["--arch", "gpt", "--model", "gpt3-175b", "--cp", "7"])
    with pytest.raises(SimparError, match="use it with --arch gpt"):
        plan_main(["--cp", "2"])


@pytest.mark.parametrize("C", [2, 4, 8])
def test_ring_and_ulysses_bytes_per_block(C):
    """Ring: 2(C-1) b n h forward, 4(C-1) b n h backward; Ulysses: 4 (C-1)/C b n h each way (n = s/C)."""
    b, n, w = 3, 64, 32
    assert cp_kv_elems(b, n, w, C, "ring") == {
        "forward": 2 * (C - 1) * b * n * w,
        "backward": 4 * (C - 1) * b * n * w,
    }
    u = cp_kv_elems(b, n, w, C, "ulysses")
    assert u["forward"] == u["backward"] == 4 * (C - 1) * b * n * w // C


def test_ulysses_keeps_exactly_one_over_C_of_the_serial_activations():
    b, S, Lb, hh, aa, VV = 4, 64, 2, 32, 4, 50
    serial = cg.simpar_activation_bytes(b, S, Lb, hh, aa, VV, 8)
    for C in (2, 4, 8):
        assert cp_activation_bytes(b, S, Lb, hh, aa, C, "ulysses", 8) * C == serial
        assert cp_activation_bytes(b, S, Lb, hh, aa, C, "ring", 8) < serial / C  # no s^2 scores at all


@pytest.mark.parametrize("C", [1, 2, 3, 4, 8])
def test_the_block_map_is_the_causal_triangle_balanced_and_what_the_ring_computes(C):
    """Every rank computes 2C+1 of the C(2C+1) blocks on or below the diagonal (chunks r and 2C-1-r);
    the ring's own rule (block_relation on the chunks a rank holds at each hop) picks the same ones."""
    grid = ring_block_map(C)
    cells = [(q, k, cell) for q, row in enumerate(grid) for k, cell in enumerate(row) if cell]
    assert {(q, k) for q, k, _ in cells} == {(q, k) for q in range(2 * C) for k in range(q + 1)}
    assert [sum(1 for *_, (r, _) in cells if r == rank) for rank in range(C)] == [2 * C + 1] * C
    for rank in range(C):  # replay the ring: at hop t rank r holds rank (r - t)'s chunks
        mine = (rank, 2 * C - 1 - rank)
        done = set()
        for t in range(C):
            j = (rank - t) % C
            done |= {(q, k, t) for q in mine for k in (j, 2 * C - 1 - j) if block_relation(q, k)}
        assert done == {(q, k, hop) for q, k, (r, hop) in cells if r == rank}
