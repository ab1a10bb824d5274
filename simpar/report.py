"""Output: the metrics JSON, the tables on the terminal, and files written safely.

Files are written to a temporary name in the same folder and renamed into place, so a reader
never sees half a file (rename is atomic on POSIX) and a crash leaves the old file intact.
"""
from __future__ import annotations

import json
import os
import tempfile

import numpy as np

CATS = ("data", "model", "activation")


# -- files ----------------------------------------------------------------------------------------

def writable(path: str) -> bool:
    """Can a file be written (by rename) at `path`? Its folder must exist and be writable, and
    `path` itself must not be a folder."""
    folder = os.path.dirname(os.path.abspath(path))
    return os.path.isdir(folder) and os.access(folder, os.W_OK) and not os.path.isdir(path)


def atomic_write(path: str, write_fn, binary: bool = False) -> None:
    from .config import SimparError
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise SimparError(f"cannot write {path}: it is a folder")
    try:
        fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise SimparError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write_fn(f)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)          # mkstemp makes 0600; a results file should be readable
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_json(path, what: str):
    """A JSON file the user named (metrics, hardware profile, trace), or one clear SimparError."""
    from .config import SimparError
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as exc:
        raise SimparError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise SimparError(f"{what} {path} is not valid JSON: {exc}") from None


def write_json(path: str, obj) -> None:
    atomic_write(path, lambda f: json.dump(obj, f, indent=1, default=_jsonable))


def _jsonable(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value)}")


def write_weights(path: str, weights) -> None:
    arrays = {}
    for i, (W, b) in enumerate(weights):
        arrays[f"W{i}"], arrays[f"b{i}"] = W, b
    atomic_write(path, lambda f: np.savez(f, **arrays), binary=True)


def write_trace(path: str, per_rank_events) -> None:
    """Chrome trace JSON (open in Perfetto / chrome://tracing): one pid per rank."""
    events = [e for rank_events in per_rank_events if rank_events for e in rank_events]
    atomic_write(path, lambda f: json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f))


# -- the metrics document -----------------------------------------------------------------------

def build_metrics(cfg, world_size, mesh, params, losses, epoch_log, gathered, elapsed, steps, kernels_name,
                  step_times, eval_s: float = 0.0) -> dict:
    gathered = sorted(gathered, key=lambda g: g["rank"])
    ranks, mem = [], []
    for g in gathered:
        led = g["ledger"]
        pp_i, dp_i, tp_i = g["coords"]
        ranks.append({"rank": g["rank"], "coords": {"pp": pp_i, "dp": dp_i, "tp": tp_i},
                      "sent": {c: led["sent"][c] for c in CATS}, "received": {c: led["received"][c] for c in CATS},
                      "messages": {c: led["messages"][c] for c in CATS},
                      "control_sent": led["sent"]["control"],
                      "by_op": led["by_op"], "by_peer": led["by_peer"]})
        mem.append(g["memory"])
    total_sent = {c: sum(r["sent"][c] for r in ranks) for c in CATS}
    modeled = sorted({op for g in gathered for op in g["ledger"]["modeled_ops"] if not op.startswith("control/")})
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
        "comm": {"ranks": ranks, "total_sent": total_sent,
                 "per_step": {c: total_sent[c] / steps for c in CATS},
                 "per_rank_per_step_max": {c: max(r["sent"][c] for r in ranks) / steps for c in CATS},
                 "modeled_ops": modeled},
        "memory": {"ranks": mem, "max": {k: max(m[k] for m in mem) for k in mem[0]}},
        # total_s is the wall clock of the loop; step_s and samples_per_s leave out the per-epoch evaluation
        "time": {"total_s": elapsed, "eval_s": eval_s, "step_s": (elapsed - eval_s) / steps,
                 "samples_per_s": steps * cfg.batch / max(elapsed - eval_s, 1e-12),
                 # the median step (rank 0's clock) ignores warm-up, e.g. Numba compiling on step 1
                 "step_s_median": float(np.median(step_times)),
                 "samples_per_s_median": cfg.batch / float(np.median(step_times))},
    }


def layout_name(cfg) -> str:
    parts = []
    if cfg.dp and cfg.dp > 1:
        parts.append(f"dp{cfg.dp}")
    if cfg.zero:
        parts.append(f"zero{cfg.zero}")
    if cfg.tp > 1:
        parts.append(f"tp{cfg.tp}")
    if cfg.pp > 1:
        parts.append(f"pp{cfg.pp}-{cfg.schedule}")
    return "x".join(parts) if parts else "serial"


# -- the terminal ---------------------------------------------------------------------------------

def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def print_summary(m: dict) -> None:
    acc = f"{m['accuracy']:.3f}" if m.get("accuracy") is not None else "n/a"
    t = m["time"]
    print(f"\n{m['layout']} on {m['world_size']} rank(s), {m['params']:,} parameters, kernels {m['kernels']}: "
          f"final loss {m['final_loss']:.4f}, validation accuracy {acc}, "
          f"{t['samples_per_s']:.0f} samples/s, {t['total_s']:.2f} s")
    print(f"bytes sent per rank per step, by category (received in brackets; {m['steps']} steps; "
          f"control traffic for logging not shown):")
    header = f"{'rank':>4} {'pp,dp,tp':>9} | " + " | ".join(f"{c:>23}" for c in CATS)
    print(header)
    print("-" * len(header))
    steps = m["steps"]
    for r in m["comm"]["ranks"]:
        c = r["coords"]
        cells = [f"{fmt_bytes(r['sent'][cat] / steps):>10} ({fmt_bytes(r['received'][cat] / steps):>10})"
                 for cat in CATS]
        print(f"{r['rank']:>4} {c['pp']:>5},{c['dp']},{c['tp']} | " + " | ".join(cells))
    tot = m["comm"]["total_sent"]
    print("all ranks sent: " + ", ".join(f"{c} {fmt_bytes(tot[c])}" for c in CATS)
          + (f"  (modeled: {', '.join(m['comm']['modeled_ops'])})" if m["comm"]["modeled_ops"] else ""))
    mm = m["memory"]["max"]
    print("memory per rank (max): " + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in mm.items()))
    pred = m.get("predicted")
    if pred is not None:
        bad = m.get("prediction_mismatches") or []
        verdict = ("exact (bytes per category per rank; params/grads/optimizer memory)" if not bad
                   else f"{len(bad)} mismatch(es): " + "; ".join(bad[:3]))
        print(f"cost model: {verdict}; step time predicted {1000 * pred['time']['step_s']:.2f} ms "
              f"vs measured median {1000 * m['time']['step_s_median']:.2f} ms "
              "(hardware profile 'local'; run `python -m simpar bench --calibrate` to measure it)")


def plot_main(argv: list[str]) -> int:
    from .plots import plot_main as _plot_main
    return _plot_main(argv)
