"""Context parallelism with MoE blocks (--arch gpt --experts E --ep P --cp C --dp D) in closed form:
parallel/context_expert.py's bytes written again (nothing here calls it), from cp.py's K/V rules and
gpt_moe.py's all-to-all rules.

World rank r = d C + c (mesh.py with pp = tp = 1). Micro-step k has B_k = chunk(B, G, k) global rows;
dp rank d holds b_d = chunk(B_k, D, d) of them (rows g = start_d .. start_d + b_d - 1) and cp rank c of
each holds chunks c and 2C-1-c of m = s/(2C) tokens: n = b_d s/C tokens.

Routing, exactly. The global token order is a sequence of segments of m tokens, row g's chunk q
being segment i = 2C g + q, so rank (d, c) holds segments {2C g + c, 2C g + 2C-1-c : g in d's rows}.
With T_i[e] the assignments of segment i to expert e (metrics["moe"]["routed_by_segment"], what the
router chose) and cap_k = ceil(C_f K B_k s / E):
    kept_i[e]    = clip(cap_k - sum_{i' < i} T_{i'}[e], 0, T_i[e])     (kept_in_row_order over segments)
    kept[d,c][e] = sum over rank (d, c)'s segments i of kept_i[e]
Per block and micro-step, rank (d, c), ep rank j = d mod P of the ep group d - j .. d - j + P - 1 at
cp coordinate c (experts j E/P .. (j+1) E/P - 1), sends h wide, P-1 messages each (pairwise):
    ep-dispatch, ep-combine-grad   sum_{e not on j} kept[d,c][e] x h x bpe
    ep-combine, ep-dispatch-grad   sum_{d' in the group, d' != d} sum_{e on j} kept[d',c][e] x h x bpe
Without the routing: balanced and no drops, kept[d,c][e] = b_d (s/C) K / E.
Per block and micro-step, the attention's traffic is cp.py's: cp_kv_bytes(b_d, s/C, h, C, algo, bpe)
in cp_messages(C, algo) messages (ring `cp-kv`, Ulysses `cp-alltoall`).
Per step (model, ring all-reduce): the non-expert parameters M (gpt_moe.param_counts) over the D C
ranks of the dpcp group (rank r), the rank's L E/P experts over the D/P x C ranks of the edpcp group
(its rank (d div P) C + c). Control (not counted): the segment table's all-gather.

Memory: (M + L E/P (8h^2 + 5h)) x bytes for params, grads and optimizer state; activations as
gpt_moe.py's with n = b_d s/C tokens, the attention's kept scores those of cp.py (ring: the a s/C
log-sum-exp per sequence in the wide type; Ulysses: a s x s/C per sequence). Time (ring: --cp
with --experts runs no other): as --clock sim charges it, gpt_moe_time.py with each cp group's hops
(cp_hop_time.py).
"""

from __future__ import annotations

from .collectives import ALLREDUCE, Cost, chunk, to_bytes
from .cp import cp_kv_bytes, cp_messages, wide_bytes
from .gpt import rank_record
from .gpt_moe import capacity, model_states, moe_run_result, param_counts
from .moe import EpAlltoalls, kept_in_row_order
from .spec import PRECISIONS, precision_of, split


def segments_of(rows: int, D: int, C: int, d: int, c: int) -> list[int]:
    """Global indices of rank (d, c)'s segments (module docstring): 2C g + c, 2C g + 2C-1-c."""
    start = sum(chunk(rows, D, q) for q in range(d))
    return [2 * C * g + q for g in range(start, start + chunk(rows, D, d)) for q in (c, 2 * C - 1 - c)]


def kept_by_rank(T: list, cap: int, D: int, C: int) -> list:
    """kept[c][d][e] from one block's segment table T (2C B_k x E): the module docstring's sums."""
    kept = kept_in_row_order(T, cap)
    rows, E = len(T) // (2 * C), len(T[0])
    return [
        [[sum(kept[i][e] for i in segments_of(rows, D, C, d, c)) for e in range(E)] for d in range(D)]
        for c in range(C)
    ]


def micro_kept(cfg, D: int, C: int, routing: dict | None, steps: int) -> list:
    """[(micro-step k, [kept[c][d][e] per block])], step-major: exact from the routing, else balanced."""
    G, s, E, K = cfg.grad_accum, cfg.seq_len, cfg.experts, cfg.top_k
    seqs = split(cfg.batch, G)
    if routing is not None:
        return [
            (i % G, [kept_by_rank(T, capacity(cfg, seqs[i % G] * s), D, C) for T in micro])
            for i, micro in enumerate(routing["routed_by_segment"])
        ]
    balanced = lambda k: [[[chunk(seqs[k], D, d) * s / C * K / E] * E for d in range(D)]] * C  # noqa: E731
    return [(k, [balanced(k)] * cfg.blocks) for _ in range(steps) for k in range(G)]


