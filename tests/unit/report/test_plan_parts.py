"""`simpar plan`'s step time in parts that add up, --sp offered with --pp, the MoE header's parameters.

All in-process (no MPI): the cost model only. The step is cut into the parts of ONE rank's timeline (the
rank that finishes last): compute + tp + exposed pp sends + exposed dp/ZeRO + data + bubble. The test
adds the parts up itself and compares with the step, for layouts where each part matters.
"""

from __future__ import annotations

import io
import re
from contextlib import redirect_stdout

import pytest

from simpar import costmodel as cm
from simpar.cli.plan import plan_main, standin_widths
from simpar.costmodel import hardware
from simpar.units import fmt_time

MLP = [256, 1024, 1024, 1024, 1024, 10]
RESMLP = [64, 128, 128, 128, 128, 10]
PART_KEYS = ("compute", "tp", "pp", "dp", "data", "bubble")


def run_plan(*argv) -> str:
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert plan_main([str(a) for a in argv]) == 0
    return buf.getvalue()


LAYOUTS = {
    "pp4-gpipe": dict(widths=MLP, pp=4, schedule="gpipe", microbatches=4),
    "pp4-1f1b": dict(widths=MLP, pp=4, schedule="1f1b", microbatches=8),
    "pp2-zb-h1": dict(widths=MLP, pp=2, schedule="zb-h1", microbatches=4),
    "dp2xpp2": dict(widths=MLP, dp=2, pp=2, microbatches=4),
    "dp2xtp2": dict(widths=MLP, dp=2, tp=2),
    "tp4": dict(widths=MLP, tp=4),
    "pp2-interleaved-accum": dict(
        widths=MLP, pp=2, schedule="interleaved", virtual_stages=2, microbatches=4, grad_accum=2
    ),
    "pp2-zb-v": dict(widths=MLP, pp=2, schedule="zb-v", microbatches=4),
    "tp2xpp2-recompute": dict(widths=MLP, tp=2, pp=2, microbatches=4, recompute="full"),
    "dp2-no-overlap": dict(widths=MLP, dp=2, overlap=False),
    "dp4xzero3": dict(widths=MLP, dp=4, zero=3),
    "dp2-root-data": dict(widths=MLP, dp=2, pp=2, microbatches=2, data_source="root"),
    "resmlp-tp2-sp-pp2": dict(widths=RESMLP, arch="resmlp", tp=2, sp=True, pp=2, microbatches=4),
}


@pytest.mark.parametrize("name", LAYOUTS)
def test_the_critical_ranks_parts_add_up_to_the_step(name):
    spec = cm.Spec(batch=512, precision="fp64", **LAYOUTS[name])
    pred = cm.predict(spec, hardware.load("dgx-h100"))
    t, crit = pred["time"], pred["time"]["critical"]
    parts = crit["parts_s"]
    assert set(parts) == set(PART_KEYS) and min(parts.values()) >= 0
    total = sum(parts[k] for k in PART_KEYS)
    assert total == pytest.approx(t["step_s"], rel=1e-9)
    # the rank is one of the critical stage's: stage = rank // (dp * tp)
    assert crit["rank"] // (spec.dp * spec.tp) == crit["stage"]
    # parts a layout cannot have are zero
    if spec.pp == 1:
        assert parts["bubble"] == parts["pp"] == 0
    if spec.tp == 1:
        assert parts["tp"] == 0
    if spec.dp == 1:
        assert parts["dp"] == 0
    if spec.data_source == "root":
        assert parts["data"] > 0
    assert t["bubble_s"] == parts["bubble"]
    # a second path to the same seconds: the rank's tensor-parallel collectives all block, and so do
    # ZeRO's, so those parts equal the rank's op totals (priced op by op from its ledger prediction)
    ops = next(r for r in pred["comm"]["ranks"] if r["rank"] == crit["rank"])["time_s"]
    assert parts["tp"] == pytest.approx(ops["tp"], rel=1e-9)
    if spec.zero:  # the critical rank's time in ZeRO's rings (costmodel/zero_time.py follows every rank:
        # a round waits for a neighbour's chunk, one element longer where dp does not divide a unit)
        assert parts["dp"] == pytest.approx(ops["dp"], rel=1e-5)
    # the printed sum names the same parts, and the step after "="
    text = run_plan(*_argv(LAYOUTS[name]), "--hardware", "dgx-h100")
    line = next(x for x in text.splitlines() if x.startswith("time per step on dgx-h100"))
    assert f"(rank {crit['rank']}" in line
    names = {"compute": "compute", "tp": "tp", "pp": "pp sends exposed", "dp": "dp/zero exposed"}
    names.update(data="data", bubble="bubble")
    for k in PART_KEYS:
        shown = f"{names[k]} {fmt_time(parts[k])}" in line
        assert shown == (parts[k] > 0 or k == "compute"), (k, line)
    assert f"  = {fmt_time(t['step_s'])} per step" in text


