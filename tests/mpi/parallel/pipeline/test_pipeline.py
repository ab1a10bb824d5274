"""Pipeline parallelism (simpar/parallel/pipeline.py) against the serial model, its traffic and memory.

* Equivalence: every schedule (naive, GPipe, 1F1B, ZB-H1, interleaved, ZB-V) with several M on 2 and
  4 stages, also with dp or tp around the pipeline, trains the serial model (float64: 1e-12
  relative, float32: 1e-5); the pipeline bytes and every rank's activation peak are the cost
  model's. To keep this cheap the whole matrix for one stage count runs inside ONE MPI job
  (MATRIX_SCRIPT calls run_training once per case, the serial reference on rank 0 over COMM_SELF);
  the 4-rank job also runs dp2 x pp2 and tp2 x pp2; the older hybrid tests go through the CLI.
* Traffic: per rank per step, exactly B_r*h_out forward (unless last stage) + B_r*h_in backward
  (unless first stage) bytes of "activation", per chunk boundary that crosses ranks (zb-v: 2S-2 of
  its 2S-1, the turn S-1 -> S stays on rank S-1); no "model" bytes unless dp > 1.
* Memory: with a fixed micro-batch size, GPipe's activation peak grows with M, 1F1B's stops at S,
  ZB-H1 holds S on every stage, ZB-V 2S half-stage chunks; recomputation keeps the inputs (full) or
  inputs and z (selective).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import assert_same_model, split_sizes, stage_split, train_json
from tests.mpiutil import run_script

LAYERS = [64, 32, 32, 32, 10]
STEPS, BATCH = 3, 50  # 50 rows: 3, 4 and 8 micro-batches are uneven, on purpose
BASE = dict(
    layers=LAYERS,
    dtype="float64",
    steps=STEPS,
    batch=BATCH,
    kernels="numpy",
    quiet=True,
    eval_every_epoch=False,
)
CLI = [
    "--layers",
    ",".join(map(str, LAYERS)),
    "--dtype",
    "float64",
    "--steps",
    str(STEPS),
    "--batch",
    str(BATCH),
    "--kernels",
    "numpy",
]

MATRIX_SCRIPT = r"""
import json, sys
import numpy as np
from mpi4py import MPI
from simpar.runtime.comm import Communicator, Ledger
from simpar.config import RunConfig
from simpar.run.loop import run_training

LAYOUT = ("pp", "dp", "tp", "schedule", "microbatches", "stage_layers", "grad_accum", "virtual_stages",
          "recompute")
cases = json.load(open(sys.argv[1]))
rank = MPI.COMM_WORLD.Get_rank()
serial, out = {}, {}
for name, kw in cases:
    result = run_training(RunConfig(**kw), Communicator(MPI.COMM_WORLD, Ledger(), "world"))
    if rank != 0:
        continue
    metrics = result.metrics
    ref_kw = {k: v for k, v in kw.items() if k not in LAYOUT}
    key = json.dumps(ref_kw, sort_keys=True)
    if key not in serial:
        serial[key] = run_training(RunConfig(**ref_kw), Communicator(MPI.COMM_SELF, Ledger(), "self"))
    ref = serial[key]
    pairs = [(a, b) for pa, pb in zip(ref.weights, result.weights) for a, b in zip(pa, pb)]
    metrics["weight_err"] = max(float(np.abs(a - b).max() / np.abs(a).max()) for a, b in pairs)
    metrics["loss_err"] = max(abs(a - b) / abs(a) for a, b in zip(ref.metrics["losses"], metrics["losses"]))
    out[name] = metrics
if rank == 0:
    json.dump(out, open(sys.argv[2], "w"))
