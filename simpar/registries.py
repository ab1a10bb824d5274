"""The names the command line offers, the code that runs them and the cost model that predicts them
must be the same lists. Each side keeps its own (the config may not import the execution code, the
cost model may import neither), so this module, which may import all three, holds them together:

    collectives   config.COLLECTIVES  = collectives.ALLREDUCE_ALGORITHMS = costmodel ALLREDUCE
    all-to-alls   config.ALLTOALLS    = collectives ALLTOALL_ALGORITHMS  = costmodel ALLTOALL
    schedules     config.SCHEDULES    = parallel.pipeline SCHEDULES      = costmodel.order.SCHEDULES
    kernels       config.KERNELS - auto = kernels.available()            = costmodel.passes.BACKENDS
    hardware      the --hardware help  = costmodel.hardware.PRESETS + local

A name missing on one side used to train a whole run and then fail in the post-run prediction
(KeyError); run/setup.py calls `check()` when it is imported, so such a mismatch stops every run
before its first step, and tests/unit/test_registries.py fails on it.
"""

from __future__ import annotations


def registries() -> dict:
    """kind -> {side: the set of names that side knows}."""
    import kernels

    from . import collectives
    from .collectives.alltoall import ALLTOALL_ALGORITHMS
    from .config import core
    from .costmodel import collectives as cost_collectives
    from .costmodel import hardware, order, passes
    from .parallel.pipeline.schedules import SCHEDULES

    return {
        "collectives": {
            "config": set(core.COLLECTIVES),
            "execution": set(collectives.ALLREDUCE_ALGORITHMS),
            "cost model": set(cost_collectives.ALLREDUCE),
        },
        "all-to-alls": {
            "config": set(core.ALLTOALLS),
            "execution": set(ALLTOALL_ALGORITHMS),
            "cost model": set(cost_collectives.ALLTOALL),
        },
        "schedules": {
            "config": set(core.SCHEDULES),
            "execution": set(SCHEDULES),
            "cost model": set(order.SCHEDULES),
        },
        "kernels": {
            "config": set(core.KERNELS) - {"auto"},
            "execution": set(kernels.available()),
            "cost model": set(passes.BACKENDS),
        },
        "hardware": {"cost model": set(hardware.PRESETS) | {"local"}},
    }


def disagreements(table: dict | None = None) -> list[str]:
    """One line per kind whose sides do not name the same set."""
    out = []
    for kind, sides in (table or registries()).items():
        union = set().union(*sides.values())
        missing = {side: sorted(union - names) for side, names in sides.items() if union - names}
        if missing:
            out.append(f"{kind}: " + "; ".join(f"{side} lacks {', '.join(n)}" for side, n in missing.items()))
    return out


def check() -> None:
    problems = disagreements()
    if problems:
        raise RuntimeError("simpar's registries of names disagree: " + " | ".join(problems))
