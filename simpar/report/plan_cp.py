"""What `simpar plan --arch gpt --cp C` adds: the check of the question and the lines on context parallelism.

    python -m simpar plan --arch gpt --model gpt3-175b --seq-len 131072 --tp 8 --pp 16 --cp 16 \
        --batch 16 --microbatches 16 --sp --recompute selective --precision mixed --optimizer adam \
        --hardware dgx-h100

The numbers are costmodel/cp.py's (plan_cp) and costmodel/gpt.py's; this file only words them.
"""

from __future__ import annotations

from ..config import SimparError
from ..costmodel.cp import CP_ALGOS_PLANNED, ring_block_map
from ..units import fmt_si, fmt_time


def check_cp(shape, cp: int, algo: str) -> None:
    if cp < 1:
        raise SimparError(f"--cp must be at least 1, got {cp}")
    if algo not in CP_ALGOS_PLANNED:
        raise SimparError(f"unknown --cp-algo {algo!r} (choose from {', '.join(CP_ALGOS_PLANNED)})")
    if shape.seq % (2 * cp):
        raise SimparError(
            f"--cp {cp} cuts every sequence into {2 * cp} equal chunks: --seq-len {shape.seq} is not a "
            "multiple"
        )
    if algo == "ulysses" and shape.heads % cp:
        raise SimparError(
            f"--cp-algo ulysses gives each of the --cp {cp} ranks whole heads: {shape.heads} heads do not "
            "divide"
        )


def cp_lines(p: dict, without: dict) -> list[str]:
    """The cp layout against the same dp x tp x pp without it (`without`: gpt_plan.plan's answer), and
    for the ring with C <= 8 the picture of who computes which block."""
    lay, mem, mem0, t = p["layout"], p["memory_per_gpu"], without["memory_per_gpu"], p["time"]
    C, op = lay["cp"], "cp-kv" if lay["cp_algo"] == "ring" else "cp-alltoall"
    picture = block_picture(C) if lay["cp_algo"] == "ring" and C <= 8 else []
    hides = (
        "each ring hop lasts the longer of its blocks and its K/V transfer, the 1F1B bubble included"
        if lay["cp_algo"] == "ring"
        else "Ulysses' all-to-alls block, the 1F1B bubble included"
    )
    return picture + [
        f"context parallelism: cp {C} ({lay['cp_algo']}), each GPU holds s/{C} tokens of every sequence; "
        f"{p['world']} GPUs = dp {lay['dp']} x cp {C} x tp {lay['tp']} x pp {lay['pp']}",
        f"  memory per GPU: {fmt_si(mem['total'])} with cp {C}, {fmt_si(mem0['total'])} without (activations "
        f"{fmt_si(mem['activations'])} = {fmt_si(mem0['activations'])} / {C})",
        f"  {op} traffic per GPU per step: {fmt_si(p['cp_bytes_per_gpu'])}, {fmt_time(t['cp_wire_s'])} on "
        f"the cp link; {fmt_time(t['cp_s'])} of the step waits for it ({hides})",
    ]


def block_picture(C: int) -> list[str]:
    """The causal triangle of 2C x 2C blocks, each cell the rank that computes it (ring: the rank that
    holds the query chunk), with each rank's count: the balance the chunk pairing buys."""
    grid = ring_block_map(C)
    width = len(str(C - 1)) + 1
    lines = [
        f"which rank computes each block (rows: query chunks, columns: key chunks; {2 * C} chunks of "
        f"s/{2 * C}):"
    ]
    for q, row in enumerate(grid):
        cells = "".join(f"{cell[0]:>{width}}" if cell else " " * (width - 1) + "." for cell in row)
        lines.append(f"  q{q:<3}{cells}")
    counts = [sum(1 for row in grid for cell in row if cell and cell[0] == r) for r in range(C)]
    lines.append(f"  blocks per rank: {counts} (every rank 2C+1 = {2 * C + 1}: balanced)")
    return lines
