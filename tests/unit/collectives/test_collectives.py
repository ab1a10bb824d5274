"""Collectives in-process: the chunk rule, the byte formulas, and the Pending rounds.

The tests that launch real MPI jobs: tests/mpi/collectives/test_collectives.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import split_sizes

# -- the formulas (elements sent, elements received, messages) of rank r --------------------------


def c(n: int, p: int, i: int) -> int:
    """Size of chunk i (mod p) of np.array_split(n, p)."""
    return split_sizes(n, p)[i % p]


def tree_children(p: int, r: int) -> int:
    return sum(1 for k in range(p.bit_length()) if 2**k > r and r + 2**k < p)


def allreduce_formula(alg: str, n: int, p: int, r: int) -> tuple[int, int, int]:
    alg = "ring" if alg == "auto" else alg  # --collectives auto moves the ring's bytes
    if p == 1:
        return 0, 0, 0
    if alg in ("ring", "mpi"):  # mpi books the ring's volume (modeled)
        return 2 * n - c(n, p, r) - c(n, p, r + 1), 2 * n - c(n, p, r - 1) - c(n, p, r), 2 * (p - 1)
    if alg == "tree":
        k = (r != 0) + tree_children(p, r)
        return k * n, k * n, k
    if alg == "ps":
        return ((p - 1) * n, (p - 1) * n, p - 1) if r == 0 else (n, n, 1)
    assert alg == "rabenseifner"
    q = 1 << (p.bit_length() - 1)
    e, L = p - q, q.bit_length() - 1
    if r < 2 * e and r % 2:
        return n, n, 1
    m = r // 2 if r < 2 * e else r - e
    blocks = [c(n, q, i) for i in range(q)]
    gathered = sum(sum(blocks[(m >> k << k) : (m >> k << k) + 2**k]) for k in range(L))
    core = n - blocks[m] + gathered
    fold = n if r < 2 * e else 0
    return core + fold, core + fold, 2 * L + (r < 2 * e)


def test_chunk_formula_is_numpys_array_split():
    """The formulas below cut chunks by split_sizes; it must be np.array_split's rule, which the
    collectives promise (checked against NumPy itself, not against simpar's chunk_bounds)."""
    for n in range(0, 40):
        for p in range(1, 9):
            assert split_sizes(n, p) == [len(a) for a in np.array_split(np.arange(n), p)], (n, p)


def test_formulas_match_textbook_when_p_divides_n():
    """With q = p a power of two dividing N, Rabenseifner sends 2(p-1)/p N like the ring."""
    for p in (2, 4, 8):
        for r in range(p):
            assert allreduce_formula("rabenseifner", 64, p, r)[0] == 2 * (p - 1) * 64 // p
            assert allreduce_formula("ring", 64, p, r)[0] == 2 * (p - 1) * 64 // p


def test_pending_copes_with_empty_rounds():
    from simpar.collectives import Pending

    def nothing():
        return
        yield

    def one_empty_round():
        yield []

    for gen in (nothing(), one_empty_round()):
        pending = Pending(gen)
        pending.progress()
        pending.wait()
        assert pending.done


# -- the benchmark ------------------------------------------------------------------------------------


def test_bench_parses_sizes_and_rejects_bad_input():
    from simpar.cli.bench import allreduce_args as parse_args
    from simpar.config import SimparError
    from simpar.units import parse_buffer_size as parse_size

    assert [parse_size(s) for s in ("4096", "1K", "64M", "2g", "1KiB")] == [
        4096,
        1024,
        64 * 2**20,
        2 * 2**30,
        1024,
    ]
    args = parse_args(["--sizes", "1K,4M", "--algorithms", "tree,ring,mpi,tree"])
    assert args.sizes == [1024, 4 * 2**20] and args.algorithms == ["mpi", "tree", "ring"]
    for bad in (
        ["--sizes", "12Q"],
        ["--sizes", "0"],
        ["--sizes", ","],
        ["--algorithms", "butterfly"],
        ["--dtype", "int8"],
        ["--iters", "0"],
        ["--sizes", "6", "--dtype", "float32"],
        ["--bogus"],
    ):
        with pytest.raises(SimparError):
            parse_args(bad)
