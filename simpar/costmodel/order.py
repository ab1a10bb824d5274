"""The order in which a pipeline rank does its work, and the activations that order keeps alive.

Written down again, in the cost model's own terms, from the schedules' definitions in docs/strategies.md
(the cost model never imports parallel/pipeline/schedules.py;
tests/unit/parallel/pipeline/test_interleaved_and_zero_bubble.py holds the two to each other).

A rank's work is a list of (kind, micro-batch, model chunk): kind "F" forward, "B" backward (for
zb-h1 and zb-v: only its dL/dx half), "W" the weight-gradient half. Chunk c lives on rank c mod S,
except under zb-v: 2S chunks in a V, rank s holding chunk s (on the way down) and 2S-1-s (back up).

  naive        F0 B0 F1 B1 ...
  gpipe        all forwards, then all backwards (Huang et al. 2019)
  1f1b         w = min(S-s-1, M) warm-up forwards, then F(w+i) B(i), then the remaining backwards
               (PipeDream-Flush, Narayanan et al. 2021)
  zb-h1        1F1B's F and B; W(j) right after B(j+d) with d = min(s, M-w), the last d W's at the end
               (Qi et al. 2023, sec. 3.1, Fig. 3): at most min(S, M) micro-batches alive on every stage
  interleaved  the k-th forward of rank s is micro-batch (k // SV) S + k % S on local chunk (k // S) % V,
               the k-th backward likewise with the local chunks reversed; w = min(2(S-s-1) + (V-1)S, MV)
               warm-up forwards, then F(w+i) B(i) (Narayanan et al. 2021, sec. 2.2)
  zb-v         (Qi et al., arXiv 2401.10241 v2, ZB-V) time in units, F = B = W = 1, messages free;
               in every unit each rank takes the first of: a B pass whose output gradient has come
               (its up chunk before its down chunk); a forward whose input has come, while it holds
               fewer than 2S forwarded-but-not-W units (up chunk first); its oldest waiting W pass.
               Every chunk's micro-batches go in order. A chunk's successor on the same rank (the
               turn, S-1 -> S) has its input (or gradient) the next unit, like any other.
"""

from __future__ import annotations


def n_chunks(schedule: str, S: int, V: int) -> int:
    """Model chunks of the pipeline: S*V for the interleaved schedule, 2S for zb-v, else one per stage."""
    if schedule == "zb-v":
        return 2 * S
    return S * V if schedule == "interleaved" else S


def stage_chunks(schedule: str, S: int, V: int, s: int) -> list[int]:
    """The chunks rank s holds: s, s+S, ..., s+(V-1)S; zb-v: s and 2S-1-s."""
    if schedule == "zb-v":
        return [s, 2 * S - 1 - s]
    return list(range(s, n_chunks(schedule, S, V), S))


def chunk_stage(schedule: str, S: int, c: int) -> int:
    """The stage holding chunk c (the inverse of stage_chunks)."""
    if schedule == "zb-v":
        return min(c, 2 * S - 1 - c)
    return c % S


def loss_stage(schedule: str, S: int) -> int:
    """The stage of the last chunk, which computes the loss (and so needs the labels)."""
    return chunk_stage(schedule, S, n_chunks(schedule, S, 1) - 1)


def zb_v_orders(S: int, M: int) -> tuple[list[list[tuple[str, int, int]]], int]:
    """Every rank's zb-v order (the module docstring's rule) and the span in units it takes."""
    C = 2 * S
    arrive = {("F", 0, m): 0 for m in range(M)}  # (kind, chunk, mb) -> the unit its input is there
    cursor = {(kind, c): 0 for kind in "FB" for c in range(C)}  # next micro-batch per kind and chunk
    waiting_w: list[list[tuple[int, int]]] = [[] for _ in range(S)]
    held, orders, unit = [0] * S, [[] for _ in range(S)], 0
    while sum(map(len, orders)) < 6 * M * S:
        for s in range(S):
            pick = None
            for kind, ok in (("B", True), ("F", held[s] < C)):
                for c in (C - 1 - s, s):
                    m = cursor[(kind, c)]
                    if pick is None and ok and m < M and arrive.get((kind, c, m), unit + 1) <= unit:
                        pick = (kind, m, c)
            if pick is None and waiting_w[s]:
                m, c = waiting_w[s].pop(0)
                pick = ("W", m, c)
            if pick is None:
                continue
            kind, m, c = pick
            orders[s].append(pick)
            if kind == "W":
                held[s] -= 1
                continue
            cursor[(kind, c)] += 1
            if kind == "F":
                held[s] += 1
                arrive[("F", c + 1, m) if c < C - 1 else ("B", c, m)] = unit + 1
            else:
                waiting_w[s].append((m, c))
                if c > 0:
                    arrive[("B", c - 1, m)] = unit + 1
        unit += 1
    return orders, unit


# The schedules this closed form knows (config.SCHEDULES and parallel/pipeline/schedules.SCHEDULES
# must name the same: simpar/registries.py checks it).
SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved", "zb-h1", "zb-v")


def stage_order(schedule: str, S: int, M: int, s: int, V: int = 1) -> list[tuple[str, int, int]]:
    """The (kind, micro-batch, chunk) steps of rank s, in order (see the module docstring)."""
    if schedule not in SCHEDULES:  # no silent 1F1B for a schedule this model was never taught
        raise ValueError(f"the cost model knows no schedule {schedule!r}")
    if S == 1 or schedule == "naive":
        return [op for m in range(M) for op in (("F", m, s), ("B", m, s))]
    if schedule == "gpipe":
        return [("F", m, s) for m in range(M)] + [("B", m, s) for m in range(M)]
    if schedule == "zb-v":
        return zb_v_orders(S, M)[0][s]
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
    rebuilds) a backward adds extra at its start; the backward (zb-h1, zb-v: the W pass) frees both."""
    if extra is None and (schedule not in ("interleaved", "zb-v") or S == 1):
        k = alive_window(schedule, S, M, s)
        return max(sum(size(m, s) for m in range(i, i + k)) for i in range(M - k + 1))
    extra = extra or (lambda m, c: 0)
    alive = peak = 0
    split = schedule in ("zb-h1", "zb-v")
    for kind, m, c in stage_order(schedule, S, M, s, V):
        if kind == "F":
            alive += size(m, c)
        elif kind == "B":
            alive += extra(m, c)
        peak = max(peak, alive)
        if kind == "W" or (kind == "B" and not split):
            alive -= size(m, c) + extra(m, c)
    return peak
