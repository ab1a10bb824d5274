"""How `simpar plan` writes numbers: decimal bytes (as vendors quote link and memory sizes),
times in s/ms/us/ns, and a one-line name for the planned model."""
from __future__ import annotations


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} PB"


def fmt_time(s: float) -> str:
    if s == 0:
        return "0"
    for unit, k in (("s", 1), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if abs(s) >= k:
            return f"{s / k:.3g} {unit}"
    return f"{s / 1e-9:.2g} ns"


def describe_model(pred: dict) -> str:
    w, P = pred["widths"], pred["params"]
    shape = "-".join(map(str, w)) if "..." not in w else f"stand-in, {pred['n_layers']} layers of width {w[1]}"
    return f"MLP {shape} ({P / 1e9:,.2f} B params)" if P >= 1e9 else f"MLP {shape} ({P / 1e6:,.3g} M params)"
