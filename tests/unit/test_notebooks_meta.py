"""The lessons in notebooks/: every one present, stored WITH fresh outputs (so they can be read without
running them; notebooks/refresh_outputs.py makes them), portable, each with a plot and an exercise.
(Running them is the job of `pytest --nbmake notebooks/`.)"""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from tests.paths import ROOT

NOTEBOOKS = ROOT / "notebooks"
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
    "09_mixed_precision",
    "10_experts_and_all_to_all",
    "11_sequence_parallel",
    "12_checkpoints_and_recovery",
    "13_the_wall_clock",
    "14_how_true_is_the_simulated_cluster",
    "15_the_roofline",
    "16_from_mlp_to_gpt",
    "17_traces_and_the_articles_code",
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


def code_sha256(nb: dict) -> str:
    """What notebooks/refresh_outputs.py records: a hash of every code cell's source, in order."""
    text = "\n\0\n".join(source(c) for c in nb["cells"] if c["cell_type"] == "code")
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize("name", NAMES)
def test_outputs_are_stored_and_fresh(name):
    """Readers see each lesson's figures without running it: the outputs are stored, every code cell ran
    (in order, without an error), and no code cell changed after the outputs were made."""
    nb = load(name)
    recorded = nb["metadata"].get("simpar", {}).get("code_sha256")
    assert recorded == code_sha256(nb), (
        f"{name}: stored outputs are missing or stale; run python notebooks/refresh_outputs.py {name[:2]}"
    )
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert [c.get("execution_count") for c in code] == list(range(1, len(code) + 1)), (
        f"{name}: cells not run in order"
    )
    errors = [
        i for i, c in enumerate(nb["cells"]) for o in c.get("outputs", []) if o["output_type"] == "error"
    ]
    assert not errors, f"{name}: cells {errors} stored an error"
    figures = sum("image/png" in o.get("data", {}) for c in code for o in c["outputs"])
    assert figures >= 1, f"{name}: no figure stored"


def output_text(cell: dict) -> str:
    parts = []
    for o in cell.get("outputs", []):
        text = o.get("text", "")
        parts.append("".join(text) if isinstance(text, list) else text)
        plain = o.get("data", {}).get("text/plain", "")
        parts.append("".join(plain) if isinstance(plain, list) else plain)
    return "\n".join(parts)


@pytest.mark.parametrize("name", NAMES)
def test_no_absolute_paths(name):
    for i, cell in enumerate(load(name)["cells"]):
        for text in (source(cell), output_text(cell)):
            hit = ABSOLUTE.search(text)
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