def activation_bytes(cfg, blocks: list, d: int, c: int, k: int, D: int, bpe: int) -> float:
    """Rank (d, c)'s activations at the end of micro-step k's forward (module docstring)."""
    h, a, s, E, P, C = cfg.hidden, cfg.heads, cfg.seq_len, cfg.experts, cfg.ep, cfg.cp
    b = chunk(split(cfg.batch, cfg.grad_accum)[k], D, d)
    n, per, j = b * s // C, E // P, d % P
    scores = b * a * (s // C) * wide_bytes(bpe) if cfg.cp_algo == "ring" else b * a * s * (s // C) * bpe
    router_bpe = 4 if precision_of(cfg) == "mixed" else bpe
    total = 8 * n + (2 * n * h + n) * bpe
    routed = {}  # id(kept[c]) -> (d's kept assignments, rows its experts received): once per matrix
    for kept in blocks:
        mine = kept[c]
        if id(mine) not in routed:
            group, ours = range(d - j, d - j + P), range(j * per, (j + 1) * per)
            routed[id(mine)] = (sum(mine[d]), sum(mine[q][e] for q in group for e in ours))
        assigned, received = routed[id(mine)]
        total += (n * (7 * h + 2) + n * h + assigned * h + 9 * h * received) * bpe + scores
        total += n * E * router_bpe
    return total


def predict_cp_moe_run(cfg, world_size: int, steps: int, hw, routing: dict | None = None) -> dict:
    """Per-rank bytes (totals over `steps`), memory and the step time on `hw`, keyed like the metrics."""
    C, P, h, L = cfg.cp, cfg.ep, cfg.hidden, cfg.blocks
    D = cfg.dp if cfg.dp is not None else world_size // C
    prec = PRECISIONS[precision_of(cfg)]
    bpe, s = prec.act, cfg.seq_len
    micro = micro_kept(cfg, D, C, routing, steps)
    steps = len(micro) // cfg.grad_accum if routing is not None else steps
    dense, experts = param_counts(cfg)
    opt_bpp = prec.optimizer[(cfg.optimizer, bool(cfg.momentum))]
    cp_op = "cp-kv" if cfg.cp_algo == "ring" else "cp-alltoall"
    ranks, memory = [], []
    alltoalls = EpAlltoalls(cfg.experts, P, h, cfg.alltoall)  # each (matrix, rank) once: moe.py
    for r in range(D * C):
        d, c = divmod(r, C)
        activation: dict[str, Cost] = {}

        def add(ops: dict, op: str, cost: Cost) -> None:
            if cost.messages:
                ops[op] = ops.get(op, Cost()) + cost

        for k, blocks in micro:
            b = chunk(split(cfg.batch, cfg.grad_accum)[k], D, d)
            kv = cp_kv_bytes(b, s // C, h, C, cfg.cp_algo, bpe)
            add(activation, cp_op, Cost(sent=kv * L, messages=cp_messages(C, cfg.cp_algo) * L))
            for kept in blocks if P > 1 else []:
                for op, a2a in alltoalls(kept[c], d).items():
                    add(activation, op, to_bytes(Cost(a2a.sent, a2a.messages), bpe))
        model: dict[str, Cost] = {}
        add(model, "grad-allreduce", to_bytes(ALLREDUCE[cfg.collectives](dense, D * C, r), prec.grad, steps))
        edp = (D // P) * C
        expert_cost = ALLREDUCE[cfg.collectives](experts, edp, (d // P) * C + c)
        add(model, "expert-grad-allreduce", to_bytes(expert_cost, prec.grad, steps))
        coords = {"pp": 0, "dp": d, "cp": c, "tp": 0}
        ranks.append(rank_record(r, coords, model=model, activation=activation))
        n = dense + experts
        peak = max(activation_bytes(cfg, blocks, d, c, k, D, bpe) for k, blocks in micro)
        memory.append(model_states(n, prec, opt_bpp, peak))
    from .gpt_moe_time import moe_step_seconds  # as --clock sim charges it

    timed = moe_step_seconds(cfg, D, hw, micro, (dense, experts), bpe, prec.grad)
    timing = (timed["step_s"], timed["compute_s"], timed["comm_s"])
    return moe_run_result(
        cfg,
        hw,
        steps,
        ranks,
        memory,
        dense + experts * P,
        timing,
        routing,
        split(cfg.batch, cfg.grad_accum)[0] * s,
    )