"""


def run_matrix(S: int, cases: list, tmp_path) -> dict:
    spec, result = tmp_path / "cases.json", tmp_path / "results.json"
    spec.write_text(json.dumps(cases))
    script = tmp_path / "matrix.py"
    script.write_text(MATRIX_SCRIPT)
    res = run_script(S, script, [str(spec), str(result)], timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return json.loads(result.read_text())


def rows_per_rank(batch: int, dp: int, grad_accum: int = 1) -> list[int]:
    """Rows each dp rank processes per step: each micro-step's rows split over dp (np.array_split)."""
    return [sum(split_sizes(rows, dp)[d] for rows in split_sizes(batch, grad_accum)) for d in range(dp)]


def check_activation_bytes(m: dict, layers=None, stage_layers=None) -> None:
    """Exactly B_r*h_out*bpe forward + B_r*h_in*bpe backward per step per rank and per model chunk it
    holds (interleaved: chunks s, s+S, ...; zb-v: s and 2S-1-s), across each boundary to a chunk on
    another rank; received likewise."""
    cfg = m["config"]
    layers = layers or cfg["layers"]
    S, dp = cfg["pp"], cfg["dp"]
    V = cfg.get("virtual_stages", 1) if cfg["schedule"] == "interleaved" else 1
    C = 2 * S if cfg["schedule"] == "zb-v" else S * V
    holder = (lambda c: min(c, C - 1 - c)) if cfg["schedule"] == "zb-v" else (lambda c: c % S)
    bounds = stage_split(layers, C, stage_layers)
    bpe = np.dtype(cfg["dtype"]).itemsize
    rows = rows_per_rank(cfg["batch"], dp, cfg["grad_accum"])
    for r in m["comm"]["ranks"]:
        s, d = r["coords"]["pp"], r["coords"]["dp"]
        B, n = rows[d], cfg["steps"] * bpe
        mine = [bounds[c] + (c,) for c in range(C) if holder(c) == s]
        up = lambda c: c < C - 1 and holder(c + 1) != s  # noqa: E731  (a message to chunk c+1)
        down = lambda c: c > 0 and holder(c - 1) != s  # noqa: E731  (a message to chunk c-1)
        fwd = sum(B * layers[hi] * n for lo, hi, c in mine if up(c))
        bwd = sum(B * layers[lo] * n for lo, hi, c in mine if down(c))
        ops = r["by_op"]
        assert ops.get("activation/pp-send-act", {}).get("sent", 0) == fwd, (r["rank"], ops)
        assert ops.get("activation/pp-send-grad", {}).get("sent", 0) == bwd, (r["rank"], ops)
        # What a chunk receives is what its neighbours send: the same two boundaries.
        got_act = sum(B * layers[lo] * n for lo, hi, c in mine if down(c))
        got_grad = sum(B * layers[hi] * n for lo, hi, c in mine if up(c))
        assert ops.get("activation/pp-send-act", {}).get("received", 0) == got_act
        assert ops.get("activation/pp-send-grad", {}).get("received", 0) == got_grad
        if dp == 1:
            assert r["sent"]["model"] == 0 and r["received"]["model"] == 0


DEEP = [64, 32, 32, 32, 32, 32, 32, 32, 10]  # 8 layers: 4 stages x 2 chunks


