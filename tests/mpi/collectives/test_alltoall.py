"""Bruck's all-to-all (collectives/bruck.py) beside the pairwise exchange: the same pieces delivered on
groups of 1-5 ranks (non powers of two included), bytes and messages against the closed forms written
here, the cost model's formulas, `--alltoall bruck` training the serial model, and its bad input.

The route of a piece is written here from the paper's rule, piece by piece (not rank by rank, as the
module and the cost model write it): a piece from rank s to rank q = s + j (mod p) moves 2^k ranks on in
round k for every set bit k of j, so it is sent by rank s + (j mod 2^k) and received by s + (j mod 2^(k+1)).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from tests.mpiutil import run_mpi, run_script
from tests.unit.collectives.test_alltoall import bruck_rows, messages, pairwise_rows

SCRIPT = Path(__file__).with_name("mpi_alltoall_check.py")
WIDTH = 3  # elements per row in the script's pieces


def test_both_alltoalls_deliver_every_piece_with_closed_form_bytes_on_1_to_5_ranks():
    res = run_script(5, SCRIPT, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(next(ln for ln in res.stdout.splitlines() if ln.startswith("REPORT "))[7:])
    for P in range(1, 6):
        per_rank = report[str(P)]
        for i, case in enumerate(per_rank[0]):
            rows, bpe = case["rows"], np.dtype(case["dtype"]).itemsize
            sent, received = (bruck_rows if case["alg"] == "bruck" else pairwise_rows)(rows, P)
            for r in range(P):
                got = per_rank[r][i]
                where = (P, r, case["alg"], case["dtype"], case["matrix"])
                assert got["exact"] and got["fresh"] and got.get("same_as_pairwise", True), where
                assert got["sent"] == sent[r] * WIDTH * bpe, where
                assert got["received"] == received[r] * WIDTH * bpe, where
                assert got["messages"] == messages(case["alg"], P), where
        # equal pieces of 4 rows: pairwise P-1 of them per rank; Bruck sum_j popcount(j), which is
        # (P/2) log2 P for P a power of two: P = 4 sends 4 pieces instead of 3, P = 5 five instead of 4
        equal = next(c for c in per_rank[0] if c["matrix"] == 1 and c["alg"] == "bruck")
        pieces = sum(bin(j).count("1") for j in range(P))
        assert equal["sent"] == pieces * 4 * WIDTH * np.dtype(equal["dtype"]).itemsize
        if P in (2, 4):
            assert pieces == P // 2 * int(math.log2(P))
    bench = {row["algorithm"]: row for row in report["bench"]}  # bench alltoall: 64-byte pieces, 5 ranks
    assert bench["pairwise"]["sent"] == 4 * 64 and bench["pairwise"]["messages"] == 4
    assert bench["bruck"]["sent"] == 5 * 64 and bench["bruck"]["messages"] == 3
    assert bench["mpi"]["sent"] is None and bench["mpi"]["vs_native"] == 1.0


def moe_args(E: int) -> list[str]:
    """test_moe.py's (tests/mpi/model/) MOE run with E experts (E = 4 is that very run: the serial cache
    serves both)."""
    return [
        "--dtype",
        "float64",
        "--steps",
        "4",
        "--experts",
        str(E),
        "--top-k",
        "2",
        "--capacity-factor",
        "1.0",
    ]


def expected_ops(moe_metrics: dict, P: int, E: int, d: int, rows_routed: int = 64) -> dict:
    """Rows rank d sends in each all-to-all over the run, by Bruck, from the routing histograms: the
    pieces of the ep group (dispatch: a's kept assignments to b's experts; combine: the transpose)."""
    from tests.mpi.model.test_moe import kept_from_routed

    per, cap = E // P, math.ceil(1.0 * 2 * rows_routed / E)
    base, out, back = d - d % P, 0, 0
    for step in moe_metrics["routed_by_rank"]:
        for H in step:
            kept = kept_from_routed(H, cap)
            go = [[int(kept[base + a][b * per : (b + 1) * per].sum()) for b in range(P)] for a in range(P)]
            out += bruck_rows(go, P)[0][d % P]
            back += bruck_rows([list(c) for c in zip(*go)], P)[0][d % P]
    return {"ep-dispatch": out, "ep-combine-grad": out, "ep-combine": back, "ep-dispatch-grad": back}


def test_bruck_trains_the_serial_model_with_closed_form_bytes(serial, tmp_path):
    """P = 4 (a power of two) and P = 5 (not), on the simulated clock: the cost model's step holds to it."""
    from dataclasses import replace

    from simpar.config import RunConfig
    from simpar.costmodel.hardware import load
    from simpar.costmodel.predict import predict_from_config
    from tests.conftest import assert_same_model, train_json

    sim = ["--clock", "sim", "--hardware", "dgx-h100"]
    for P in (4, 5):
        args = moe_args(P)
        run = train_json(
            P, [*args, "--dp", str(P), "--ep", str(P), "--alltoall", "bruck", *sim], tmp_path, f"b{P}"
        )
        assert_same_model(run, serial(args), rtol=1e-12)
        assert run["config"]["alltoall"] == run["moe"]["alltoall"] == "bruck"
        assert run["prediction_mismatches"] == []
        for d, rank in enumerate(run["comm"]["ranks"]):
            for op, rows in expected_ops(run["moe"], P, P, d).items():
                entry, predicted = rank["by_op"][f"activation/{op}"], run["predicted"]["comm"]["ranks"][d]
                assert entry["sent"] == rows * 128 * 8, (P, d, op)
                assert entry["messages"] == math.ceil(math.log2(P)) * 2 * 4  # 2 MoE layers x 4 steps
                assert predicted["by_op"][f"activation/{op}"] == {
                    "sent": entry["sent"],
                    "messages": entry["messages"],
                }
        # the simulated clock charges each of the ceil(log2 P) messages alpha + bytes x beta, as the cost
        # model does: the step agrees closely; the pairwise exchange, predicted on the same routing,
        # takes longer here: at 2-32 KiB per piece an NVLink message is mostly its latency
        simulated, predicted = run["time"]["sim"]["step_s"], run["predicted"]["time"]["step_s"]
        assert abs(predicted - simulated) <= 0.02 * simulated, (P, predicted, simulated)
        cfg = replace(RunConfig(**run["config"]), alltoall="pairwise")
        pairwise = predict_from_config(cfg, P, 4, load("dgx-h100"), run["moe"])["time"]["step_s"]
        assert pairwise > 1.15 * simulated, (P, pairwise, simulated)


