"""Reading the flight recorders' dumps (simpar-flight/RUNID/rank-K.json): which ranks the others
wait for. The watchdog's line uses it (flight.py) and so does `simpar debug` (report/debug.py)."""

from __future__ import annotations

import glob
import json
import os

from ..errors import SimparError


def newest_run(folder: str) -> str:
    """`folder` itself if it holds dumps, else its newest job's folder (flight.py keeps one per job)."""
    if glob.glob(os.path.join(folder, "rank-*.json")):
        return folder
    runs = [os.path.dirname(p) for p in glob.glob(os.path.join(folder, "*", "rank-*.json"))]
    return max(runs, key=os.path.getmtime) if runs else folder


def load_dumps(folder: str) -> dict[int, dict]:
    paths = sorted(glob.glob(os.path.join(newest_run(folder), "rank-*.json")))
    if not paths:
        raise SimparError(f"{folder}: no flight-recorder dumps (rank-K.json) in it")
    dumps = {}
    for path in paths:
        try:
            with open(path) as f:
                d = json.load(f)
            dumps[int(d["rank"])] = d
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SimparError(f"{path}: not a simpar flight-recorder dump ({exc})") from None
    return dumps


def behind_ranks(dumps: dict[int, dict], world_size: int) -> list[int]:
    """The ranks everyone ultimately waits for: each chain rank -> the peer it waits for, followed to
    its end (a rank waiting for nobody, or one that left no dump), plus every such rank itself."""
    ends = {r for r in dumps if dumps[r].get("waiting") is None}
    ends |= {r for r in range(world_size) if r not in dumps}
    for rank in sorted(dumps):
        seen, r = set(), rank
        while r in dumps and dumps[r].get("waiting") and isinstance(dumps[r]["waiting"].get("peer"), int):
            if r in seen:
                break
            seen.add(r)
            r = dumps[r]["waiting"]["peer"]
        if r != rank and (r not in dumps or dumps[r].get("waiting") is None):
            ends.add(r)
    return sorted(ends)


def behind(folder: str) -> list[int]:
    """The ranks the others wait for, from the dumps in `folder` (the watchdog's line names them)."""
    dumps = load_dumps(folder)
    return behind_ranks(dumps, max(d.get("world_size", 0) for d in dumps.values()))
