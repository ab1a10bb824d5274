"""A hardware profile read from a file, checked field by field before anything divides by it.

Why here and not at the division: a zero bandwidth or a string of FLOPs would otherwise surface
mid-training as ZeroDivisionError or TypeError, and a negative rate as a negative step time. The
rule follows the Hardware dataclass itself -- each field's declared type -- plus the list of fields
that must be strictly positive, so a field added to the dataclass is checked without a new line.
"""

from __future__ import annotations

import dataclasses
import math

from ..errors import SimparError

# Rates and counts something is divided by (time = work / rate), or that scale a rate.
POSITIVE = ("intra_bw", "devices_per_node", "busy_share", "busy_stream_share")
# Everything else numeric (latencies, gamma, nic_bw and nics_per_node of a one-node profile, cores
# and memory_bytes where 0 means "unknown") may be 0 but not negative.


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_profile(hw, where: str) -> None:
    """SimparError naming the first bad field of `hw` (a Hardware), else nothing."""
    for f in dataclasses.fields(hw):
        value, kind = getattr(hw, f.name), str(f.type)
        if kind in ("float", "int"):
            if not _number(value) or (kind == "int" and float(value) != int(value)):
                raise SimparError(f"{where}: {f.name} must be a finite {kind}, got {value!r}")
            if value < 0 or (f.name in POSITIVE and value == 0):
                sign = "> 0" if f.name in POSITIVE else ">= 0"
                raise SimparError(f"{where}: {f.name} must be {sign}, got {value!r}")
        elif kind == "bool" and not isinstance(value, bool):
            raise SimparError(f"{where}: {f.name} must be true or false, got {value!r}")
        elif kind == "str" and not isinstance(value, str):
            raise SimparError(f"{where}: {f.name} must be a string, got {value!r}")
        elif kind == "list" and not isinstance(value, list):
            raise SimparError(f"{where}: {f.name} must be a list, got {value!r}")
        elif kind == "dict":
            _check_table(f.name, value, where)


def _check_table(name: str, value, where: str) -> None:
    """flops: precision -> FLOP/s, 'fp32' required; peak_flops: precision -> FLOP/s; gemm_tile:
    precision -> output elements per tile; ring_proto: protocol -> its numbers (latencies, bandwidth
    share, ceilings), none negative."""
    if not isinstance(value, dict) or (name == "flops" and "fp32" not in value):
        raise SimparError(f"{where}: {name} must map precisions to FLOP/s and include 'fp32'"
                          if name == "flops" else f"{where}: {name} must be a JSON object")  # fmt: skip
    for key, entry in value.items():
        if isinstance(entry, list):
            if not entry or not all(_number(x) and x >= 0 for x in entry):
                raise SimparError(f"{where}: {name}[{key!r}] must be a list of finite numbers >= 0")
        elif not _number(entry) or entry <= 0:
            raise SimparError(f"{where}: {name}[{key!r}] must be a finite number > 0, got {entry!r}")