def matrix_cases(S: int) -> list:
    cases = [
        (f"{sched}-M{M}", dict(BASE, pp=S, schedule=sched, microbatches=M))
        for sched in ("naive", "gpipe", "1f1b", "zb-h1")
        for M in (1, 3, 4, 8)
    ]
    # interleaved: M divisible by S, S*V chunks of layers
    cases += [
        (
            f"interleaved-V2-M{M}",
            dict(
                BASE,
                pp=S,
                schedule="interleaved",
                virtual_stages=2,
                microbatches=M,
                layers=LAYERS if S == 2 else DEEP,
            ),
        )
        for M in (S, 2 * S)
    ]
    # zb-v: 2S chunks in a V (S = 4 needs 8 layers), any M
    cases += [
        (f"zb-v-M{M}", dict(BASE, pp=S, schedule="zb-v", microbatches=M, layers=LAYERS if S == 2 else DEEP))
        for M in ((1, 3, 4) if S == 2 else (3, 8))
    ]
    if S == 2:
        cases += [
            ("zb-v-float32", dict(BASE, pp=2, schedule="zb-v", microbatches=4, dtype="float32")),
            # the loss is on rank 0: rank 0 keeps its labels, sends x and no labels to rank 1
            ("zb-v-data-root", dict(BASE, pp=2, schedule="zb-v", microbatches=2, data_source="root")),
            (
                "zb-v-recompute-full-grad-accum-2",
                dict(BASE, pp=2, schedule="zb-v", microbatches=3, recompute="full", grad_accum=2),
            ),
            (
                "zb-v-recompute-selective",
                dict(BASE, pp=2, schedule="zb-v", microbatches=4, recompute="selective"),
            ),
            (
                "interleaved-V4-M4",
                dict(BASE, pp=2, schedule="interleaved", virtual_stages=4, microbatches=4, layers=DEEP),
            ),
            ("zb-h1-float32", dict(BASE, pp=2, schedule="zb-h1", microbatches=3, dtype="float32")),
            (
                "interleaved-float32",
                dict(BASE, pp=2, schedule="interleaved", virtual_stages=2, microbatches=4, dtype="float32"),
            ),
            ("zb-h1-grad-accum-2", dict(BASE, pp=2, schedule="zb-h1", microbatches=3, grad_accum=2)),
            ("1f1b-recompute-full", dict(BASE, pp=2, schedule="1f1b", microbatches=4, recompute="full")),
            (
                "zb-h1-recompute-selective",
                dict(BASE, pp=2, schedule="zb-h1", microbatches=4, recompute="selective"),
            ),
            (
                "interleaved-recompute-full",
                dict(
                    BASE,
                    pp=2,
                    schedule="interleaved",
                    virtual_stages=2,
                    microbatches=4,
                    recompute="full",
                    grad_accum=2,
                ),
            ),
            ("stage-layers-3,1", dict(BASE, pp=2, schedule="1f1b", microbatches=4, stage_layers=[3, 1])),
            ("grad-accum-2", dict(BASE, pp=2, schedule="gpipe", microbatches=3, grad_accum=2)),
            ("float32", dict(BASE, pp=2, schedule="1f1b", microbatches=3, dtype="float32")),
        ]
    else:
        # Memory: fixed micro-batch of 8 rows, so M micro-batches in flight = M * 8 rows of activations.
        cases += [
            (f"mem-{sched}-M{M}", dict(BASE, pp=4, schedule=sched, microbatches=M, batch=8 * M, steps=1))
            for sched in ("gpipe", "1f1b", "zb-h1")
            for M in (2, 8)
        ]
        cases += [
            ("mem-zb-v-M8", dict(BASE, pp=4, schedule="zb-v", microbatches=8, batch=64, steps=1, layers=DEEP))
        ]
        cases += [
            (
                f"mem-1f1b-M8-{mode}",
                dict(BASE, pp=4, schedule="1f1b", microbatches=8, batch=64, steps=1, recompute=mode),
            )
            for mode in ("full", "selective")
        ]
        # dp and tp around the pipeline, on the same 4 ranks
        cases += [
            ("dp2xpp2-zb-h1", dict(BASE, pp=2, dp=2, schedule="zb-h1", microbatches=3)),
            ("dp2xpp2-zb-v", dict(BASE, pp=2, dp=2, schedule="zb-v", microbatches=3)),
            (
                "tp2xpp2-zb-v-recompute-selective",
                dict(BASE, pp=2, tp=2, schedule="zb-v", microbatches=4, recompute="selective"),
            ),
            (
                "dp2xpp2-interleaved",
                dict(BASE, pp=2, dp=2, schedule="interleaved", virtual_stages=2, microbatches=2),
            ),
            ("tp2xpp2-zb-h1", dict(BASE, pp=2, tp=2, schedule="zb-h1", microbatches=4)),
            (
                "tp2xpp2-zb-h1-recompute-full",
                dict(BASE, pp=2, tp=2, schedule="zb-h1", microbatches=4, recompute="full"),
            ),
            (
                "dp2xpp2-gpipe-recompute-selective",
                dict(BASE, pp=2, dp=2, schedule="gpipe", microbatches=3, recompute="selective"),
            ),
            (
                "tp2xpp2-interleaved",
                dict(
                    BASE,
                    pp=2,
                    tp=2,
                    schedule="interleaved",
                    virtual_stages=2,
                    microbatches=4,
                    dtype="float32",
                ),
            ),
        ]
    return cases


