"""The lessons in notebooks/: all nine present, stored without outputs, portable, each with a plot
and an exercise. (Running them is the job of `pytest --nbmake notebooks/`.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NAMES = (
    "00_start_here",
    "01_data_parallel",
    "02_collectives",
    "03_tensor_parallel",
    "04_pipeline_parallel",
    "05_zero_and_memory",
    "06_hybrid_and_planning",
    "07_debugging",
    "08_overhead_and_speedup",
    "10_experts_and_all_to_all",
)

# A path that only exists on someone's machine: /home/..., /Users/..., /tmp/..., C:\...
ABSOLUTE = re.compile(
    r"(?<![\w.~/-])/(?:home|Users|tmp|work|root|mnt|opt|var|usr|private|scratch)/"
    r"|\b[A-Za-z]:\\\\"
)
PLOT = re.compile(
    r"\bplt\.|\.(?:plot|bar|barh|loglog|semilogy|semilogx|imshow|scatter|broken_barh)\(|plot_timeline\("
)
EXERCISE = re.compile(r"^#{1,6}\s*Exercise\b", re.MULTILINE)


def load(name: str) -> dict:
    with open(NOTEBOOKS / f"{name}.ipynb", encoding="utf-8") as f:
        return json.load(f)


def source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def test_all_lessons_exist():
    missing = [n for n in NAMES if not (NOTEBOOKS / f"{n}.ipynb").is_file()]
    assert not missing, f"missing notebooks: {missing}"


@pytest.mark.parametrize("name", NAMES)
def test_no_outputs_stored(name):
    for i, cell in enumerate(load(name)["cells"]):
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [], f"{name} cell {i} has stored outputs"
            assert cell.get("execution_count") is None, f"{name} cell {i} has an execution count"


@pytest.mark.parametrize("name", NAMES)
def test_no_absolute_paths(name):
    for i, cell in enumerate(load(name)["cells"]):
        hit = ABSOLUTE.search(source(cell))
        assert hit is None, f"{name} cell {i} names an absolute path: {hit.group(0)!r}"


@pytest.mark.parametrize("name", NAMES)
def test_has_a_plot_and_an_exercise(name):
    cells = load(name)["cells"]
    code = "\n".join(source(c) for c in cells if c["cell_type"] == "code")
    markdown = "\n".join(source(c) for c in cells if c["cell_type"] == "markdown")
    assert PLOT.search(code), f"{name} draws no plot"
    assert EXERCISE.search(markdown), f"{name} has no 'Exercise' heading"


@pytest.mark.parametrize("name", NAMES)
def test_uses_a_python3_kernel(name):
    assert load(name)["metadata"]["kernelspec"]["name"] == "python3"
