"""`simpar debug DIR`: read the flight recorders the watchdog dumped and say what went wrong.

    python -m simpar debug simpar-flight/

Like PyTorch's flight-recorder analyzer, it answers two questions from the last events of every rank
(flight.py writes them as DIR/rank-K.json):

1. Did the ranks of a group call different collectives? For each group (its member ranks), the
   collectives each member recorded are lined up by the group's call number; the first call where
   members differ in op, category or bytes is named, with the ranks on each side. A member that has
   made fewer calls than the others is behind in that group.
2. Who is everyone waiting for? Each rank's dump says what it blocked on (a receive from a peer, or a
   collective of its group). Following "waits for" from rank to rank ends at a rank that waits for
   nobody -- it is computing, or stalled -- or at a rank that left no dump at all.
"""

from __future__ import annotations

from ..runtime.dumps import behind_ranks, load_dumps, newest_run


def _call(e: dict) -> str:
    return f"{e['op']} ({e['category']}, {e['bytes']} B)"


def collective_mismatches(dumps: dict[int, dict]) -> list[str]:
    """Group by group: the first call number at which members differ, and members that are behind."""
    by_group: dict[tuple, dict[int, dict[int, dict]]] = {}
    for rank, d in dumps.items():
        for e in d["events"]:
            if e["kind"] == "collective" and e.get("members"):
                key = (e["group"], tuple(e["members"]))
                by_group.setdefault(key, {}).setdefault(rank, {})[e["group_seq"]] = e
    out = []
    for (name, members), calls in sorted(by_group.items()):
        present = [r for r in members if r in calls]
        common = set.intersection(*(set(calls[r]) for r in present)) if present else set()
        for seq in sorted(common):
            sides: dict[str, list[int]] = {}
            for r in present:
                sides.setdefault(_call(calls[r][seq]), []).append(r)
            if len(sides) > 1:
                said = "; ".join(f"rank(s) {', '.join(map(str, rs))} called {c}" for c, rs in sides.items())
                out.append(f"group {name} {list(members)} disagrees at its collective #{seq}: {said}")
                break
        last = {r: max(calls[r]) for r in present}
        if last and len(set(last.values())) > 1:
            top = max(last.values())
            behind = [r for r, n in last.items() if n < top]
            out.append(
                f"group {name} {list(members)}: rank(s) {', '.join(map(str, behind))} made "
                f"{min(last[r] for r in behind)} collective call(s), the others {top}: behind"
            )
    return out


def wait_chains(dumps: dict[int, dict], world_size: int) -> list[str]:
    """Who waits for whom, followed to the rank everyone is ultimately waiting for."""
    lines = []
    for rank in sorted(dumps):
        w = dumps[rank].get("waiting")
        if w is None:
            last = dumps[rank]["events"][-1] if dumps[rank]["events"] else None
            lines.append(
                f"rank {rank} waits for nobody at step {dumps[rank]['step'] + 1}: computing or stalled"
                + (f" (its last event: {last['kind']} {_call(last)})" if last else "")
            )
            continue
        peer = w.get("peer")
        target = f"rank {peer}" if isinstance(peer, int) else f"its {w['group']} group"
        lines.append(
            f"rank {rank} waits in {w['op']} ({w['category']}, group {w['group']}) for {target}"
            f" at step {w['step'] + 1}"
        )
    missing = [r for r in range(world_size) if r not in dumps]
    for r in missing:
        lines.append(f"rank {r} left no dump: it did not wait long enough to (stalled, killed, or computing)")
    behind = behind_ranks(dumps, world_size)
    if behind:
        lines.append(f"=> behind: rank(s) {', '.join(map(str, behind))} (the others wait for them)")
    return lines


def analyze(folder: str) -> str:
    folder = newest_run(folder)
    dumps = load_dumps(folder)
    world = max(d.get("world_size", 0) for d in dumps.values())
    mismatches = collective_mismatches(dumps)
    head = [f"simpar debug {folder}: {len(dumps)} of {world} ranks dumped their flight recorder"]
    if mismatches:
        head += ["", "different collectives (the likely cause):", *(f"  {m}" for m in mismatches)]
    return "\n".join(head + ["", "waits:", *(f"  {line}" for line in wait_chains(dumps, world))])
