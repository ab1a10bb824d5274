"""--zero 1 with --tp and/or --pp (and --cp) on --arch gpt, in closed form: parallel/zero_mesh.py's bytes
and memory, written again (never calling it).

ZeRO-1 (Rajbhandari et al. 2020, sec. 5.1 and 7.2.1; Megatron-LM's distributed optimizer) inside a
model-parallel mesh: the p = dp C ranks holding the same model shard (the dp group, or dp x cp: the
mesh's `dpcp`) shard that shard's optimizer state. World rank r = ((st dp + d) C + c) T + j (mesh.py:
pp, dp, cp, tp, tp fastest); its sharding-group rank is g = d C + c. Its STORES are the flat parameter
vectors it holds: without --pp one, its tp slice of every unit (gpt_tp.local_unit_sizes; all units
whole for T = 1); with --pp one per model chunk k it runs (order.stage_chunks), n_k = the sum of its
units' local sizes (the chunk bounds are the base prediction's `stage_units`).

Per rank per step (model category; chunk(n, p, g) = np.array_split's g-th size):
    grad-reduce-scatter  sum_k  n_k - chunk(n_k, p, g)      elements of gradient bytes, p - 1 messages each
    param-all-gather     sum_k  n_k - chunk(n_k, p, g + 1)  elements of the parameters' bytes
                         together 2(p-1)/p P_shard (P_shard = sum_k n_k), to a chunk's rounding
in place of the gradient all-reduce's buckets; --sp's "sp-grad-allreduce" over tp is unchanged.
Memory: params P_shard, grads P_shard (ZeRO-1 keeps both whole), optimizer K_opt sum_k chunk(n_k, p, g):
the layout's optimizer state / p. Everything else (tp's f and g, pp's boundaries, cp's K/V, the
activations) is the layout's own prediction, unchanged: ZeRO-1 adds no traffic during the micro-steps.
Time: zero_mesh_time.py.
"""

from __future__ import annotations

import copy
import dataclasses

from ..config import layout_name
from .collectives import Cost, chunk, ring_allgather, ring_reduce_scatter, to_bytes
from .gpt_tp import local_unit_sizes
from .order import stage_chunks
from .spec import PRECISIONS, precision_of


def coords(r: int, S: int, D: int, C: int, T: int) -> tuple[int, int, int, int]:
    """(stage, dp, cp, tp) of world rank r (mesh.py's numbering, tp fastest)."""
    rest, j = divmod(r, T)
    rest, c = divmod(rest, C)
    st, d = divmod(rest, D)
    return st, d, c, j


def rank_stores(cfg, st: int, bounds) -> list[int]:
    """Elements of each flat store of a rank on stage st (module docstring)."""
    local = local_unit_sizes(cfg.blocks, cfg.hidden, cfg.seq_len, cfg.vocab, cfg.tp)
    if cfg.pp == 1:
        return [sum(local)]
    Vs = cfg.virtual_stages if cfg.schedule == "interleaved" else 1
    return [sum(local[slice(*bounds[k])]) for k in stage_chunks(cfg.schedule, cfg.pp, Vs, st)]


def zero1_costs(stores: list[int], p: int, g: int, prec) -> tuple[Cost, Cost]:
    """(reduce-scatter, all-gather) bytes and messages of sharding-group rank g for one step."""
    rs, ag = Cost(), Cost()
    for n in stores:
        rs = rs + to_bytes(ring_reduce_scatter(n, p, g), prec.grad)
        ag = ag + to_bytes(ring_allgather(n, p, g), prec.param)
    return rs, ag


def without_zero(cfg):
    """The same configuration without --zero: the layout whose prediction ZeRO-1 edits."""
    if dataclasses.is_dataclass(cfg):
        return dataclasses.replace(cfg, zero=0)
    plain = copy.copy(cfg)
    plain.zero = 0
    return plain


def refresh_totals(cfg, steps: int, out: dict) -> dict:
    """After the ranks' model ops and memory were edited: their model sums, the per-step totals and
    maxima, the memory maxima and the layout's name (this file's and zero_tp.py's edits)."""
    for rank in out["comm"]["ranks"]:
        model = [v for k, v in rank["by_op"].items() if k.startswith("model/")]
        rank["sent"]["model"] = sum(v["sent"] for v in model)
        rank["messages"]["model"] = sum(v["messages"] for v in model)
    comm, cats = out["comm"], ("data", "model", "activation")
    comm["per_step"] = {k: sum(r["sent"][k] for r in comm["ranks"]) / max(steps, 1) for k in cats}
    comm["per_rank_per_step_max"] = {
        k: max(r["sent"][k] for r in comm["ranks"]) / max(steps, 1) for k in cats
    }
    memory = out["memory"]["ranks"]
    out["memory"]["max"] = {k: max(m[k] for m in memory) for k in memory[0]}
    out["layout"] = layout_name(cfg)
    return out


def predict_zero_mesh_run(cfg, world_size: int, steps: int, hw, out: dict) -> dict:
    """`out`, the layout's prediction without --zero (predict.py makes it), edited in place: its
    gradient all-reduce replaced by ZeRO-1's halves, its optimizer state by this rank's chunks."""
    S, C, T = cfg.pp, getattr(cfg, "cp", 1), cfg.tp
    D = cfg.dp if cfg.dp is not None else world_size // (S * C * T)
    p = D * C
    prec = PRECISIONS[precision_of(cfg)]
    opt_bpp = prec.optimizer[(cfg.optimizer, bool(cfg.momentum))]
    bounds = out.get("stage_units")
    for rank, mem in zip(out["comm"]["ranks"], out["memory"]["ranks"]):
        st, d, c, _ = coords(rank["rank"], S, D, C, T)
        stores, g = rank_stores(cfg, st, bounds), d * C + c
        rs, ag = zero1_costs(stores, p, g, prec)
        by_op = rank["by_op"]
        by_op.pop("model/grad-allreduce", None)
        for op, cost in (("grad-reduce-scatter", rs), ("param-all-gather", ag)):
            if cost.messages:
                by_op[f"model/{op}"] = {"sent": cost.sent * steps, "messages": cost.messages * steps}
        mem["optimizer"] = sum(chunk(n, p, g) for n in stores) * opt_bpp
    refresh_totals(cfg, steps, out)
    if hw is not None:  # the step's time, as the simulated clock charges it (zero_mesh_time.py)
        from .zero_mesh_time import zero1_pipeline_seconds, zero1_tp_seconds

        timed = (zero1_pipeline_seconds if S > 1 else zero1_tp_seconds)(cfg, D, hw)
        step_s = timed["step_s"]
        out["time"] = dict(
            out["time"],
            step_s=step_s,
            compute_s=timed["compute_s"],
            comm_s=timed["comm_s"],
            samples_per_s=cfg.batch / step_s if step_s > 0 else float("inf"),
        )
    return out
