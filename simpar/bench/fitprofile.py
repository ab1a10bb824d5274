"""`simpar bench --fit-profile LOG...`: a hardware profile whose links match your cluster's nccl-tests logs.

The way `bench --calibrate` measures `local`, this fits the link numbers of a profile to what
nccl-tests printed on your machines. Each log row is one collective of S bytes over p GPUs, priced as a
ring of `steps` steps (2(p-1) for all-reduce, p-1 for all-gather / reduce-scatter, costmodel/nccl.py):

    time = steps x hop + steps x (S/p) / bw          (hop: s per step, bw: bus bandwidth)

which is linear in (hop, 1/bw): a least-squares fit of the relative error over every row gives both.
Logs of one node fit NVLink's (intra_alpha, intra_bw); logs that span nodes fit the per-step latency
of the network (from the group's average step) and one NIC's bandwidth (the group's bus bandwidth over
the rails it drives). The result is the base profile with those numbers and a single protocol, so a
plain `--hardware my.json` prices collectives with exactly the fitted line. Run ring algorithms for
it (all_gather_perf, reduce_scatter_perf, or NCCL_ALGO=RING NCCL_NVLS_ENABLE=0): NVLink SHARP and
trees are not rings.
"""

from __future__ import annotations

import numpy as np

from ..costmodel import hardware, nccl
from ..errors import SimparError

REDUCING = ("all-reduce", "all-gather", "reduce-scatter")


def fit_line(points: list[dict]) -> tuple[float, float]:
    """(hop seconds per step, bus bandwidth bytes/s) minimising the squared relative time error."""
    rows, p = [], points[0]["gpus"]
    for pt in points:
        steps = nccl.ring_steps(pt["op"], pt["gpus"])
        t = pt["value"] * 1e-6
        rows.append((steps / t, steps * pt["size_bytes"] / pt["gpus"] / t))
    a = np.array(rows, dtype=np.float64)
    if len(points) < 2 or np.linalg.matrix_rank(a) < 2:
        raise SimparError(f"need at least two different sizes to fit a line (group of {p})")
    (hop, inv_bw), *_ = np.linalg.lstsq(a, np.ones(len(points)), rcond=None)
    if inv_bw <= 0:
        raise SimparError("the logs do not show time growing with size: cannot fit a bandwidth")
    return max(0.0, float(hop)), 1.0 / float(inv_bw)


def fit_profile(points: list[dict], base: str, name: str, logs: list[str]) -> dict:
    hw = hardware.load(base)
    bad = sorted({pt["op"] for pt in points} - set(REDUCING))
    if bad:
        raise SimparError(f"--fit-profile fits ring collectives ({', '.join(REDUCING)}), not {bad}")
    out = hw.to_dict()
    one = [pt for pt in points if pt["nodes"] <= 1]
    many = [pt for pt in points if pt["nodes"] > 1]
    hop_intra, hop_inter = hw.intra_alpha, hw.inter_alpha
    notes = []
    if one:
        hop_intra, out["intra_bw"] = fit_line(one)
        out["intra_alpha"] = hop_intra
        notes.append(f"NVLink: {hop_intra * 1e6:.2f} us per step, {out['intra_bw'] / 1e9:.1f} GB/s bus")
    if many:
        p, n = many[0]["gpus"], many[0]["nodes"]
        if any((pt["gpus"], pt["nodes"]) != (p, n) for pt in many):
            raise SimparError("multi-node logs must share one shape (GPUs, nodes) to fit one network")
        hop, bw = fit_line(many)
        hop_inter = max(0.0, ((p - 1) * hop - (p - n) * hop_intra) / (n - 1))
        members = max(1, p // n)
        rails = min(members, hw.nics_per_node or members)
        out["nic_bw"], out["inter_alpha"] = bw / rails, hop_inter
        out["nics_per_node"] = out["nics_per_node"] or rails
        notes.append(f"network: {hop_inter * 1e6:.2f} us per step, {bw / rails / 1e9:.1f} GB/s per NIC")
    out["ring_proto"] = {"Simple": [0.0, hop_intra, hop_inter, 1.0, 0.0, 0.0, 0.0]}
    out["nvls_bw"] = 0.0
    out["name"] = name
    out["description"] = f"{hw.name} with links fitted to nccl-tests logs: {'; '.join(notes)}"
    out["sources"] = list(hw.sources) + [f"links fitted by `simpar bench --fit-profile` to {', '.join(logs)}"]
    return out
