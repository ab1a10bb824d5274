"""ZeRO with experts (--arch gpt --experts E --ep P --dp D [--cp C] [--tp T] --zero 1|2|3) in closed form:
parallel/expert_zero.py's (and context_expert_zero.py's) bytes and memory written again (never calling
them). With --cp C, read D C for D and (D/P) C for D/P below: world rank r = d C + c is rank r of the
dense parts' group (dpcp) and rank (d div P) C + c of its experts' (edpcp); the K/V traffic and the
all-to-alls are cp_moe.py's. With --tp T (parallel/expert_zero_tp.py) world rank r T + k is rank r of
its tp index's dp (x cp) and edp (x cp) groups, n_i is one tp rank's share (embedding V h/T + s h, a
block 4h^2/T + 3h/T + 5h + hE, head 2h + hV/T), and the rest -- tp's traffic, --sp's LayerNorm sums (K
times under stage 3, once a step otherwise) -- is gpt_moe_tp.py's (cp_moe_tp.py's with --cp).

The dense parameters shard over the D dp ranks, each rank's E/P experts over its Q = D/P
expert-data-parallel ranks (as DeepSpeed's ZeRO partitions MoE parameter groups). Unit by unit: unit i
has n_i dense elements -- embedding (V + s) h, a block's 4h^2 + 8h + hE, head 2h + hV -- and m_i of
the rank's experts, E/P (8h^2 + 5h) for a block, 0 otherwise. Rank d (edp rank q = d div P) sends per
step, ring (costmodel/collectives.py; chunk(n, p, r) = np.array_split's r-th size, RS and AG below):

  grad-reduce-scatter        sum_i RS(n_i, D, d) = n_i - chunk(n_i, D, d)        x R   gradient bytes
  param-all-gather           sum_i AG(n_i, D, d) = n_i - chunk(n_i, D, d + 1)    x A   parameter bytes
  expert-grad-reduce-scatter sum_i RS(m_i, Q, q)                                 x R
  expert-param-all-gather    sum_i AG(m_i, Q, q)                                 x A

with R = A = 1 for stages 1 and 2 (together an all-reduce's bytes, to a chunk's rounding: they replace
expert_gpt.py's two), R = G and A = 2G for stage 3 (G micro-steps, each gathering every unit for
forward and backward: Rajbhandari et al. 2020, sec. 7.2.2). The all-to-alls and the activations are
gpt_moe.py's, unchanged. Memory, with S = sum_i chunk(n_i, D, d) + chunk(m_i, Q, q) this rank's chunks,
U = max_i (n_i + m_i) one unit whole, W = sum_i (n_i + m_i) everything it would hold without ZeRO:
  params     stage 1/2: W;  stage 3: S + U            (parameter bytes)
  grads      stage 1: W;  stage 2: S + U, or S + W with --grad-accum > 1;  stage 3: S + U
  optimizer  K_opt S (K_opt: spec.PRECISIONS' optimizer bytes per parameter, masters included)
Time: gpt_moe_zero_time.py's step as the simulated clock charges it, every rank through every
all-to-all round and ZeRO ring.
"""

from __future__ import annotations

from ..config import layout_name
from .collectives import Cost, chunk, ring_allgather, ring_reduce_scatter, to_bytes
from .gpt_moe import predict_gpt_moe_run
from .spec import PRECISIONS, precision_of
from .zero_mesh import without_zero


