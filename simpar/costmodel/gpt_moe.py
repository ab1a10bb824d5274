"""The MoE transformer (--arch gpt --experts E [--ep P] --dp D) in closed form: parallel/expert_gpt.py's
bytes and memory written again, with costmodel/moe.py's routing rules (the MLP's, reused).

Tokens, not rows: micro-step k of G has N_k = chunk(B, G, k) s global tokens (B sequences of s), dp
rank d holds n_d = chunk(chunk(B, G, k), D, d) s of them, in global order after lower ranks'. Each of
the L blocks routes them (top-K of E, capacity cap_k = ceil(C K N_k / E) filled in that order:
moe.kept_in_row_order), so with kept[s][e] the assignments of rank s that expert e keeps, per block
and micro-step, rank d (ep rank j = d mod P of the group starting at g = d - j) sends, h wide,

  ep-dispatch, ep-combine-grad   sum_{e not on j} kept[d][e] x h x bpe
  ep-combine, ep-dispatch-grad   sum_{s in g..g+P-1, s != d} sum_{e on j} kept[s][e] x h x bpe

each in P-1 messages (--alltoall pairwise; bruck: moe.py's Bruck sum), category activation. The
routing makes these data-dependent: the exact numbers come from the run's routing histograms
(metrics["moe"]["routed_by_rank"], what the router chose; which of them fit is decided here again);
without them, balanced routing and no drops: kept[s][e] = n_s K / E, i.e. per block and micro-step
4 x (P-1)/P x n_d K h bpe in all four. Once per step (model): the non-expert parameters
M = (V + s) h + L (4h^2 + 8h + hE) + 2h + hV all-reduced over the D dp ranks, and the rank's
L E/P experts of 8h^2 + 5h over its D/P expert-data-parallel ranks (ring: 2(p-1)/p x n each).
ep-histogram (control, not counted in the three categories): D x E int64 per block.

Memory: (M + L E/P (8h^2 + 5h)) x bytes for params, grads and optimizer state. Activations kept at the
end of the fullest micro-step's forward, per rank (elements, model dtype; tokens int64):
  embedding 8 n bytes (token ids); head 2 n h + n (LN_f's xh, its output, 1/sigma)
  per block n (7h + a s + 2) (LN1's xh, attention's input, q k v, its output, scores, LN2's xh, two
  1/sigma -- gpt.py's block without its MLP), the FFN's input n h, the router's n E probabilities
  (4-byte float32 under --precision mixed-bf16: Switch's selective precision), the kept outputs that
  came back sum_e kept[d][e] h, and 9h (input, W1's output, GELU's) per row each of the rank's
  experts received from its group.
Time: the step as --clock sim charges it, every rank followed through every all-to-all round and
every all-reduce (any --collectives: allreduce_ends.py) (gpt_moe_time.py); exact from the run's
routing, balanced without.
"""

from __future__ import annotations

import math

from .collectives import ALLREDUCE, Cost, chunk, to_bytes
from .gpt import flops_per_step, run_result
from .moe import EpAlltoalls, kept_in_row_order
from .spec import PRECISIONS, precision_of, split


