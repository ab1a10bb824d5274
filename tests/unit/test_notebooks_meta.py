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
    "18_context_parallelism",
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


TAKEAWAY = re.compile(r"^#{1,6}\s*Takeaway\b", re.MULTILINE)
COMMAND = re.compile(r"`[^`]*(?:simpar|mpiexec|python)[^`]*`")
ASK = "write your prediction above"  # simpar/report/predict.py's ASK, as the stored output shows it


@pytest.mark.parametrize("name", NAMES)
def test_ends_with_a_takeaway(name):
    """The last cell says what to remember (three to five sentences or points) and one command to try next."""
    last = load(name)["cells"][-1]
    text = source(last)
    assert last["cell_type"] == "markdown" and TAKEAWAY.search(text), f"{name}: the last cell is no Takeaway"
    body = TAKEAWAY.sub("", text)
    points = len(re.findall(r"^\s*[*-] ", body, re.MULTILINE)) or len(re.findall(r"[.!?](?:\s|$)", body))
    assert 3 <= points <= 6, f"{name}: the takeaway has {points} points (3-5 plus the command)"
    assert COMMAND.search(body), f"{name}: the takeaway names no command to try next"


def exercises(cells: list[dict]):
    """(heading index, the cells up to the next exercise heading or the takeaway) for each exercise."""
    heads = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown" and EXERCISE.search(source(c))]
    ends = heads[1:] + [next((i for i, c in enumerate(cells) if TAKEAWAY.search(source(c))), len(cells))]
    return [(h, cells[h + 1 : e]) for h, e in zip(heads, ends)]


@pytest.mark.parametrize("name", NAMES)
def test_exercises_ask_for_a_prediction_first(name):
    """Each exercise has a cell where the learner writes `my_prediction` (None as shipped), ABOVE a check cell
    that calls reveal(my_prediction, ...); stored from a Run All, the check shows the request for a
    prediction, not the answer."""
    cells = load(name)["cells"]
    found = exercises(cells)
    assert found, f"{name}: no exercise"
    for head, body in found:
        code = [c for c in body if c["cell_type"] == "code"]
        setters = [i for i, c in enumerate(code) if re.search(r"^my_prediction = None\b", source(c), re.M)]
        checks = [i for i, c in enumerate(code) if "reveal(my_prediction" in source(c)]
        where = f"{name} exercise at cell {head}"
        assert setters and checks, f"{where}: no my_prediction cell or no reveal() check"
        assert setters[0] < checks[0], f"{where}: the prediction comes after the check"
        shown = output_text(code[checks[0]])
        assert ASK in shown, f"{where}: the stored check does not ask for a prediction"
