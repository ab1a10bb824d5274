"""Run under mpiexec by test_costmodel: `simpar train` with one rule of the execution code changed,
to show the cost model is an independent witness (a rule it only copied would change with it).

    mpiexec -n K python -m mpi4py tests/mpi/scripts/mutate_executor.py MUTATION TRAIN-ARGS...

MUTATION: none (the same launch, unpatched), stages (an unbalanced pipeline stage split), chunks
(collective chunks cut with the whole remainder on the first chunk, instead of one extra element
on each of the first n % p chunks) or capacity (MoE experts get one token slot fewer than
ceil(C K N / E): every rank still agrees, so the run completes, dropping more).
"""

import sys

import simpar.collectives.base as base
import simpar.model.moe as moe
import simpar.parallel.expert  # noqa: F401  (binds capacity by name: patched below)
import simpar.parallel.pipeline.engine  # noqa: F401  (binds partition_layers by name: patched below)
import simpar.parallel.pipeline.schedules as schedules
from simpar.cli import main

original_partition = schedules.partition_layers
original_offsets = base.offsets
original_capacity = moe.capacity


def unbalanced_partition(widths, S, stage_layers=None, arch="mlp"):
    """One layer on each stage but the last, which takes the rest, whatever the parameter counts."""
    if stage_layers is None:
        stage_layers = [1] * (S - 1) + [len(widths) - S]
    return original_partition(widths, S, stage_layers, arch)


def remainder_first(n: int, p: int) -> list[int]:
    """Still a valid cut into p chunks that every rank agrees on, just not np.array_split's; chunk 0
    stays the largest, which the ring's receive buffer relies on (so the run still completes)."""
    size, extra = divmod(n, p)
    return [0] + [i * size + extra for i in range(1, p)] + [n]


def patch_everywhere(original, replacement) -> None:
    """Replace `original` in every loaded simpar module: `from .base import offsets` binds a second
    name in the importing module, which patching the defining module alone would leave in place."""
    patched = []
    for name, module in list(sys.modules.items()):
        if name == "simpar" or name.startswith("simpar."):
            for attr, value in list(vars(module).items()):
                if value is original:
                    setattr(module, attr, replacement)
                    patched.append(f"{name}.{attr}")
    assert patched, f"{original.__name__} is bound nowhere: the mutation would test nothing"


mutation, argv = sys.argv[1], sys.argv[2:]
if mutation == "stages":
    patch_everywhere(original_partition, unbalanced_partition)
elif mutation == "chunks":
    patch_everywhere(original_offsets, remainder_first)
elif mutation == "capacity":
    patch_everywhere(original_capacity, lambda C, K, N, E: original_capacity(C, K, N, E) - 1)
elif mutation != "none":
    raise SystemExit(f"unknown mutation {mutation!r}")
sys.exit(main(["train", *argv]))
