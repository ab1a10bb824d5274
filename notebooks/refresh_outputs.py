"""Run every lesson and store its outputs in the notebook, so that a reader can see the figures and the
printed numbers without running anything (GitHub and JupyterLab show stored outputs).

    python notebooks/refresh_outputs.py                  # every lesson (a few minutes on 2 cores)
    python notebooks/refresh_outputs.py 04 09            # only the lessons whose names start so

Outputs are kept small: figures at 72 dpi, and the temporary folders the lessons create are written as
<tmp> (they would otherwise name a path on this machine). Each notebook's metadata records a hash of its
code cells (`simpar.code_sha256`); tests/unit/test_notebooks_meta.py fails when a code cell has changed since
the outputs were stored, so stale outputs cannot ship. The numbers are one run on the machine that ran
this script: measured times differ from machine to machine, bytes and losses do not.
"""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
# Temporary folders (tempfile.mkdtemp) as they appear in printed output: /tmp/simpar-07-abc123/...
TMP = re.compile(r"(?:/private)?/(?:tmp|var/folders/[\w/]+?/T)/[\w.-]+")
SETUP = "import matplotlib as _mpl\n_mpl.rcParams['figure.dpi'] = 72\n_mpl.rcParams['savefig.dpi'] = 72\n"


def code_sha256(nb) -> str:
    """The hash the metadata records: every code cell's source, in order."""
    text = "\n\0\n".join(c.source for c in nb.cells if c.cell_type == "code")
    return hashlib.sha256(text.encode()).hexdigest()


def scrub(nb) -> None:
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if "text" in out:
                out["text"] = TMP.sub("<tmp>", out["text"])
            for key, value in out.get("data", {}).items():
                if key.startswith("text/") and isinstance(value, str):
                    out["data"][key] = TMP.sub("<tmp>", value)
            out.get("metadata", {}).pop("needs_background", None)


def refresh(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nb.nbformat_minor = max(nb.nbformat_minor, 5)
    for i, cell in enumerate(nb.cells):  # stable ids (nbformat 4.5 wants one per cell), not random ones
        cell["id"] = cell.get("id") or f"cell-{i}"
    setup = nbformat.v4.new_code_cell(SETUP)
    setup["id"] = "refresh-setup"
    nb.cells.insert(0, setup)  # run first, removed before saving
    resources = {"metadata": {"path": str(HERE)}}
    client = NotebookClient(nb, timeout=600, kernel_name="python3", resources=resources)
    client.execute()
    nb.cells.pop(0)
    count = 0
    for cell in nb.cells:
        if cell.cell_type == "code":
            count += 1
            cell.execution_count = count
            for out in cell.outputs:
                if "execution_count" in out:
                    out["execution_count"] = count
            cell.outputs = [o for o in cell.outputs if not (o.output_type == "stream" and o.name == "stderr")]
    scrub(nb)
    nb.metadata.setdefault("simpar", {})["code_sha256"] = code_sha256(nb)
    nbformat.write(nb, path)
    print(f"{path.name}: {path.stat().st_size / 1024:.0f} KiB", flush=True)


def main(prefixes: list[str]) -> None:
    for path in sorted(HERE.glob("[0-9][0-9]_*.ipynb")):
        if not prefixes or any(path.name.startswith(p) for p in prefixes):
            refresh(path)


if __name__ == "__main__":
    main(sys.argv[1:])