def param_counts(cfg) -> tuple[int, int]:
    """(non-expert parameters M, parameters of one rank's L E/P experts)."""
    L, h, s, V, E = cfg.blocks, cfg.hidden, cfg.seq_len, cfg.vocab, cfg.experts
    dense = (V + s) * h + L * (4 * h * h + 8 * h + h * E) + 2 * h + h * V
    return dense, L * (E // cfg.ep) * (8 * h * h + 5 * h)


def capacity(cfg, tokens: int) -> int:
    """ceil(C K N / E), as moe.capacity (Fedus et al. 2021, eq. 3, with K choices)."""
    return math.ceil(cfg.capacity_factor * cfg.top_k * tokens / cfg.experts)


def kept_per_micro_step(cfg, D: int, routing: dict | None, steps: int) -> list[tuple[int, list]]:
    """[(micro-step index k, [kept matrix D x E per block])], step-major: from the run's routing
    (exact) or balanced (fractional rows, no drops)."""
    G, s = cfg.grad_accum, cfg.seq_len
    seqs = split(cfg.batch, G)
    if routing is not None:
        return [
            (i % G, [kept_in_row_order(H, capacity(cfg, seqs[i % G] * s)) for H in micro])
            for i, micro in enumerate(routing["routed_by_rank"])
        ]
    out = []
    for _ in range(steps):
        for k in range(G):
            kept = [[chunk(seqs[k], D, r) * s * cfg.top_k / cfg.experts] * cfg.experts for r in range(D)]
            out.append((k, [kept] * cfg.blocks))
    return out


def activation_bytes(cfg, kept_blocks: list, d: int, k: int, D: int, bpe: int) -> float:
    """The module docstring's activations of rank d in micro-step k (the router's probabilities in
    float32 under --precision mixed-*, 4 bytes, the rest in bpe)."""
    h, a, s, E, P = cfg.hidden, cfg.heads, cfg.seq_len, cfg.experts, cfg.ep
    n = chunk(split(cfg.batch, cfg.grad_accum)[k], D, d) * s
    per, j = E // P, d % P
    elems = 2 * n * h + n
    routed = {}  # id(kept) -> (d's kept assignments, its experts' 9h per received row): once per matrix
    for kept in kept_blocks:
        if id(kept) not in routed:
            group, mine = range(d - j, d - j + P), range(j * per, (j + 1) * per)
            experts = sum(9 * h * sum(kept[q][e] for q in group) for e in mine)
            routed[id(kept)] = (sum(kept[d]), experts)
        assigned, experts = routed[id(kept)]
        elems += n * (7 * h + a * s + 2) + n * h + assigned * h
        elems += experts
    router_bpe = 4 if precision_of(cfg) == "mixed" else bpe
    return 8 * n + elems * bpe + len(kept_blocks) * n * E * router_bpe


def moe_step_flops(cfg, rows: int) -> int:
    """The step's FLOPs for `rows` sequences: the dense model's (gpt.flops_per_step, one MLP a block),
    K - 1 more expert MLPs per token (48 h^2 each: 8 h^2 multiply-adds, forward and backward) and the
    router's h E per token and block (2 forward, 4 backward)."""
    L, s, h, V, K, E = cfg.blocks, cfg.seq_len, cfg.hidden, cfg.vocab, cfg.top_k, cfg.experts
    tokens = rows * s
    return flops_per_step(rows, s, L, h, V) + (K - 1) * 48 * tokens * L * h * h + 6 * tokens * L * h * E


def model_states(n: int, prec, optimizer_bpp: float, peak: float) -> dict:
    """One rank's memory record: n parameters' values, gradients and optimizer state, and its peak of
    activations (bytes)."""
    return {
        "params": n * prec.param,
        "grads": n * prec.grad,
        "optimizer": n * optimizer_bpp,
        "activations_peak": round(peak),
    }


def moe_run_result(cfg, hw, steps, ranks, memory, total, timing, routing, tokens: int, **extra) -> dict:
    """gpt.run_result for an MoE layout: model FLOPs by moe_step_flops, the routing "measured" (the
    run's histograms given) or "balanced", and the capacity of a micro-step of `tokens` tokens."""
    return run_result(
        cfg,
        hw,
        steps,
        ranks,
        memory,
        total,
        timing,
        flops_per_step=moe_step_flops(cfg, cfg.batch),
        routing="measured" if routing is not None else "balanced",
        capacity=capacity(cfg, tokens),
        **extra,
    )


def predict_gpt_moe_run(cfg, world_size: int, steps: int, hw, routing: dict | None = None) -> dict:
    """Per-rank bytes (totals over `steps`), memory and the step time on `hw`, keyed like predict_run."""
    D, P, h = (cfg.dp if cfg.dp is not None else world_size), cfg.ep, cfg.hidden
    prec = PRECISIONS[precision_of(cfg)]
    bpe = prec.act
    micro = kept_per_micro_step(cfg, D, routing, steps)
    steps = len(micro) // cfg.grad_accum if routing is not None else steps
    dense, experts = param_counts(cfg)
    opt_bpp = prec.optimizer[(cfg.optimizer, bool(cfg.momentum))]
    ranks, memory = [], []
    alltoalls = EpAlltoalls(cfg.experts, P, h, cfg.alltoall)  # each (matrix, rank) once: moe.py
    for d in range(D):
        ops: dict[str, Cost] = {}

        def add(op: str, cost: Cost, elem_bytes: int, times: int = 1) -> None:
            if cost.messages:
                ops[op] = ops.get(op, Cost()) + to_bytes(cost, elem_bytes, times)

        if P > 1:
            for _, blocks in micro:
                for kept in blocks:
                    for op, c in alltoalls(kept, d).items():
                        add(op, c, bpe)
        add("grad-allreduce", ALLREDUCE[cfg.collectives](dense, D, d), prec.grad, steps)
        add("expert-grad-allreduce", ALLREDUCE[cfg.collectives](experts, D // P, d // P), prec.grad, steps)
        cat = lambda op: "model" if "grad-allreduce" in op else "activation"  # noqa: E731
        sent = {"data": 0, "model": 0, "activation": 0}
        messages = dict(sent)
        for op, c in ops.items():
            sent[cat(op)] += c.sent
            messages[cat(op)] += c.messages
        ranks.append(
            {
                "rank": d,
                "coords": {"pp": 0, "dp": d, "tp": 0},
                "sent": sent,
                "messages": messages,
                "by_op": {
                    f"{cat(op)}/{op}": {"sent": c.sent, "messages": c.messages} for op, c in ops.items()
                },
            }
        )
        n = dense + experts
        peak = max(activation_bytes(cfg, blocks, d, k, D, bpe) for k, blocks in micro)
        memory.append(model_states(n, prec, opt_bpp, peak))
    s = cfg.seq_len
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
