"""The order in which a pipeline rank does its work, and the activations that order keeps alive.

Written down again, in the cost model's own terms, from the schedules' definitions in the README (the
cost model never imports parallel/schedules.py; tests/test_costmodel.py holds the two to each other).

A rank's work is a list of (kind, micro-batch, model chunk): kind "F" forward, "B" backward (for
zb-h1: only its dL/dx half), "W" the weight-gradient half (zb-h1). Chunk c lives on rank c mod S.

  naive        F0 B0 F1 B1 ...
  gpipe        all forwards, then all backwards (Huang et al. 2019)
  1f1b         w = min(S-s-1, M) warm-up forwards, then F(w+i) B(i), then the remaining backwards
               (PipeDream-Flush, Narayanan et al. 2021)
  zb-h1        1F1B's F and B; W(j) right after B(j+d) with d = min(s, M-w), the last d W's at the end
               (Qi et al. 2023, sec. 3.1, Fig. 3): at most min(S, M) micro-batches alive on every stage
  interleaved  the k-th forward of rank s is micro-batch (k // SV) S + k % S on local chunk (k // S) % V,
               the k-th backward likewise with the local chunks reversed; w = min(2(S-s-1) + (V-1)S, MV)
               warm-up forwards, then F(w+i) B(i) (Narayanan et al. 2021, sec. 2.2)
"""

from __future__ import annotations


def n_chunks(schedule: str, S: int, V: int) -> int:
    """Model chunks of the pipeline: S*V for the interleaved schedule, else one per stage."""
    return S * V if schedule == "interleaved" else S


def stage_chunks(schedule: str, S: int, V: int, s: int) -> list[int]:
    """The chunks rank s holds: s, s+S, ..., s+(V-1)S."""
    return list(range(s, n_chunks(schedule, S, V), S))


def stage_order(schedule: str, S: int, M: int, s: int, V: int = 1) -> list[tuple[str, int, int]]:
    """The (kind, micro-batch, chunk) steps of rank s, in order (see the module docstring)."""
    if S == 1 or schedule == "naive":
        return [op for m in range(M) for op in (("F", m, s), ("B", m, s))]
    if schedule == "gpipe":
        return [("F", m, s) for m in range(M)] + [("B", m, s) for m in range(M)]
    if schedule == "interleaved":
        MV = M * V

        def unit(kind: str, k: int) -> tuple[str, int, int]:
            local = (k // S) % V
            return kind, (k // (S * V)) * S + k % S, (V - 1 - local if kind == "B" else local) * S + s

        w = min(2 * (S - s - 1) + (V - 1) * S, MV)
        steady = [op for i in range(MV - w) for op in (unit("F", w + i), unit("B", i))]
        return [unit("F", k) for k in range(w)] + steady + [unit("B", k) for k in range(MV - w, MV)]
    w = min(S - s - 1, M)
    steady = [op for i in range(M - w) for op in (("F", w + i, s), ("B", i, s))]
    order = [("F", m, s) for m in range(w)] + steady + [("B", m, s) for m in range(M - w, M)]
    if schedule != "zb-h1":
        return order
    d = min(s, M - w)
    out = []
    for op in order:
        out.append(op)
        if op[0] == "B" and op[1] >= d:
            out.append(("W", op[1] - d, s))
    return out + [("W", m, s) for m in range(M - d, M)]


def alive_window(schedule: str, S: int, M: int, s: int) -> int:
    """How many consecutive micro-batches stage s holds activations for at its peak (one chunk per
    rank): naive 1; GPipe all M; 1F1B min(S - s, M); zb-h1 min(S, M) (a micro-batch stays alive until
    its W pass, held back by s: S - s in flight + s waiting for W)."""
    if S == 1 or schedule == "naive":
        return 1
    if schedule == "gpipe":
        return M
    if schedule == "zb-h1":
        return min(S, M)
    return min(S - s, M)


def peak_alive(schedule: str, S: int, M: int, s: int, V: int, size, extra=None) -> int:
    """Most activation bytes rank s holds at once in one grad-accum micro-step, `size(m, c)` those a
    forward of micro-batch m on chunk c keeps. One chunk per rank, no recomputation: the largest
    `alive_window` consecutive micro-batches (they are freed oldest first). Otherwise the largest
    prefix of the order: a forward adds size; with recomputation (`extra(m, c)`: what the backward
    rebuilds) a backward adds extra at its start; the backward (zb-h1: the W pass) frees both."""
    if extra is None and (schedule != "interleaved" or S == 1):
        k = alive_window(schedule, S, M, s)
        return max(sum(size(m, s) for m in range(i, i + k)) for i in range(M - k + 1))
    extra = extra or (lambda m, c: 0)
    alive = peak = 0
    split = schedule == "zb-h1"
    for kind, m, c in stage_order(schedule, S, M, s, V):
        if kind == "F":
            alive += size(m, c)
        elif kind == "B":
            alive += extra(m, c)
        peak = max(peak, alive)
        if kind == "W" or (kind == "B" and not split):
            alive -= size(m, c) + extra(m, c)
    return peak
