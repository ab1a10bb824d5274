"""--arch gpt --tp t [--sp] on real MPI ranks: equal to serial in float64, every byte and the activation
memory against closed forms written HERE (not the cost model's), and the shapes tp cannot split
refused in one line.

Megatron's split (parallel/tensor_gpt.py, vocab_parallel.py): per micro-step of R = b s token rows of
width h, a tp rank of t moves, ring collectives (all-reduce 2(t-1)/t N, all-gather and reduce-scatter
(t-1)/t N elements per rank):
  tp:  2L g all-reduces + 2L f all-reduces of R h (attention and MLP), the vocabulary-parallel
       embedding's forward all-reduce and the head's backward all-reduce of R h        -> (4L+2) 2(t-1)/t R h
  sp:  4L all-gathers + 4L reduce-scatters of R h, and one of each for the embedding and the head
                                                                                      -> (8L+4) (t-1)/t R h
       (the same bytes), plus once per step the LayerNorm gradients: 4h per block, 2h for the head
  the loss, both: the row maxima all-gathered ((t-1) R) and [sum exp, label logit] all-reduced (2R).
A rank's parameters: embedding V h/t + s h, block 12h^2/t + 7h/t + 6h, head 2h + V h/t.
"""

from __future__ import annotations

import pytest

from tests.conftest import assert_same_model, split_sizes, train_json
from tests.mpiutil import run_mpi

L, H, A, S, V, B, STEPS = 2, 16, 4, 8, 16, 8, 2
SHAPE = ["--arch", "gpt", "--n-layers", str(L), "--hidden", str(H), "--heads", str(A)]
SHAPE += ["--seq-len", str(S), "--vocab", str(V), "--dataset", "copy", "--samples", "64"]
ARGS = [*SHAPE, "--batch", str(B), "--steps", str(STEPS), "--dtype", "float64", "--optimizer", "adam"]
ARGS += ["--lr", "0.01", "--kernels", "numpy"]
BPE = 8


def local_units(t: int) -> list[int]:
    return [V * H // t + S * H] + [12 * H * H // t + 7 * H // t + 6 * H] * L + [2 * H + H * V // t]


def allreduce(n: int, t: int) -> int:
    assert n % t == 0  # the shapes here divide: every ring chunk is n/t
    return 2 * (t - 1) * n // t


def gather(n: int, t: int) -> int:  # an all-gather or a reduce-scatter
    assert n % t == 0
    return (t - 1) * n // t


def activation_sent(b: int, t: int, sp: bool) -> int:
    """Bytes one tp rank sends for one micro-step of b sequences (the module docstring)."""
    R = b * S
    rows = 2 * (4 * L + 2) * gather(R * H, t) if sp else (4 * L + 2) * allreduce(R * H, t)
    return (rows + (t - 1) * R + allreduce(2 * R, t)) * BPE


def activation_peak(b: int, t: int, sp: bool) -> int:
    """What a tp rank keeps for b sequences: token ids; per block LayerNorms' xh and 1/sigma (/t under
    sp), the gathered inputs of attention and of the MLP, q k v o and the MLP's z, gelu(z) (/t), the
    heads' scores a s^2 / t; the head's xh, 1/sigma (/t under sp) and gathered LN output."""
    if sp:
        block = 2 * S * H + 14 * S * H // t + A * S * S // t + 2 * S // t
        head = S * H + S * H // t + S // t
    else:
        block = 4 * S * H + 12 * S * H // t + A * S * S // t + 2 * S
        head = 2 * S * H + S
    return b * (8 * S + (L * block + head) * BPE)


@pytest.mark.parametrize(
    "n, layout",
    [
        (2, ["--tp", "2"]),
        (2, ["--tp", "2", "--sp"]),
        (4, ["--tp", "4", "--sp", "--grad-accum", "2"]),
        (4, ["--tp", "2", "--dp", "2"]),
        (4, ["--tp", "2", "--dp", "2", "--sp"]),
    ],
    ids=["tp2", "tp2-sp", "tp4-sp-accum2", "dp2xtp2", "dp2xtp2-sp"],
)
def test_tensor_parallel_gpt_equals_serial_with_exact_bytes(n, layout, serial, tmp_path):
    ref = serial(ARGS)
    run = train_json(n, [*ARGS, *layout], tmp_path, timeout=240)
    assert_same_model(run, ref, rtol=1e-12)
    t = int(layout[1])
    dp, sp = n // t, "--sp" in layout
    K = 2 if "--grad-accum" in layout else 1
    b = B // (dp * K)
    P_local = sum(local_units(t))
    for r, rank in enumerate(run["comm"]["ranks"]):
        d = r // t
        assert rank["sent"]["activation"] == K * activation_sent(b, t, sp) * STEPS, (layout, r)
        grads = 0
        if dp > 1:  # one gradient bucket of this rank's shards over its dp group
            c = split_sizes(P_local, dp)
            grads += 2 * P_local - c[d] - c[(d + 1) % dp]
        if sp:  # the LayerNorm gammas and betas summed over tp once a step
            grads += L * allreduce(4 * H, t) + allreduce(2 * H, t)
        assert rank["sent"]["model"] == grads * BPE * STEPS, (layout, r)
        ops = rank["by_op"]
        if sp:
            assert ops["activation/sp-gather"]["sent"] == 4 * L * K * gather(b * S * H, t) * BPE * STEPS
            assert "activation/tp-f-allreduce" not in ops
        else:
            assert (
                ops["activation/tp-f-allreduce"]["sent"] == 2 * L * K * allreduce(b * S * H, t) * BPE * STEPS
            )
            assert (
                ops["activation/vocab-embed-allreduce"]["sent"] == K * allreduce(b * S * H, t) * BPE * STEPS
            )
        mem = run["memory"]["ranks"][r]
        assert mem["params"] == mem["grads"] == P_local * BPE
        assert mem["activations_peak"] == activation_peak(b, t, sp)
    assert run["prediction_mismatches"] == []
    predicted = [m["activations_peak"] for m in run["predicted"]["memory"]["ranks"]]
    assert predicted == [activation_peak(b, t, sp)] * n


def test_mixed_precision_tp_matches_its_prediction(tmp_path):
    """--precision mixed-bf16: 2-byte activations on the wire, the loss's two messages float32."""
    args = [*SHAPE, "--batch", str(B), "--steps", "2", "--optimizer", "adam", "--precision", "mixed-bf16"]
    run = train_json(2, [*args, "--tp", "2", "--sp"], tmp_path)
    assert run["prediction_mismatches"] == []
    R = B * S
    ce = ((2 - 1) * R + allreduce(2 * R, 2)) * 4
    assert run["comm"]["ranks"][0]["sent"]["activation"] == (2 * (4 * L + 2) * gather(R * H, 2) * 2 + ce) * 2


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--heads", "3", "--hidden", "12", "--tp", "2"], "--heads 3 is not divisible by --tp 2"),
        (["--vocab", "17", "--tp", "2"], "--vocab 17 is not divisible by --tp 2"),
        (["--seq-len", "6", "--tp", "4", "--heads", "4", "--vocab", "16"], None),
        (["--seq-len", "6", "--tp", "4", "--heads", "4", "--vocab", "16", "--sp"], "--seq-len 6 must be"),
    ],
    ids=["heads", "vocab", "seq-ok-without-sp", "seq-sp"],
)
def test_shapes_tp_cannot_split_are_refused_in_one_line(extra, message):
    n = 4 if "4" in extra[extra.index("--tp") + 1] else 2
    args = ["train", "--arch", "gpt", "--dataset", "copy", "--steps", "1", "--batch", "8", "--quiet", *extra]
    res = run_mpi(n, args, timeout=120)
    if message is None:
        assert res.returncode == 0, res.stderr[-2000:]
        return
    assert res.returncode == 2
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("simpar: error: ") and message in lines[0], res.stderr
    assert "Traceback" not in res.stderr


