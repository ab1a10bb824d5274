"""The test tree's own rules: every test file sits in a tier (tests/unit: in-process; tests/mpi: real
MPI runs), in the folder of the package it tests, and each folder is a package (so two tiers may hold
files of one name, e.g. unit/run/test_checkpoint.py and mpi/run/test_checkpoint.py)."""

from __future__ import annotations

from tests.paths import ROOT

TESTS = ROOT / "tests"
# the repository's packages, and the tier root for simpar's top-level modules (errors, layers)
PACKAGES = {"kernels", "benchmarks"} | {p.name for p in (ROOT / "simpar").iterdir() if p.is_dir()}


def test_no_test_file_outside_the_tiers():
    """A flat tests/test_*.py would run under `python -m pytest` but in neither of CI's tiers."""
    assert sorted(p.name for p in TESTS.glob("test_*.py")) == []


def test_each_tier_mirrors_the_packages():
    for tier in ("unit", "mpi"):
        for folder in (TESTS / tier).rglob("*"):
            if not folder.is_dir() or folder.name == "__pycache__":
                continue
            top = folder.relative_to(TESTS / tier).parts[0]
            if tier == "mpi" and top == "scripts":  # the programs MPI tests launch (tests/paths.py says why)
                continue
            assert top in PACKAGES, f"tests/{tier}/{top}/ mirrors no package of the repository"
            nested = folder.relative_to(TESTS / tier)
            if top not in ("kernels", "benchmarks"):
                assert (ROOT / "simpar" / nested).is_dir(), f"tests/{tier}/{nested}/: no simpar/{nested}/"
            assert (folder / "__init__.py").is_file(), f"tests/{tier}/{nested}/ needs an __init__.py"
