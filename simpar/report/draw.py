"""What every picture of simpar's shares: the category and memory colours, matplotlib without a
display, atomic PNG writes, and byte axes that read 1 KiB / 2 KiB / 4 KiB (plots.py, scaling.py, sweep.py)."""

from __future__ import annotations

import math

from .metrics import modeled_ops

CATS = ("data", "model", "activation")
CAT_COLOURS = {"data": "#55A868", "model": "#4C72B0", "activation": "#DD8452"}
KINDS = ("params", "grads", "optimizer", "activations_peak")
KIND_COLOURS = {
    "params": "#4C72B0",
    "grads": "#8172B2",
    "optimizer": "#C44E52",
    "activations_peak": "#DD8452",
}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str) -> str:
    from ..files import atomic_write

    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110), binary=True)
    _plt().close(fig)
    return path


def _bytes_axis(ax, axis: str = "y") -> None:
    """Ticks at binary steps, labelled 1 KiB / 2 KiB / 4 KiB ... instead of 1e7 or 977 KiB.

    A log axis gets powers of two (LogLocator base 2, few enough to read); a linear one gets multiples
    of a power of two bytes (256 KiB, 512 KiB, 768 KiB ...), about five of them.
    """
    from matplotlib.ticker import FuncFormatter, LogLocator, MultipleLocator, NullFormatter

    def fmt(v, _):
        for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
            if abs(v) < 1024 or unit == "TiB":
                return f"{v:.0f} {unit}" if unit == "B" else f"{v:.3g} {unit}"
            v /= 1024

    target = ax.yaxis if axis == "y" else ax.xaxis
    if (ax.get_yscale() if axis == "y" else ax.get_xscale()) == "log":
        target.set_major_locator(LogLocator(base=2, numticks=8))
        # matplotlib labels the minor (decimal) ticks itself when the axis spans less than a decade:
        # "2x10^6" printed over "2 MiB"; the binary major ticks are the labels
        target.set_minor_formatter(NullFormatter())
    else:
        lo, hi = ax.get_ylim() if axis == "y" else ax.get_xlim()
        span = max(hi - lo, 1.0)
        target.set_major_locator(MultipleLocator(2 ** max(0, math.floor(math.log2(span / 5)))))
    target.set_major_formatter(FuncFormatter(fmt))


def _traffic_label(name: str, m: dict) -> str:
    """The layout's name, marked when its bytes were modeled (--collectives mpi), not counted."""
    return f"{name} (modeled)" if modeled_ops(m) else name
