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
        elif kind == "dict":  # flops: precision -> FLOP/s, each a positive rate
            if not isinstance(value, dict) or "fp32" not in value:
                raise SimparError(f"{where}: {f.name} must map precisions to FLOP/s and include 'fp32'")
            for key, rate in value.items():
                if not _number(rate) or rate <= 0:
                    raise SimparError(f"{where}: {f.name}[{key!r}] must be a finite number > 0, got {rate!r}")
