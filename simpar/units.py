"""Numbers in and out: byte and time formatters, size parsers, and the one-thread environment.

Two byte styles, on purpose:
  fmt_bytes   binary units (KiB, MiB): what simpar measures -- buffers in memory, ledger counts;
  fmt_si      decimal units (KB, GB): how vendors quote link speeds and memory sizes (`simpar plan`).

No NumPy here: __main__ reads THREAD_VARS before NumPy may be imported.
"""

from __future__ import annotations

import re

from .config import SimparError

# Every library that may start a thread pool of its own. One compute thread per rank: several ranks
# share the cores, and a pool per rank oversubscribes them (measured: 2 threads per rank on 2 cores
# with 4 ranks makes a step about 5x slower).
THREAD_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMBA_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


def one_thread_env(env: dict) -> dict:
    """`env` with every thread-pool variable set to 1 (for child processes)."""
    return {**env, **{var: "1" for var in THREAD_VARS}}


def _scaled(n: float, base: int, units: tuple[str, ...], digits: str) -> str:
    for unit in units:
        if abs(n) < base or unit == units[-1]:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:{digits}} {unit}"
        n /= base
    raise AssertionError("unreachable")


def fmt_bytes(n: float, digits: str = ".1f") -> str:
    """Binary units: 1536 -> '1.5 KiB'."""
    return _scaled(n, 1024, ("B", "KiB", "MiB", "GiB", "TiB", "PiB"), digits)


def fmt_si(n: float) -> str:
    """Decimal units, three significant digits: 1.5e9 -> '1.5 GB'."""
    return _scaled(n, 1000, ("B", "KB", "MB", "GB", "TB", "PB"), ".3g")


def fmt_time(s: float) -> str:
    """Seconds with a readable unit: 0.0012 -> '1.2 ms'."""
    if s == 0:
        return "0"
    for unit, k in (("s", 1), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if abs(s) >= k:
            return f"{s / k:.3g} {unit}"
    return f"{s / 1e-9:.2g} ns"


_DECIMAL = {"": 1, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}
_BINARY = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_count(text: str, flag: str = "--params") -> int:
    """'7e9', '70B', '1T' -> a count (decimal suffixes; B = billion)."""
    m = re.fullmatch(r"\s*([0-9.]+(?:[eE][+-]?[0-9]+)?)\s*([KMBGT]?)\s*", text or "", re.I)
    if not m:
        raise SimparError(f"{flag} {text!r}: expected a number like 7e9, 70B or 1T")
    n = int(float(m.group(1)) * _DECIMAL[m.group(2).upper()])
    if n < 1 or n > 1e15:
        raise SimparError(f"{flag} {text}: must be between 1 and 1e15")
    return n


def parse_bytes(text: str, flag: str = "--memory-limit") -> float:
    """'80GB' (decimal), '24GiB' (binary) or '1e9' -> bytes."""
    m = re.fullmatch(r"\s*([0-9.]+(?:[eE][+-]?[0-9]+)?)\s*([KMGT]?)(i?)B?\s*", text or "", re.I)
    if not m:
        raise SimparError(f"{flag} {text!r}: expected a size like 80GB, 24GiB or 1e9")
    power = " KMGT".index(m.group(2).upper() or " ")
    return float(m.group(1)) * (1024 if m.group(3) else 1000) ** power


def parse_buffer_size(text: str, what: str = "bench allreduce") -> int:
    """'1K' -> 1024, '64M' -> 67108864, '4096' -> 4096 (a buffer: K, M, G are powers of 1024)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(?:i?B)?\s*", text, flags=re.IGNORECASE)
    if not m or int(m.group(1)) == 0:
        raise SimparError(f"{what}: bad size {text!r} (use bytes like 4096, 1K, 64M)")
    return int(m.group(1)) * _BINARY[m.group(2).upper()]
