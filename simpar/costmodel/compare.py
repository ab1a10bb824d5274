"""Which layout, and why: rank every way to split N ranks into dp x tp x pp (x ZeRO stage) by predicted
step time under a memory limit (`rank_layouts`), and say in words why the winner wins (`explain`).
`simpar plan --compare` prints them (cli/plan.py).
"""

from __future__ import annotations

from ..config import SimparError
from ..units import fmt_si as fmt_bytes
from ..units import fmt_time
from .predict import predict
from .spec import Spec, check


def factorizations(world: int) -> list[tuple[int, int, int]]:
    return [
        (dp, tp, world // (dp * tp))
        for dp in range(1, world + 1)
        if world % dp == 0
        for tp in range(1, world // dp + 1)
        if (world // dp) % tp == 0
    ]


# The parts of the critical rank's step (predict's time.critical.parts_s: they add up to step_s), named
COMPONENTS = (
    ("compute", "compute"),
    ("tp", "tensor-parallel all-reduces"),
    ("pp", "pipeline sends"),
    ("bubble", "the pipeline bubble"),
    ("dp", "gradient/ZeRO traffic"),
    ("data", "data scatter"),
)


def rank_layouts(spec: Spec, hw, world: int | None, limit: float | None) -> tuple[list[dict], int]:
    """Every valid dp x tp x pp (x ZeRO stage; resmlp: with and without --sp) of `world` ranks, predicted
    and ranked: layouts that fit the memory `limit` first, then by step time. Returns (ranked
    predictions, invalid factorizations)."""
    if not world or world < 1:
        raise SimparError("--compare needs --world N (the number of ranks to split)")
    if world > 1 << 20:
        raise SimparError(f"--world {world} is too large (at most {1 << 20})")
    cands, invalid = [], 0
    for dp, tp, pp in factorizations(world):
        zeros = (0, 1, 2, 3) if tp == pp == 1 and dp > 1 else (0,)
        # sequence parallel or not (resmlp under --tp, with or without --pp)
        sps = (False, True) if spec.arch == "resmlp" and tp > 1 else (False,)
        for zero, sp in ((z, s) for z in zeros for s in sps):
            d = dict(spec.__dict__, dp=dp, tp=tp, pp=pp, zero=zero, sp=sp)
            try:
                s = check(Spec(**d))
            except SimparError:
                invalid += 1
                continue
            cands.append(predict(s, hw, ranks=sorted({0, s.world - 1} | {k * dp * tp for k in range(pp)})))
    if not cands:
        raise SimparError(
            f"no layout of {world} ranks is valid for this model and batch "
            f"(widths divisible by tp, pp <= {spec.n_layers} layers, batch >= dp*microbatches)"
        )
    fits = fits_in(limit)
    return sorted(cands, key=lambda p: (not fits(p), p["time"]["step_s"])), invalid


def fits_in(limit: float | None):
    """A predicate: does a prediction's fullest rank fit in `limit` bytes (always, without a limit)?"""
    return lambda p: not limit or p["memory"]["max_total"] <= limit


def explain(ranked: list[dict], limit: float | None, fits) -> list[str]:
    """Sentences saying why the winner wins: its links, and what sinks each main rival."""
    win = ranked[0]
    if not fits(win):
        leanest = min(ranked, key=lambda p: p["memory"]["max_total"])
        return [
            f"nothing fits: even the leanest layout, {leanest['layout']}, "
            f"needs {leanest['memory']['max_total'] / limit:.1f}x the memory limit; "
            f"try --zero 3, more ranks, --precision mixed or a smaller batch"
        ]
    t, sp = win["time"], win["spec"]
    used = [f"{g} on {link['name']}" for g, link in win["links"].items() if g != "world" and sp[g] > 1]
    out = [
        f"winner: {win['layout']} at {fmt_time(t['step_s'])} per step"
        + (f" ({', '.join(used)})" if used else "")
        + ": "
        + _breakdown(win)
    ]
    rivals, seen = [], {win["layout"]}
    for pick in (
        lambda p: p is not win and fits(p),  # runner-up
        lambda p: p["spec"]["tp"] == 1 and p["spec"]["pp"] == 1 and not p["spec"]["zero"],  # plain DDP
        lambda p: p["spec"]["dp"] == 1 and p["spec"]["pp"] == 1,  # all tensor parallel
        lambda p: p["spec"]["tp"] == 1 and p["spec"]["pp"] == 1 and p["spec"]["zero"] == 3,
    ):
        rival = next((p for p in ranked if pick(p) and p["layout"] not in seen), None)
        if rival:
            seen.add(rival["layout"])
            rivals.append(rival)
    for r in rivals:
        if not fits(r):
            out.append(
                f"{r['layout']} would need {r['memory']['max_total'] / limit:.1f}x the memory limit "
                f"({fmt_bytes(r['memory']['max_total'])} per rank: "
                + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in r["memory"]["max"].items() if v)
                + ")"
            )
            continue
        mine, theirs = t["critical"]["parts_s"], r["time"]["critical"]["parts_s"]
        key, name = max(COMPONENTS, key=lambda c: theirs[c[0]] - mine[c[0]])
        link = key if key in ("tp", "pp", "dp") else None
        where = f" on {r['links'][link]['name']}" if link else ""
        out.append(
            f"{r['layout']} is {r['time']['step_s'] / t['step_s']:.2f}x slower: mostly {name}{where} "
            f"({fmt_time(theirs[key])} vs {fmt_time(mine[key])})"
        )
    return out


def _breakdown(p: dict) -> str:
    """The winner's step as the parts of its critical rank's timeline (they add up to 100%)."""
    crit, step = p["time"]["critical"], p["time"]["step_s"]
    parts = [(crit["parts_s"][k], n) for k, n in COMPONENTS if crit["parts_s"][k] > 0]
    return f"on rank {crit['rank']} (the last to finish) " + ", ".join(
        f"{n} {fmt_time(v)} ({v / step:.0%})" for v, n in sorted(parts, reverse=True)
    )
