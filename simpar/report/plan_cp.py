"""What `simpar plan --arch gpt --cp C` adds: the check of the question and the lines on context parallelism.

    python -m simpar plan --arch gpt --model gpt3-175b --seq-len 131072 --tp 8 --pp 16 --cp 16 \
        --batch 16 --microbatches 16 --sp --recompute selective --precision mixed --optimizer adam \
        --hardware dgx-h100

The numbers are costmodel/cp.py's (plan_cp) and costmodel/gpt.py's; this file only words them.
"""

from __future__ import annotations

from ..config import SimparError
from ..costmodel.cp import CP_ALGOS_PLANNED
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
    """The cp layout against the same dp x tp x pp without it (`without`: gpt.plan's answer)."""
    lay, mem, mem0 = p["layout"], p["memory_per_gpu"], without["memory_per_gpu"]
    C, op = lay["cp"], "cp-kv" if lay["cp_algo"] == "ring" else "cp-alltoall"
    return [
        f"context parallelism: cp {C} ({lay['cp_algo']}), each GPU holds s/{C} tokens of every sequence; "
        f"{p['world']} GPUs = dp {lay['dp']} x cp {C} x tp {lay['tp']} x pp {lay['pp']}",
        f"  memory per GPU: {fmt_si(mem['total'])} with cp {C}, {fmt_si(mem0['total'])} without (activations "
        f"{fmt_si(mem['activations'])} = {fmt_si(mem0['activations'])} / {C})",
        f"  {op} traffic per GPU per step: {fmt_si(p['cp_bytes_per_gpu'])}, {fmt_time(p['time']['cp_s'])} "
        "on the cp link, added to the step unoverlapped (an upper bound: the ring overlaps each hop with "
        "its block)",
    ]