def test_tour_lists_the_tensor_parallel_layouts_equal_with_exact_bytes(tmp_path):
    """`tour --arch gpt` on 4 ranks adds tp4, tp4-sp, dp2xtp2, dp2xtp2-sp, tp2xpp2 and tp2xpp2-sp
    (pipeline/test_gpt_tp_pipeline.py) and the context-parallel layouts (cp2 on 2 of the ranks, cp4,
    dp2 x cp2 and with --zero 1, cp2 x tp2, cp2 x pp2, cp4 with Ulysses: test_context*.py) to the
    data-parallel and pipeline layouts, each equal to serial (the tour fails otherwise) with every rank's
    bytes = the cost model's. The issue-24 done-when, as a test."""
    args = ["tour", *SHAPE, "--batch", str(B), "--steps", "2", "--out", str(tmp_path), "--no-plots"]
    res = run_mpi(4, args, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = [
        line.split() for line in res.stdout.splitlines() if line.split()[:1] and line.split()[-1] == "exact"
    ]
    names = [r[0] for r in rows]
    assert names[5:] == [
        "tp4",
        "tp4-sp",
        "pp4-gpipe",
        "pp4-1f1b",
        "dp2xtp2",
        "dp2xtp2-sp",
        "dp2xpp2",
        "tp2xpp2",
        "tp2xpp2-sp",
        "cp2",
        "cp4",
        "dp2xcp2",
        "dp2xcp2-zero1",
        "cp2xtp2",
        "cp2xpp2",
        "cp4-ulysses",
    ], res.stdout
    by_name = {r[0]: r for r in rows}  # layout, ranks, final loss, max|dloss| ...
    assert by_name["cp2"][1] == "2" and all(by_name[n][1] == "4" for n in names[5:] if n != "cp2")
    assert all(float(r[3]) <= 1e-10 for r in rows), rows


def test_checkpoint_from_tp_sp_resumes_on_other_layouts(tmp_path):
    """A tp2-sp checkpoint holds full-shape units (gathered from the shards, Adam's state too): serial
    and tp4 resume it at step 2 and continue as the uninterrupted tp2-sp run does."""
    ckpt = tmp_path / "ckpt"
    args = [*SHAPE, "--batch", str(B), "--steps", "4", "--dtype", "float64", "--optimizer", "adam"]
    saver = [*args, "--tp", "2", "--sp", "--checkpoint-dir", str(ckpt), "--checkpoint-every", "2"]
    full = train_json(2, saver, tmp_path, "full")
    step2 = str(ckpt / "step-000002")
    for n, extra in ((1, []), (4, ["--tp", "4"])):
        resumed = train_json(n, [*args, *extra, "--resume", step2], tmp_path, f"res{n}")
        assert_same_model(resumed, {**full, "losses": full["losses"][2:]}, rtol=1e-12)