def _argv(layout: dict) -> list:
    out = ["--batch", 512, "--precision", "fp64", "--layers", ",".join(map(str, layout["widths"]))]
    for k, v in layout.items():
        if k == "widths":
            continue
        flag = "--" + k.replace("_", "-")
        out += [flag] if v is True else ["--no-" + k] if v is False else [flag, v]
    return out


def test_compare_ranks_sp_with_pp_and_every_winner_breakdown_adds_up():
    # --sp with --pp: the comparison is printed, and --compare offers tp-sp x pp layouts
    out = run_plan(
        "--arch", "resmlp", "--layers", "64,128,128,128,128,10", "--tp", 2, "--pp", 2, "--sp",
        "--microbatches", 4, "--batch", 64,
    )  # fmt: skip
    assert "sequence parallelism (--sp" in out and "a stage boundary carries 1/2 of the rows" in out
    spec = cm.Spec(widths=RESMLP, batch=64, microbatches=4, arch="resmlp")
    hw = hardware.load("dgx-h100")
    ranked, _ = cm.compare.rank_layouts(spec, hw, 8, None)
    layouts = {p["layout"] for p in ranked}
    assert {"tp2-spxpp4-1f1b", "dp2xtp2-spxpp2-1f1b", "tp4-spxpp2-1f1b", "tp2xpp4-1f1b"} <= layouts
    for p in ranked:  # every candidate's parts add up (the table's columns and the winner's shares)
        assert sum(p["time"]["critical"]["parts_s"].values()) == pytest.approx(p["time"]["step_s"], rel=1e-9)
    # the winner's printed shares: whole percents of parts that add up to the step
    text = run_plan(
        "--arch", "resmlp", "--layers", "64,1024,1024,1024,1024,1024,1024,10", "--batch", 256,
        "--compare", "--world", 8, "--hardware", "dgx-h100",
    )  # fmt: skip
    winner = next(x for x in text.splitlines() if x.startswith("winner:"))
    shares = [int(s) for s in re.findall(r"\((\d+)%\)", winner)]
    assert len(shares) >= 2 and abs(sum(shares) - 100) <= len(shares) / 2, winner


def test_moe_header_counts_every_expert():
    # the README's layers 1 and 2 of 64,128,128,128,10 become E = 4 experts (ep 2: 2 per rank)
    widths, E, P = [64, 128, 128, 128, 10], 4, 2
    sizes = [a * b + b for a, b in zip(widths[:-1], widths[1:])]
    routers = sum(widths[i] * E for i in (1, 2))  # Wr: d_in x E, no bias
    non_expert = sizes[0] + sizes[-1] + routers
    per_expert = sizes[1] + sizes[2]
    out = run_plan("--layers", "64,128,128,128,10", "--experts", E, "--dp", 4, "--ep", P, "--batch", 64)
    assert (
        f"parameters: {non_expert + E * per_expert:,} in all = {non_expert:,} non-expert "
        f"(first and last layer, routers) + {E} experts x {per_expert:,}" in out
    )
    assert f"per rank {non_expert + E // P * per_expert:,} (non-expert + {E // P} experts)" in out
    assert "--params sized" not in out
    # --params sizes the dense model; every hidden layer then becomes E experts: about E times as big
    widths = standin_widths(7_000_000_000)
    sizes = [a * b + b for a, b in zip(widths[:-1], widths[1:])]
    E = 8
    total = sizes[0] + sizes[-1] + sum(widths[1:-2]) * E + E * sum(sizes[1:-1])
    out = run_plan("--params", "7B", "--batch", 1024, "--dp", 8, "--experts", E, "--top-k", 2, "--ep", 4)
    assert f"parameters: {total / 1e9:,.2f} B in all" in out
    assert f"--params sized the dense MLP ({sum(sizes) / 1e9:,.2f} B)" in out