def unit_sizes(cfg) -> list[tuple[int, int]]:
    """(n_i, m_i) per unit: dense elements (with --tp T one tp rank's share, gpt_moe_tp.dense_shard's
    pieces), and one rank's experts' (module docstring)."""
    L, h, s, V, E, P, T = cfg.blocks, cfg.hidden, cfg.seq_len, cfg.vocab, cfg.experts, cfg.ep, cfg.tp
    block = (4 * h * h // T + 3 * h // T + 5 * h + h * E, E // P * (8 * h * h + 5 * h))
    return [(V * h // T + s * h, 0)] + [block] * L + [(2 * h + h * V // T, 0)]


def groups(cfg, D: int, r: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """((size, rank) of the group the dense parts shard over, the same for the experts) of world rank
    r = d C + c: dp (dpcp with --cp, rank r itself) and edp (edpcp: rank (d div P) C + c); with --tp T
    world rank r T + k is rank r of its tp index's groups."""
    C, P = getattr(cfg, "cp", 1), cfg.ep
    r //= cfg.tp
    d, c = divmod(r, C)
    return (D * C, r), (D // P * C, d // P * C + c)


def zero_costs(cfg, D: int, r: int, prec) -> dict[str, Cost]:
    """One step's ZeRO collectives of world rank r, op -> bytes and messages (module docstring)."""
    G = cfg.grad_accum
    R, A = (G, 2 * G) if cfg.zero == 3 else (1, 1)
    ops = {}
    for (p, r), part, prefix in zip(groups(cfg, D, r), (0, 1), ("", "expert-")):
        rs = ag = Cost()
        for sizes in unit_sizes(cfg):
            rs = rs + to_bytes(ring_reduce_scatter(sizes[part], p, r), prec.grad, R)
            ag = ag + to_bytes(ring_allgather(sizes[part], p, r), prec.param, A)
        ops[f"{prefix}grad-reduce-scatter"], ops[f"{prefix}param-all-gather"] = rs, ag
    return {op: c for op, c in ops.items() if c.messages}


def zero_memory(cfg, D: int, r: int, prec) -> dict[str, int]:
    """params, grads and optimizer bytes of world rank r (module docstring)."""
    (p, g), (q, h) = groups(cfg, D, r)
    sizes = unit_sizes(cfg)
    S = sum(chunk(n, p, g) + chunk(m, q, h) for n, m in sizes)
    U, W = max(n + m for n, m in sizes), sum(n + m for n, m in sizes)
    params = W if cfg.zero < 3 else S + U
    grads = W if cfg.zero == 1 else S + (W if cfg.zero == 2 and cfg.grad_accum > 1 else U)
    opt_bpp = prec.optimizer[(cfg.optimizer, bool(cfg.momentum))]
    return {"params": params * prec.param, "grads": grads * prec.grad, "optimizer": S * opt_bpp}


def _sim_step(cfg, D: int, C: int, hw, routing, steps: int, bpe: int) -> dict:
    """gpt_moe_zero_time.py's step on the run's routing (or balanced): {step_s, compute_s, comm_s}."""
    from .gpt_moe_zero_time import moe_zero_step_seconds

    if C > 1:
        from .cp_moe import micro_kept

        micro = micro_kept(cfg, D, C, routing, steps)
    else:
        from .gpt_moe import kept_per_micro_step

        micro = kept_per_micro_step(cfg, D, routing, steps)
    timed = moe_zero_step_seconds(cfg, D, hw, micro, unit_sizes(cfg), bpe)
    return {k: timed[k] for k in ("step_s", "compute_s", "comm_s")}


def predict_gpt_moe_zero_run(cfg, world_size: int, steps: int, hw, routing: dict | None = None) -> dict:
    """gpt_moe.py's (with --cp: cp_moe.py's) prediction of the layout without --zero, its gradient
    all-reduces replaced by ZeRO's reduce-scatters and all-gathers and its model states by this rank's
    (module docstring)."""
    C, T = getattr(cfg, "cp", 1), cfg.tp
    if C > 1 and T > 1:  # expert_zero_tp.ContextExpertZeroTensor: context_expert_tensor.py's, sharded
        from .cp_moe_tp import predict_cp_moe_tp_run as predict_plain
    elif C > 1:
        from .cp_moe import predict_cp_moe_run as predict_plain
    elif T > 1:  # parallel/expert_zero_tp.py: expert_tensor_gpt.py's layout, sharded
        from .gpt_moe_tp import predict_gpt_moe_tp_run as predict_plain
    else:
        predict_plain = predict_gpt_moe_run
    out = predict_plain(without_zero(cfg), world_size, steps, hw, routing)
    D = cfg.dp if cfg.dp is not None else world_size // (C * T)
    prec = PRECISIONS[precision_of(cfg)]
    steps = out["steps"]  # with the run's routing: the steps it routed
    for r, (rank, mem) in enumerate(zip(out["comm"]["ranks"], out["memory"]["ranks"])):
        by_op, costs = rank["by_op"], zero_costs(cfg, D, r, prec)
        for op in ("model/grad-allreduce", "model/expert-grad-allreduce"):
            by_op.pop(op, None)
        sp = by_op.get("model/sp-grad-allreduce")  # --tp --sp: stage 3 sums every micro-step's
        if sp is not None and cfg.zero == 3:
            by_op["model/sp-grad-allreduce"] = {k: v * cfg.grad_accum for k, v in sp.items()}
        for op, c in costs.items():
            by_op[f"model/{op}"] = {"sent": c.sent * steps, "messages": c.messages * steps}
        model = [v for k, v in by_op.items() if k.startswith("model/")]
        rank["sent"]["model"] = sum(v["sent"] for v in model)
        rank["messages"]["model"] = sum(v["messages"] for v in model)
        mem.update(zero_memory(cfg, D, r, prec))
    comm, cats = out["comm"], ("data", "model", "activation")
    per = max(steps, 1)
    comm["per_step"] = {k: sum(r["sent"][k] for r in comm["ranks"]) / per for k in cats}
    comm["per_rank_per_step_max"] = {k: max(r["sent"][k] for r in comm["ranks"]) / per for k in cats}
    memory = out["memory"]["ranks"]
    out["memory"]["max"] = {k: max(m[k] for m in memory) for k in memory[0]}
    out["layout"] = layout_name(cfg)
    step = _sim_step(cfg, D, C, hw, routing, steps, prec.act)  # as --clock sim charges it
    out["time"] = dict(
        out["time"],
        **step,
        samples_per_s=cfg.batch / step["step_s"] if step["step_s"] > 0 else float("inf"),
    )
    return out
