"""The architecture rule of docs/design.md: imports only go down.

No import cycle among simpar's and kernels' modules (function-local imports counted), nothing in
kernels/ imports simpar, and the cost model never imports the code that moves bytes or schedules
work (collectives/, parallel/). Read from the source with `ast`, so no module is executed.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.paths import ROOT


def _modules() -> dict[str, Path]:
    mods = {}
    for top in ("simpar", "kernels"):
        for path in (ROOT / top).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            mods[name.removesuffix(".__init__")] = path
    return mods


def _resolve(name: str, mods) -> str | None:
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    graph = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(parts + ([node.module] if node.module else []))
                # `from pkg import sub` imports pkg.sub; `from pkg import name` imports pkg itself
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for t in targets:
                r = _resolve(t, mods)
                if r and r != mod:
                    graph[mod].add(r)
    return graph


def _cycles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def test_kernels_import_nothing_from_simpar():
    bad = [
        (m, t) for m, ts in _graph().items() if m.startswith("kernels") for t in ts if t.startswith("simpar")
    ]
    assert bad == []


def test_cost_model_is_independent_of_the_execution_code():
    bad = [
        (m, t)
        for m, ts in _graph().items()
        if m.startswith("simpar.costmodel")
        for t in ts
        if t.startswith(("simpar.collectives", "simpar.parallel", "simpar.runtime.comm", "simpar.run.loop"))
    ]
    assert bad == []


def test_the_checker_sees_a_cycle():
    # The check itself must be able to fail.
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]


def _imports_of(prefix: str, forbidden: tuple) -> list:
    return sorted(
        (m, t)
        for m, ts in _graph().items()
        if m == prefix or m.startswith(prefix + ".")
        for t in ts
        if any(t == f or t.startswith(f + ".") for f in forbidden)
    )


def test_the_two_witnesses_share_no_code():
    """The cost model (the closed form) and the runtime (the simulated clock that runs the real job)
    are two witnesses of one step time: neither may import the other's half, or one mistake moves
    both (issue 21: a wrong dp stride in the shared group table moved both by 3.6x, unnoticed)."""
    runtime_side = ("simpar.runtime", "simpar.model", "simpar.parallel", "simpar.collectives", "kernels")
    assert _imports_of("simpar.costmodel", runtime_side) == []
    assert _imports_of("simpar.runtime", ("simpar.costmodel",)) == []
