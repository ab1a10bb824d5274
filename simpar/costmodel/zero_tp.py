"""--zero 2|3 with --tp on --arch gpt, in closed form: parallel/zero_tp.py's bytes and memory, written
again (never calling it).

ZeRO-2/3 (Rajbhandari et al. 2020, sec. 5.2, 5.3 and 7.2) inside each tp shard, unit by unit: a rank of
tp index j holds n_u = gpt_tp.local_unit_sizes' share of each unit u (embedding, blocks, head); the p = D
ranks of its dp group (dp index g, world rank r = g T + j) each own chunk(n_u, p, g) of every unit; with
--cp C the p = D C ranks of its dp x cp group (g = d C + c, world rank r = g T + j still). Per rank per
step (model category, K = --grad-accum, ring over p):

    grad-reduce-scatter   stage 2: sum_u n_u - chunk(n_u, p, g);   stage 3: K times that
    param-all-gather      stage 2: sum_u n_u - chunk(n_u, p, g+1); stage 3: 2K times that (forward and
                                                                    backward gather every unit)
    sp-grad-allreduce     (--sp) the tp layout's, and K times it under stage 3 (every micro-step)

in place of the tp layout's "grad-allreduce". Memory, S = sum_u chunk(n_u, p, g), n_max = max_u n_u,
P_T = sum_u n_u, in the prediction's parameter/gradient bytes, optimizer bytes per parameter opt_bpp:
    params     stage 2: P_T;  stage 3: S + n_max
    grads      S + n_max;  stage 2 with K > 1: S + P_T (the full accumulation buffer)
    optimizer  S opt_bpp
Everything else (tp's f and g, the vocabulary's collectives, the activations) is the tp layout's own
prediction. Time: zero_tp_time.py.
"""

from __future__ import annotations

from .collectives import Cost, chunk, ring_allgather, ring_reduce_scatter, to_bytes
from .gpt_tp import local_unit_sizes
from .spec import PRECISIONS, precision_of
from .zero_mesh import refresh_totals


def zero_tp_costs(units: list[int], p: int, g: int, stage: int, K: int, prec) -> tuple[Cost, Cost]:
    """(reduce-scatter, all-gather) bytes and messages of dp rank g for one step (module docstring)."""
    times = K if stage == 3 else 1
    rs, ag = Cost(), Cost()
    for n in units:
        rs = rs + to_bytes(ring_reduce_scatter(n, p, g), prec.grad, times)
        ag = ag + to_bytes(ring_allgather(n, p, g), prec.param, times * (2 if stage == 3 else 1))
    return rs, ag


def zero_tp_memory(units: list[int], p: int, g: int, stage: int, K: int, prec, opt_bpp: int) -> dict:
    """params, grads and optimizer bytes of dp rank g (module docstring)."""
    S, n_max, P = sum(chunk(n, p, g) for n in units), max(units), sum(units)
    return {
        "params": (P if stage == 2 else S + n_max) * prec.param,
        "grads": (S + (P if stage == 2 and K > 1 else n_max)) * prec.grad,
        "optimizer": S * opt_bpp,
    }


def predict_zero_tp_run(cfg, world_size: int, steps: int, hw, out: dict) -> dict:
    """`out`, the tp layout's prediction without --zero, edited in place (module docstring)."""
    T, C, stage, K = cfg.tp, getattr(cfg, "cp", 1), cfg.zero, cfg.grad_accum
    D = cfg.dp if cfg.dp is not None else world_size // (T * C)
    p = D * C  # the sharding group: dp, or dp x cp
    prec = PRECISIONS[precision_of(cfg)]
    opt_bpp = prec.optimizer[(cfg.optimizer, bool(cfg.momentum))]
    units = local_unit_sizes(cfg.blocks, cfg.hidden, cfg.seq_len, cfg.vocab, T)
    for rank, mem in zip(out["comm"]["ranks"], out["memory"]["ranks"]):
        g = rank["rank"] // T
        rs, ag = zero_tp_costs(units, p, g, stage, K, prec)
        by_op = rank["by_op"]
        by_op.pop("model/grad-allreduce", None)
        sp = by_op.get("model/sp-grad-allreduce")
        if sp is not None and stage == 3:  # summed over tp on every micro-step's buffers
            by_op["model/sp-grad-allreduce"] = {k: v * K for k, v in sp.items()}
        for op, cost in (("grad-reduce-scatter", rs), ("param-all-gather", ag)):
            if cost.messages:
                by_op[f"model/{op}"] = {"sent": cost.sent * steps, "messages": cost.messages * steps}
        mem.update(zero_tp_memory(units, p, g, stage, K, prec, opt_bpp))
    refresh_totals(cfg, steps, out)
    if hw is not None:  # the step's time, as the simulated clock charges it (zero_tp_time.py)
        from .zero_tp_time import zero_tp_seconds

        timed = zero_tp_seconds(cfg, D, hw)
        step_s = timed["step_s"]
        out["time"] = dict(
            out["time"],
            step_s=step_s,
            compute_s=timed["compute_s"],
            comm_s=timed["comm_s"],
            samples_per_s=cfg.batch / step_s if step_s > 0 else float("inf"),
        )
    return out