@pytest.fixture(scope="module")
def matrices(tmp_path_factory):
    """matrices(S): the results of every case for S stages (one MPI job per S, run once)."""
    cache = {}

    def get(S: int) -> dict:
        if S not in cache:
            cache[S] = run_matrix(S, matrix_cases(S), tmp_path_factory.mktemp(f"pp{S}"))
        return cache[S]

    return get


@pytest.mark.parametrize("S", [2, 4])
def test_schedules_match_serial_and_traffic_formula(S, matrices):
    results = matrices(S)
    assert sorted(results) == sorted(name for name, _ in matrix_cases(S))
    for name, m in results.items():
        tol = 1e-5 if m["config"]["dtype"] == "float32" else 1e-12
        assert m["loss_err"] < tol and m["weight_err"] < tol, (S, name, m["loss_err"], m["weight_err"])
        check_activation_bytes(m, stage_layers=m["config"]["stage_layers"])
        assert m["prediction_mismatches"] == [], (name, m["prediction_mismatches"])
        measured = [r["activations_peak"] for r in m["memory"]["ranks"]]
        assert measured == [r["activations_peak"] for r in m["predicted"]["memory"]["ranks"]], name
        if name == "zb-v-data-root":  # x and labels both stay on rank 0: rank 1 (stage 1) needs neither
            assert [r["sent"]["data"] for r in m["comm"]["ranks"]] == [0, 0]


def test_memory_gpipe_grows_1f1b_bounded(matrices):
    results, S = matrices(4), 4
    # Stage 0 holds layer 0's context per micro-batch: input (64) + pre-activation (32) per row.
    per_mb = 8 * (64 + 32) * 8
    peak = {name: m["memory"]["ranks"][0]["activations_peak"] for name, m in results.items()}
    assert peak["mem-gpipe-M2"] == 2 * per_mb and peak["mem-gpipe-M8"] == 8 * per_mb  # grows with M
    assert peak["mem-1f1b-M2"] == 2 * per_mb and peak["mem-1f1b-M8"] == S * per_mb  # stops at S
    # ZB-H1: S micro-batches on EVERY stage (W held back s micro-batches), 1F1B's stage-0 figure
    assert peak["mem-zb-h1-M2"] == 2 * per_mb and peak["mem-zb-h1-M8"] == S * per_mb
    # Recomputation on stage 0 (one layer 64 -> 32, 8 rows per micro-batch, S = 4 alive under 1F1B):
    # full keeps only the input (64 per row), plus one micro-batch's rebuilt context during its backward;
    # selective keeps input and z (64 + 32): for a one-layer stage, everything.
    assert peak["mem-1f1b-M8-full"] == (S * 8 * 64 + 8 * 32) * 8
    assert peak["mem-1f1b-M8-selective"] == S * per_mb
    full = results["mem-1f1b-M8-full"]["memory"]["ranks"]
    assert full[3]["activations_peak"] == 1 * 8 * 32 * 8  # last stage: the logits layer's input only
    zb = results["mem-zb-h1-M8"]["memory"]["ranks"]
    assert [r["activations_peak"] for r in zb] == [
        S * 8 * (w_in + (w_out if s < 3 else 0)) * 8
        for s, (w_in, w_out) in enumerate([(64, 32), (32, 32), (32, 32), (32, 10)])
    ]
    # ZB-V, 8 one-layer chunks, rank s holding chunks s and 7-s, 8 rows per micro-batch: at most 2S
    # (micro-batch, chunk) units alive. Ranks 1-3 hold two 32 -> 32 layers (x and z: 64 per row), so
    # 2S units are S micro-batches of a 2-layer stage: 1F1B's stage-0 figure. Rank 0's chunks differ
    # (layer 0: 64 + 32 per row; the logits layer: its input, 32): its peak is 2S units of chunk 0
    # (F7 after the W passes of micro-batches 0-3's chunk 7, before any of chunk 0's), 1.5x 1F1B's
    # 4 x (96 + 32): the paper's "same memory as 1F1B" counts units and assumes equal chunks.
    zbv = [r["activations_peak"] for r in results["mem-zb-v-M8"]["memory"]["ranks"]]
    assert zbv == [2 * S * 8 * (64 + 32) * 8] + [2 * S * 8 * 64 * 8] * 3
    # Every stage s: 1F1B keeps at most S - s micro-batches.
    last = results["mem-1f1b-M8"]["memory"]["ranks"]
    widths = [(64, 32), (32, 32), (32, 32), (32, 10)]
    for s, (w_in, w_out) in enumerate(widths):
        row = w_in + (w_out if s < 3 else 0)  # the logits layer's z IS its output: counted once
        assert last[s]["activations_peak"] == (S - s) * 8 * row * 8


