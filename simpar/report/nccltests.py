"""nccl-tests' own output (all_reduce_perf, all_gather_perf, ... as they print it) as validation points.

A log looks like (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md explains the columns):

    # Collective test starting: all_reduce_perf            (newer versions only)
    #  Rank  0 Group  0 Pid 295203 on node005 device  0 [0x18] NVIDIA H100 80GB HBM3
    ...
    #       size         count      type   redop    root     time   algbw   busbw #wrong     time ...
           32768          8192     float     sum      -1    18.66    1.76    3.07       0    17.95 ...

Each table row gives two points, out-of-place and in-place time (us). The collective comes from the
test's name (in the log, or --op), the GPU count from the `Rank` lines (or --gpus), the node count
from their distinct host names (or --nodes). Older logs have no `root` column; `mpirun
--tag-output` prefixes ("[0]") are ignored. The header's `nGpus N` (-g: GPUs one process drives) and
`graph: G` (-G: collectives per CUDA graph) become the point's `launch` (nccl.Launch).
"""

from __future__ import annotations

import re

from ..errors import SimparError

OPS = {
    "all_reduce": "all-reduce",
    "all_gather": "all-gather",
    "reduce_scatter": "reduce-scatter",
    "alltoall": "all-to-all",
    "sendrecv": "send-recv",
}
_RANK = re.compile(r"#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)")
_NUM = r"(\d+(?:\.\d+)?|N/A)"
_ROW = re.compile(
    rf"^\s*(\d+)\s+(\d+)\s+(\w+)\s+(\w+)\s+(?:(-?\d+)\s+)?{_NUM}\s+{_NUM}\s+{_NUM}\s+(\S+)\s+{_NUM}\s+{_NUM}\s+{_NUM}"
)


_HEADER = re.compile(r"nGpus\s+(\d+).*?(?:graph:\s*(\d+))?\s*$", re.MULTILINE)


def detect_launch(text: str) -> str:
    """The `launch` column from the header line: `eager g=N`, `graphs g=N G=M`, or "" (not printed)."""
    m = _HEADER.search(text)
    if not m:
        return ""
    per_process, graph = int(m.group(1)), int(m.group(2) or 0)
    words = ["graphs" if graph > 0 else "eager"] + ([f"g={per_process}"] if per_process > 1 else [])
    return " ".join(words + ([f"G={graph}"] if graph > 1 else []))


def detect_op(text: str) -> str | None:
    """The collective of a log, from the test's name where the log prints it."""
    for name, op in OPS.items():
        if f"{name}_perf" in text:
            return op
    return None


def parse(
    text: str,
    where: str,
    op: str | None = None,
    gpus: int | None = None,
    nodes: int | None = None,
    hardware: str = "",
    profile: str = "",
) -> list[dict]:
    """Validation points (the CSV's columns) from one nccl-tests log."""
    op = op or detect_op(text)
    if op is None:
        raise SimparError(f"{where}: cannot tell which collective this nccl-tests log measured; pass --op")
    ranks = {}
    for line in text.splitlines():
        m = _RANK.search(line)
        if m:
            ranks[int(m.group(1))] = m.group(2)
    gpus = gpus or len(ranks)
    nodes = nodes or len(set(ranks.values())) or 1
    if not gpus:
        raise SimparError(f"{where}: no '#  Rank N ... on HOST' lines to count GPUs by; pass --gpus")
    launch = detect_launch(text)
    points = []
    for line in text.splitlines():
        line = re.sub(r"\[\d+\]", " ", line)
        m = _ROW.match(line)
        if not m:
            continue
        size = int(m.group(1))
        for place, col in (("oop", 6), ("ip", 10)):
            if m.group(col) == "N/A":
                continue
            points.append(
                {
                    "id": f"{where.rsplit('/', 1)[-1]}-{size}-{place}",
                    "quantity": "time",
                    "op": op,
                    "hardware": hardware,
                    "profile": profile,
                    "gpus": gpus,
                    "nodes": nodes,
                    "algorithm": "auto",
                    "launch": launch,
                    "dtype": m.group(3),
                    "size_bytes": size,
                    "value": float(m.group(col)),
                    "unit": "us",
                    "tolerance": 0.20,
                    "fit": "",
                    "source_url": where,
                    "how": f"nccl-tests {op} log, {'out-of-place' if place == 'oop' else 'in-place'} time",
                }
            )
    if not points:
        raise SimparError(f"{where}: no nccl-tests result rows (size count type redop ... time algbw busbw)")
    return points


def looks_like_nccl_tests(text: str) -> bool:
    return "algbw" in text and "busbw" in text
