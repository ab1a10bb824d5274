"""The metrics document `--metrics-out` writes (rank 0): see "The metrics JSON" in docs/cli.md."""

from __future__ import annotations

import numpy as np

from ..config import layout_name

CATS = ("data", "model", "activation")


def build_metrics(
    cfg,
    world_size,
    mesh,
    params,
    losses,
    epoch_log,
    gathered,
    elapsed,
    steps,
    kernels_name,
    step_times,
    eval_s: float = 0.0,
) -> dict:
    gathered = sorted(gathered, key=lambda g: g["rank"])
    with_cp = any(g["coords"][3] for g in gathered)  # the cp coordinate, named when --cp is used
    ranks, mem = [], []
    for g in gathered:
        led = g["ledger"]
        pp_i, dp_i, tp_i, cp_i = g["coords"]
        ranks.append(
            {
                "rank": g["rank"],
                "coords": {"pp": pp_i, "dp": dp_i, "tp": tp_i, **({"cp": cp_i} if with_cp else {})},
                "sent": {c: led["sent"][c] for c in CATS},
                "received": {c: led["received"][c] for c in CATS},
                "messages": {c: led["messages"][c] for c in CATS},
                "control_sent": led["sent"]["control"],
                "by_op": led["by_op"],
                "by_peer": led["by_peer"],
            }
        )
        mem.append(g["memory"])
    total_sent = {c: sum(r["sent"][c] for r in ranks) for c in CATS}
    modeled = sorted(
        {op for g in gathered for op in g["ledger"]["modeled_ops"] if not op.startswith("control/")}
    )
    return {
        "config": cfg.to_dict(),
        "world_size": world_size,
        "mesh": mesh.describe(),
        "layout": layout_name(cfg),
        "params": params,
        "kernels": kernels_name,
        "steps": steps,
        "losses": losses,
        "final_loss": losses[-1] if losses else None,
        "accuracy": None,
        "epochs": epoch_log,
        "comm": {
            "ranks": ranks,
            "total_sent": total_sent,
            "per_step": {c: total_sent[c] / steps for c in CATS},
            "per_rank_per_step_max": {c: max(r["sent"][c] for r in ranks) / steps for c in CATS},
            "modeled_ops": modeled,
        },
        "memory": {"ranks": mem, "max": {k: max(m[k] for m in mem) for k in mem[0]}},
        # total_s is the wall clock of the loop; step_s and samples_per_s leave out the per-epoch evaluation
        "time": {
            "total_s": elapsed,
            "eval_s": eval_s,
            "step_s": (elapsed - eval_s) / steps,
            "samples_per_s": steps * cfg.batch / max(elapsed - eval_s, 1e-12),
            # the median step (rank 0's clock) ignores warm-up, e.g. Numba compiling on step 1
            "step_s_median": float(np.median(step_times)),
            "samples_per_s_median": cfg.batch / float(np.median(step_times)),
        },
    }


def sim_summary(per_rank_steps: list, cfg, hw, predicted: dict, serial_step_s: float | None = None) -> dict:
    """`time.sim` of the metrics: one step in SIMULATED seconds on the hardware profile `hw`.

    Every step of a --compute model run takes the same simulated time, so each figure is the median
    over steps (robust to the warm-up of --compute measured). Per rank: compute, exposed and
    overlapped communication, idle (compute + exposed + idle = step); the top-level figures are
    their averages over ranks. `predicted_step_s` is the cost model's step on the same profile.
    """
    keys = ("step_s", "compute_s", "comm_exposed_s", "comm_overlapped_s", "idle_s")
    per_rank = []
    for rank, steps in enumerate(per_rank_steps):
        per_rank.append({"rank": rank, **{k: float(np.median([s[k] for s in steps])) for k in keys}})
    step = per_rank[0]["step_s"]
    out = {
        "unit": f"simulated seconds on {hw.name}",
        "hardware": hw.name,
        "compute_model": cfg.compute,
        "step_s": step,
        "samples_per_s": cfg.batch / step if step > 0 else float("inf"),
        **{k: float(np.mean([r[k] for r in per_rank])) for k in keys[1:]},
        "per_rank": per_rank,
        "predicted_step_s": predicted["time"]["step_s"],
    }
    if serial_step_s:
        out["serial_step_s_predicted"] = serial_step_s
        out["speedup_vs_serial_predicted"] = serial_step_s / step if step > 0 else None
    return out


def alltoall_per_step(m: dict) -> float:
    """Bytes per step of expert parallelism's all-to-all ops (activation/ep-*), all ranks together."""
    ops = (
        v["sent"] for r in m["comm"]["ranks"] for k, v in r["by_op"].items() if k.startswith("activation/ep-")
    )
    return sum(ops) / max(m["steps"], 1)


def modeled_ops(m: dict) -> list[str]:
    """The ops (category/op) of a run whose bytes were booked from a formula, not counted: MPI's own
    collectives (--collectives mpi) hide their messages, so Communicator.record_modeled books the
    bandwidth-optimal volume. Control traffic is left out, like everywhere else."""
    return list(m.get("comm", {}).get("modeled_ops") or [])


def bytes_verdict(m: dict) -> str:
    """How a run's bytes and shard memory compare with the cost model: "NO" (a mismatch), "modeled"
    (they agree, but some bytes were booked from the same formula the cost model uses, so for those
    the agreement is by construction, not a measurement) or "exact"."""
    if m.get("prediction_mismatches"):
        return "NO"
    return "modeled" if modeled_ops(m) else "exact"