def test_dp2_pp2_with_trace(serial, tmp_path):
    trace_path = tmp_path / "trace.json"
    run = train_json(
        4,
        CLI
        + ["--dp", "2", "--pp", "2", "--schedule", "1f1b", "--microbatches", "3", "--trace", str(trace_path)],
        tmp_path,
    )
    assert_same_model(run, serial(CLI), 1e-12)
    check_activation_bytes(run)
    # Each stage all-reduces its own layers' gradients over 2 dp ranks: ring, p = 2 -> P_s * bpe per rank.
    for r in run["comm"]["ranks"]:
        lo, hi = stage_split(LAYERS, 2)[r["coords"]["pp"]]
        P_s = sum(LAYERS[i] * LAYERS[i + 1] + LAYERS[i + 1] for i in range(lo, hi))
        assert r["sent"]["model"] == STEPS * P_s * 8
    events = json.loads(trace_path.read_text())["traceEvents"]
    assert events and all(e["ph"] == "X" and e["dur"] >= 0 for e in events)
    assert {e["pid"] for e in events} == {0, 1, 2, 3}
    names = {e["name"] for e in events}
    assert {"F0", "F2", "B0", "B2", "send act", "recv act", "send grad", "recv grad", "allreduce"} <= names
    assert {e["tid"] for e in events if e["name"] in ("F0", "B0")} == {0}
    assert {e["tid"] for e in events if e["name"] in ("recv act", "allreduce")} == {1}


def test_tp2_pp2(serial, tmp_path):
    pytest.importorskip("simpar.parallel.tensor")
    run = train_json(
        4, CLI + ["--tp", "2", "--pp", "2", "--schedule", "gpipe", "--microbatches", "4"], tmp_path
    )
    assert_same_model(run, serial(CLI), 1e-12)
    check_activation_bytes(run)
    assert all(r["sent"]["model"] == 0 for r in run["comm"]["ranks"])


def test_dp2_tp2_pp2_eight_ranks(serial, tmp_path):
    pytest.importorskip("simpar.parallel.tensor")
    run = train_json(
        8,
        CLI
        + [
            "--dp",
            "2",
            "--tp",
            "2",
            "--pp",
            "2",
            "--schedule",
            "1f1b",
            "--microbatches",
            "3",
            "--grad-accum",
            "2",
        ],
        tmp_path,
        timeout=180,
    )
    assert_same_model(run, serial(CLI), 1e-12)
    check_activation_bytes(run)