def test_alltoall_option_is_checked_and_planned(capsys):
    from simpar.cli.bench import alltoall_args
    from simpar.cli.plan import plan_main
    from simpar.config import RunConfig, SimparError, validate

    for fields, message in (
        (
            dict(alltoall="ring", experts=4, ep=2, dp=2),
            "unknown alltoall 'ring' \\(choose from pairwise, bruck\\)",
        ),
        (dict(alltoall="bruck", experts=4, dp=2), "--alltoall bruck picks expert parallelism's all-to-all"),
        (dict(alltoall="bruck"), "add --experts E --ep P"),
    ):
        with pytest.raises(SimparError, match=message):
            validate(RunConfig(**fields), fields.get("dp", 1))
    for argv, message in (
        (["--sizes", "12"], "not a positive multiple of 8"),
        (["--iters", "0"], "at least 1"),
    ):
        with pytest.raises(SimparError, match=message):
            alltoall_args(argv)
    res = run_mpi(0, ["train", "--alltoall", "bruck", "--steps", "1", "--quiet"], timeout=60)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("simpar: error: --alltoall bruck")
    # plan: balanced routing, dp 4 x ep 4, 64 rows: each piece (B/D) K / P = 8 rows of 128 fp32; Bruck
    # sends popcount(1) + popcount(2) + popcount(3) = 4 pieces per rank and layer, in 2 messages
    plan_main(["--batch", "64", "--dp", "4", "--experts", "4", "--ep", "4", "--alltoall", "bruck", "--json"])
    rank = json.loads(capsys.readouterr().out)["comm"]["ranks"][1]
    for op in ("ep-dispatch", "ep-combine", "ep-combine-grad", "ep-dispatch-grad"):
        assert rank["by_op"][f"activation/{op}"] == {"sent": 4 * 8 * 128 * 4 * 2, "messages": 2 * 2}
