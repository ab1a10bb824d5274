"""Collectives: right sums, and exactly the bytes and messages their docstrings derive.

One mpiexec launch per world size p = 1..8 runs every case (mpi_collectives_check.py, beside it) and
prints a JSON report; the tests below judge it. The formulas here are written out from the
docstrings of simpar/collectives/ (one file per algorithm), independently of the code
that sends, so a change to either side that breaks the ledger-vs-formula promise shows up.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from tests.mpiutil import run_script
from tests.unit.collectives.test_collectives import allreduce_formula, c, tree_children

SCRIPT = Path(__file__).with_name("mpi_collectives_check.py")
WORLD_SIZES = range(1, 9)
ALGORITHMS = ("ring", "rabenseifner", "tree", "ps", "mpi", "auto")  # auto: the ring's messages
TOLERANCE = {"float64": 1e-12, "float32": 1e-5}  # relative to the sum of |inputs|


def allreduce_reduced(alg: str, n: int, p: int, r: int) -> int:
    """Elements rank r adds up through the reduce kernel (the gamma term of the alpha-beta model)."""
    alg = "ring" if alg == "auto" else alg
    if p == 1 or alg == "mpi":  # MPI reduces inside the library, out of simpar's sight
        return 0
    if alg == "ring":  # every chunk it receives in the reduce-scatter
        return n - c(n, p, r - 1)
    if alg == "tree":  # each child's whole buffer
        return tree_children(p, r) * n
    if alg == "ps":
        return (p - 1) * n if r == 0 else 0
    q = 1 << (p.bit_length() - 1)
    e, L = p - q, q.bit_length() - 1
    if r < 2 * e and r % 2:
        return 0
    m = r // 2 if r < 2 * e else r - e
    blocks = [c(n, q, i) for i in range(q)]
    halves = sum(sum(blocks[(m >> k << k) : (m >> k << k) + 2**k]) for k in range(L))  # the kept halves
    return halves + (n if r < 2 * e else 0)


def allreduce_total_messages(alg: str, p: int) -> int:
    alg = "ring" if alg == "auto" else alg
    if p == 1:
        return 0
    q = 1 << (p.bit_length() - 1)
    return {
        "ring": 2 * p * (p - 1),
        "mpi": 2 * p * (p - 1),
        "tree": 2 * (p - 1),
        "ps": 2 * (p - 1),
        "rabenseifner": 2 * (q.bit_length() - 1) * q + 2 * (p - q),
    }[alg]


def other_formula(kind: str, n: int, p: int, r: int, root: int = 0) -> tuple[int, int, int]:
    if p == 1:
        return 0, 0, 0
    if kind == "reduce-scatter":
        return n - c(n, p, r), n - c(n, p, r - 1), p - 1
    if kind == "all-gather":
        return n - c(n, p, r + 1), n - c(n, p, r), p - 1
    assert kind == "broadcast"
    me = (r - root) % p
    sends = sum(1 for k in range(p.bit_length()) if 2**k > me and me + 2**k < p)
    return sends * n, (me != 0) * n, sends


# -- one launch per world size --------------------------------------------------------------------


@lru_cache(maxsize=None)
def report(p: int) -> dict:
    res = run_script(p, SCRIPT, timeout=120)
    assert res.returncode == 0, f"p={p}: exit {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("REPORT "))
    return json.loads(line[len("REPORT ") :])


def ledger_in_elements(case: dict) -> list[tuple[int, int, int]]:
    bpe = np.dtype(case["dtype"]).itemsize
    for b in case["sent"] + case["received"]:
        assert b % bpe == 0
    return [(s // bpe, v // bpe, m) for s, v, m in zip(case["sent"], case["received"], case["messages"])]


@pytest.mark.parametrize("p", WORLD_SIZES)
def test_allreduce_sums_and_ledger(p):
    cases = [cs for cs in report(p)["cases"] if cs["kind"] == "allreduce"]
    assert {cs["alg"] for cs in cases} == set(ALGORITHMS)
    for cs in cases:
        alg, n, where = cs["alg"], cs["n"], f"{cs['alg']} p={p} N={cs['n']} {cs['dtype']}"
        assert max(cs["err"]) <= TOLERANCE[cs["dtype"]], where
        if alg != "mpi":  # simpar's algorithms reduce each element once: replicas agree bitwise
            assert len(set(cs["digest"])) == 1, where
        got = ledger_in_elements(cs)
        want = [allreduce_formula(alg, n, p, r) for r in range(p)]
        assert got == want, f"{where}: ledger {got} != formula {want}"
        assert cs["reduced"] == [allreduce_reduced(alg, n, p, r) for r in range(p)], where
        assert sum(s for s, _, _ in got) == sum(v for _, v, _ in got) == 2 * (p - 1) * n, where
        assert sum(m for _, _, m in got) == allreduce_total_messages(alg, p), where
        if alg in ("ring", "mpi"):  # within a few elements of the textbook 2(p-1)/p N
            assert all(abs(s - 2 * (p - 1) / p * n) <= 2 for s, _, _ in got), where
        assert cs["modeled"] == (["model/allreduce"] if alg == "mpi" and p > 1 else []), where


@pytest.mark.parametrize("p", WORLD_SIZES)
def test_reduce_scatter_allgather_broadcast(p):
    cases = [cs for cs in report(p)["cases"] if cs["kind"] != "allreduce" and cs["kind"] != "concurrent"]
    assert {cs["kind"] for cs in cases} == {"reduce-scatter", "all-gather", "broadcast"}
    for cs in cases:
        kind, n, where = (
            cs["kind"],
            cs["n"],
            f"{cs['kind']} p={p} N={cs['n']} {cs['dtype']} root={cs.get('root')}",
        )
        if kind == "reduce-scatter":
            assert max(cs["err"]) <= TOLERANCE[cs["dtype"]], where
        else:
            assert all(cs["exact"]), where
        got = ledger_in_elements(cs)
        assert got == [other_formula(kind, n, p, r, cs.get("root", 0)) for r in range(p)], f"{where}: {got}"
        reduced = [n - c(n, p, r - 1) if kind == "reduce-scatter" and p > 1 else 0 for r in range(p)]
        assert cs["reduced"] == reduced, where
        total = sum(v for _, v, _ in got)
        assert total == sum(s for s, _, _ in got) == (p - 1) * n, where


@pytest.mark.parametrize("p", [2, 3, 5, 8])
def test_two_allreduces_in_flight(p):
    cases = [cs for cs in report(p)["cases"] if cs["kind"] == "concurrent"]
    assert {cs["alg"] for cs in cases} == set(ALGORITHMS)
    for cs in cases:
        assert max(cs["err"]) <= TOLERANCE["float32"], cs["alg"]


def test_bench_runs_on_two_ranks():
    code = (
        "from simpar.cli.bench import allreduce_main as main; "
        "main(['--sizes', '4K,64K', '--algorithms', 'ring,rabenseifner,tree,ps', '--iters', '2', '--json'])"
    )
    res = run_script(2, "-c", [code], timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    assert out["ranks"] == 2
    assert [(r["size"], r["algorithm"]) for r in out["rows"]] == [
        (s, a) for s in (4096, 65536) for a in ("mpi", "ring", "rabenseifner", "tree", "ps")
    ]
    for row in out["rows"]:
        assert row["count"] == row["size"] // 4 and row["time_us"] > 0
        assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"])  # 2(p-1)/p = 1 on two ranks
        # the memory roofline: 7(p-1)/p bytes touched per byte reduced, at the bandwidth measured then
        assert row["stream_GBps"] > 0 and row["iters"] == 2
        assert row["roofline_us"] == pytest.approx(7 / 2 * row["size"] / (row["stream_GBps"] * 1e9) * 1e6)
        assert row["of_roofline"] == pytest.approx(row["roofline_us"] / row["time_us"])
