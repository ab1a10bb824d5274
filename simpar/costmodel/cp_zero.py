"""--cp C with --zero 1|2|3 in closed form: ZeRO's bytes and memory over the p = dp C ranks of dp x cp.

parallel/context_zero.py shards the model states over the dpcp group exactly as zero.py shards them
over dp (Rajbhandari et al. 2020, sec. 5 and 7), so rank.py's ZeRO rules hold with p = dp C and the
gpt units' sizes n_l (gpt.unit_sizes; a cp rank's units hold the whole model), P = sum n_l, dpcp rank
g = d C + c, K = --grad-accum, chunk(n, p, g) = np.array_split's g-th size, bpe the element size:
  stage 1  reduce-scatter of P, all-gather of P (one each per step)
           params P, grads P, optimizer K_opt chunk(P, p, g)
  stage 2  per unit: reduce-scatter of n_l once, all-gather of n_l once
           params P, grads S_g + (P if K > 1 else n_max), optimizer K_opt S_g   (S_g = sum chunk(n_l, p, g))
  stage 3  per unit and micro-step: reduce-scatter once, all-gather twice (forward and backward)
           params S_g + n_max, grads S_g + n_max, optimizer K_opt S_g
A ring reduce-scatter of n sends n - chunk(n, p, g) elements, a ring all-gather n - chunk(n, p, g+1).
Everything else -- the cp K/V traffic and the activations -- is --cp's (cp.py), unchanged.
Time: cp_zero_time.py, as the simulated clock charges a step.
"""

from __future__ import annotations

from .collectives import Cost, chunk, ring_allgather, ring_reduce_scatter, to_bytes
from .cp import predict_cp_run
from .gpt import unit_sizes
from .spec import PRECISIONS, precision_of


def zero_model_cost(sizes: list[int], p: int, g: int, stage: int, K: int, prec) -> tuple[Cost, Cost]:
    """(reduce-scatter, all-gather) bytes of dpcp rank g per step (module docstring)."""
    if stage == 1:
        P = sum(sizes)
        rs, ag = ring_reduce_scatter(P, p, g), ring_allgather(P, p, g)
        return to_bytes(rs, prec.grad), to_bytes(ag, prec.param)
    passes = 1 if stage == 2 else K
    rs, ag = Cost(), Cost()
    for n in sizes:
        rs = rs + to_bytes(ring_reduce_scatter(n, p, g), prec.grad, passes)
        ag = ag + to_bytes(ring_allgather(n, p, g), prec.param, 1 if stage == 2 else 2 * passes)
    return rs, ag


def zero_memory(sizes: list[int], p: int, g: int, stage: int, K: int, prec, opt_bpp: int) -> dict:
    P, n_max = sum(sizes), max(sizes)
    if stage == 1:
        return {"params": P * prec.param, "grads": P * prec.grad, "optimizer": chunk(P, p, g) * opt_bpp}
    S = sum(chunk(n, p, g) for n in sizes)
    held = P if stage == 2 and K > 1 else n_max
    return {
        "params": (P if stage == 2 else S + n_max) * prec.param,
        "grads": (S + held) * prec.grad,
        "optimizer": S * opt_bpp,
    }


def predict_cp_zero_run(cfg, world_size: int, steps: int, hw) -> dict:
    """cp.predict_cp_run with its gradient all-reduce replaced by ZeRO's collectives and memory."""
    out = predict_cp_run(cfg, world_size, steps, hw)
    C = cfg.cp
    p = (cfg.dp if cfg.dp is not None else world_size // C) * C
    prec = PRECISIONS[precision_of(cfg)]
    sizes = unit_sizes(cfg.blocks, cfg.hidden, cfg.seq_len, cfg.vocab)
    opt_bpp = prec.optimizer[(cfg.optimizer, bool(cfg.momentum))]
    for rank, mem in zip(out["comm"]["ranks"], out["memory"]["ranks"]):
        g = rank["rank"]  # dpcp rank d C + c = world rank (pp = tp = 1)
        rs, ag = zero_model_cost(sizes, p, g, cfg.zero, cfg.grad_accum, prec)
        del rank["by_op"]["model/grad-allreduce"]
        for op, cost in (("grad-reduce-scatter", rs), ("param-all-gather", ag)):
            rank["by_op"][f"model/{op}"] = {"sent": cost.sent * steps, "messages": cost.messages * steps}
        rank["sent"]["model"] = (rs.sent + ag.sent) * steps
        rank["messages"]["model"] = (rs.messages + ag.messages) * steps
        mem.update(zero_memory(sizes, p, g, cfg.zero, cfg.grad_accum, prec, opt_bpp))
    comm = out["comm"]
    comm["per_step"]["model"] = sum(r["sent"]["model"] for r in comm["ranks"]) / max(steps, 1)
    comm["per_rank_per_step_max"]["model"] = max(r["sent"]["model"] for r in comm["ranks"]) / max(steps, 1)
    memory = out["memory"]["ranks"]
    out["memory"]["max"] = {k: max(m[k] for m in memory) for k in memory[0]}
    from .cp_zero_time import cp_zero_step_seconds  # as the simulated clock charges a step

    timed = cp_zero_step_seconds(cfg, p // C, sizes, hw, precision_of(cfg), prec.act)
    step_s = timed["step_s"]
    out["time"] = dict(
        out["time"],
        step_s=step_s,
        compute_s=timed["compute_s"],
        comm_s=timed["comm_s"],
        samples_per_s=cfg.batch / step_s if step_s > 0 else float("inf"),
    )
    return out
