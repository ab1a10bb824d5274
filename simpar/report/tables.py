"""What `simpar train` prints at the end: bytes per rank by category, memory, the cost model's verdict."""

from __future__ import annotations

import numpy as np

from ..costmodel import hardware
from ..units import fmt_bytes
from .metrics import CATS, bytes_verdict, modeled_ops


def print_summary(m: dict) -> None:
    acc = f"{m['accuracy']:.3f}" if m.get("accuracy") is not None else "n/a"
    t = m["time"]
    print(
        f"\n{m['layout']} on {m['world_size']} rank(s), {m['params']:,} parameters, kernels {m['kernels']}: "
        f"final loss {m['final_loss']:.4f}, validation accuracy {acc}, "
        f"{t['samples_per_s']:.0f} samples/s, {t['total_s']:.2f} s"
    )
    print(
        f"bytes sent per rank per step, by category (received in brackets; {m['steps']} steps; "
        f"control traffic for logging not shown):"
    )
    modeled = modeled_ops(m)
    modeled_cats = {op.split("/")[0] for op in modeled}
    # A category holding modeled bytes is starred: those numbers were not counted off the wire.
    header = f"{'rank':>4} {'pp,dp,tp':>9} | " + " | ".join(
        f"{c + ('*' if c in modeled_cats else ''):>23}" for c in CATS
    )
    print(header)
    print("-" * len(header))
    steps = m["steps"]
    for r in m["comm"]["ranks"]:
        c = r["coords"]
        cells = [
            f"{fmt_bytes(r['sent'][cat] / steps):>10} ({fmt_bytes(r['received'][cat] / steps):>10})"
            for cat in CATS
        ]
        print(f"{r['rank']:>4} {c['pp']:>5},{c['dp']},{c['tp']} | " + " | ".join(cells))
    tot = m["comm"]["total_sent"]
    print("all ranks sent: " + ", ".join(f"{c} {fmt_bytes(tot[c])}" for c in CATS))
    if modeled:
        print(
            f"* modeled, not counted: {', '.join(modeled)} (MPI's own collectives hide their messages; "
            "the ledger books the bandwidth-optimal volume)"
        )
    mm = m["memory"]["max"]
    print("memory per rank (max): " + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in mm.items()))
    if m.get("moe"):
        print_moe(m["moe"])
    pred = m.get("predicted")
    if pred is not None:
        bad = m.get("prediction_mismatches") or []
        verdict = {
            "exact": "exact (bytes per category per rank; params/grads/optimizer memory)",
            "modeled": "agrees (bytes per category per rank; params/grads/optimizer memory), but the "
            f"bytes of {', '.join(modeled)} are modeled from the same formula, so they agree by "
            "construction, not by measurement",
            "NO": f"{len(bad)} mismatch(es): " + "; ".join(bad[:3]),
        }[bytes_verdict(m)]
        sim = m["time"].get("sim")
        if sim:  # --clock sim: the step in simulated time on the profile, beside the prediction
            parts = ", ".join(
                f"{name} {sim[key] / sim['step_s']:.0%}"
                for key, name in (
                    ("compute_s", "compute"),
                    ("comm_exposed_s", "exposed comm"),
                    ("comm_overlapped_s", "overlapped comm"),
                    ("idle_s", "idle"),
                )
            )
            print(f"cost model: {verdict}")
            print(
                f"simulated on {sim['hardware']}: {sim['step_s'] * 1e6:.2f} us per step, "
                f"{sim['samples_per_s']:,.0f} samples/s ({parts}, averaged over ranks); "
                f"cost model {pred['time']['step_s'] * 1e6:.2f} us"
            )
            return
        # the prediction is on --hardware (default `local`); ask to calibrate only when it is the defaults
        name = pred.get("hardware", "local")
        profile = (
            "hardware profile 'local', uncalibrated defaults: run `python -m simpar bench --calibrate` "
            "to measure this machine"
            if name == "local" and hardware.load("local") is hardware.LOCAL_DEFAULTS
            else "hardware profile 'local', measured by `python -m simpar bench --calibrate`"
            if name == "local"
            else f"hardware profile '{name}'"
        )
        print(
            f"cost model: {verdict}; step time predicted {1000 * pred['time']['step_s']:.2f} ms "
            f"vs measured median {1000 * m['time']['step_s_median']:.2f} ms ({profile})"
        )


def print_moe(moe: dict) -> None:
    """Tokens each expert kept (mean per step), drops per step, and the all-to-all vs balanced routing."""
    steps = max(len(moe["tokens_per_expert"]), 1)  # entries: one per micro-step (--grad-accum)
    unit = "micro-step" if moe.get("grad_accum", 1) > 1 else "step"
    print(
        f"experts: {moe['experts']} per MoE layer, top-{moe['top_k']}, capacity {moe['capacity']} "
        f"tokens per expert (factor {moe['capacity_factor']:g}), ep {moe['ep']}"
    )
    for k, layer in enumerate(moe["layers"]):
        kept = np.mean([step[k] for step in moe["tokens_per_expert"]], axis=0)
        dropped = sum(step[k] for step in moe["dropped"]) / steps
        print(
            f"  layer {layer}: tokens per expert (mean per {unit}) {' '.join(f'{t:.1f}' for t in kept)}; "
            f"dropped {dropped:.1f} per {unit}"
        )
    a2a = moe.get("activation_per_step")
    if a2a:
        print(
            f"  all-to-all per step (all ranks): {fmt_bytes(a2a['measured'])} as routed, "
            f"{fmt_bytes(a2a['balanced'])} if routing were balanced"
        )
