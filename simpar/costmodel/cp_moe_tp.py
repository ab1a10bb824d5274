"""MoE blocks with context and tensor parallelism (--arch gpt --experts E [--ep P] --cp C --tp T [--dp D])
in closed form: parallel/context_expert_tensor.py's bytes written again (nothing here calls it), from
three closed forms it combines -- gpt_moe_tp.py's tp ops, cp_tp.py's K/V of a/T heads, cp_moe.py's
all-to-alls from the per-segment capacity.

World rank w = (d C + c) T + k: dp index d, cp index c, tp index k. Micro-step k' has B_k' global rows,
dp rank d holds b_d of them, cp rank c of each the n = s/C tokens of chunks c and 2C-1-c: R = b_d n rows.
Per block and micro-step, rank w sends (elements; x bpe):
  cp-kv (ring)          forward 2 (C-1) b_d n h/T, backward 4 (C-1) b_d n h/T, 3 (C-1) messages
  cp-alltoall (Ulysses) 8 (C-1)/C b_d n h/T in 8 (C-1) messages
  tp-g-allreduce, tp-f-allreduce   one all-reduce of R h each (attention only: the MoE part is whole)
  ep-dispatch, ep-combine-grad     sum_{e not on j} kept[d,c][e] h       (j = d mod P)
  ep-combine, ep-dispatch-grad     sum_{d' in d's ep group, d' != d} sum_{e on j} kept[d',c][e] h
with kept[d,c][e] cp_moe.kept_by_rank's sums over rank (d, c)'s segments -- the same on every tp index.
Per micro-step: the vocabulary's embed and head all-reduces of R h, vocab-ce-max (all-gather of T R),
vocab-ce-sums (all-reduce of 2R). --sp (gpt_moe_tp.py's ops on R rows): per block 4 all-gathers of R h
("sp-gather": attention's f-bar, the MoE input, backward g-bar's and dL/dm's) and 2 reduce-scatters
("sp-scatter": attention's g-bar, f-bar's backward) in place of tp-g/tp-f, the vocabulary's embed and
head as a reduce-scatter and an all-gather each (vocab-embed-scatter/-gather, vocab-head-gather/-scatter),
and once per step "sp-grad-allreduce" (model) of each block's 4h LayerNorm and the head's 2h over tp.
Per step (ring): the dense shard (gpt_moe_tp.dense_shard) over the D C ranks of the dpcp group (group
rank d C + c), the L E/P experts over the D/P x C ranks of edpcp (group rank (d div P) C + c).
Control (not counted): the segment table's all-gather.

Memory: (dense shard + L E/P (8h^2 + 5h)) x params, grads, optimizer bytes. Activations (elements):
token ids 8 R bytes; per block 3 R h + 4 R h/T + 2R (LayerNorms' xh, attention's input, this rank's q,
k, v, output, two 1/sigma) + the scores (ring: a R/T log-sum-exps in the wide type; Ulysses: a s R/T)
+ the MoE part R h + (kept rows) h + 9 h (received rows) + R E; the head 2 R h + R. --sp: the LayerNorms'
xh and 1/sigma on R/T rows (the attention's input and the MoE part on every row, gathered).
Time: as --clock sim charges it (gpt_moe_time.py with each cp group's hops, --sp's collectives on the
b_d n rows).
"""

from __future__ import annotations

from .collectives import ALLREDUCE, Cost, chunk, to_bytes
from .cp import cp_kv_bytes, cp_messages, wide_bytes
from .cp_moe import micro_kept
from .gpt import rank_record
from .gpt_moe import model_states, moe_run_result
from .gpt_moe_tp import dense_shard
from .gpt_tp import micro_step_ops
from .moe import EpAlltoalls
from .spec import PRECISIONS, precision_of, split


def activation_bytes(cfg, blocks: list, d: int, c: int, k: int, D: int, bpe: int) -> float:
    """Rank (d, c, any tp index)'s activations at the end of micro-step k's forward (docstring)."""
    h, a, s, E, P, C, T = cfg.hidden, cfg.heads, cfg.seq_len, cfg.experts, cfg.ep, cfg.cp, cfg.tp
    R = chunk(split(cfg.batch, cfg.grad_accum)[k], D, d) * s // C
    per, j = E // P, d % P
    if cfg.cp_algo == "ring":
        scores = a * R // T * wide_bytes(bpe)
    else:
        scores = a * s * R // T * bpe
    ln, r = (R * h // T, R // T) if cfg.sp else (R * h, R)  # --sp: LayerNorms' xh, 1/sigma on R/T rows
    total = 8 * R + (R * h + ln + r) * bpe
    for kept in blocks:
        mine = kept[c]
        received = sum(mine[q][e] for q in range(d - j, d - j + P) for e in range(j * per, (j + 1) * per))
        elems = R * h + 2 * ln + 4 * R * h // T + 2 * r + R * h + sum(mine[d]) * h + 9 * h * received
        router = R * E * (4 if bpe == 2 else bpe)  # the router's probabilities: float32 under mixed-*
        total += elems * bpe + router + scores
    return total


def rank_ops(cfg, micro: list, D: int, d: int, c: int, k: int, bpe: int, alltoalls: EpAlltoalls) -> dict:
    """{op: Cost in bytes} of rank (d, c, k)'s activations over `micro` (cp_moe.micro_kept's list; the
    ep all-to-alls from the prediction's memo, moe.EpAlltoalls)."""
    L, h, s, C, T, P = cfg.blocks, cfg.hidden, cfg.seq_len, cfg.cp, cfg.tp, cfg.ep
    ops: dict[str, Cost] = {}

    def add(op: str, cost: Cost) -> None:
        if cost.messages:
            ops[op] = ops.get(op, Cost()) + cost

    for kk, blocks in micro:
        b = chunk(split(cfg.batch, cfg.grad_accum)[kk], D, d)
        R = b * (s // C)
        kv = cp_kv_bytes(b, s // C, h // T, C, cfg.cp_algo, bpe) * L
        add(
            "cp-kv" if cfg.cp_algo == "ring" else "cp-alltoall",
            Cost(sent=kv, messages=cp_messages(C, cfg.cp_algo) * L),
        )
        for op, costs in micro_step_ops(R, h, L, T, k, cfg.sp, cfg.collectives).items():
            if op in ("tp-g-allreduce", "tp-f-allreduce"):
                costs = costs[:L]  # attention's g (forward) and f (backward) only: no MLP split
            if op == "sp-scatter":  # attention's g-bar and f-bar backward; the MoE output is sliced
                costs = costs[: 2 * L]
            for cost in costs:  # the loss's two messages are float32 for half logits (gpt_tp.py)
                add(op, to_bytes(cost, 4 if op.startswith("vocab-ce") and bpe == 2 else bpe))
        for kept in blocks if P > 1 else ():
            for op, a2a in alltoalls(kept[c], d).items():
                add(op, to_bytes(Cost(a2a.sent, a2a.messages), bpe))
    return ops


def predict_cp_moe_tp_run(cfg, world_size: int, steps: int, hw, routing: dict | None = None) -> dict:
    """Per-rank bytes (totals over `steps`), memory and the step time on `hw`, keyed like the metrics."""
    L, h, s, V, E, C, T, P = (
        cfg.blocks,
        cfg.hidden,
        cfg.seq_len,
        cfg.vocab,
        cfg.experts,
        cfg.cp,
        cfg.tp,
        cfg.ep,
    )
    D = cfg.dp if cfg.dp is not None else world_size // (C * T)
    prec = PRECISIONS[precision_of(cfg)]
    bpe = prec.act
    micro = micro_kept(cfg, D, C, routing, steps)
    steps = len(micro) // cfg.grad_accum if routing is not None else steps
    dense, experts = dense_shard(cfg), L * (E // P) * (8 * h * h + 5 * h)
    opt_bpp = prec.optimizer[(cfg.optimizer, bool(cfg.momentum))]
    ranks, memory = [], []
    alltoalls = EpAlltoalls(cfg.experts, P, cfg.hidden, cfg.alltoall)  # each (matrix, rank) once
    for w in range(D * C * T):
        g, k = divmod(w, T)  # g: this rank's place in its dpcp group, d C + c
        d, c = divmod(g, C)
        act = rank_ops(cfg, micro, D, d, c, k, bpe, alltoalls)
        model: dict[str, Cost] = {}
        for op, n, size, rank in (
            ("grad-allreduce", dense, D * C, g),
            ("expert-grad-allreduce", experts, (D // P) * C, (d // P) * C + c),
        ):
            cost = ALLREDUCE[cfg.collectives](n, size, rank)
            if cost.messages:
                model[op] = to_bytes(cost, prec.grad, steps)
        for n in [4 * h] * L + [2 * h] if cfg.sp else ():  # LayerNorms' row-shard gradients, per unit
            cost = to_bytes(ALLREDUCE[cfg.collectives](n, T, k), prec.grad, steps)
            model["sp-grad-allreduce"] = model.get("sp-grad-allreduce", Cost()) + cost
        ranks.append(rank_record(w, {"pp": 0, "dp": d, "cp": c, "tp": k}, model=model, activation=act))
        n = dense + experts
        peak = max(activation_bytes(cfg, blocks, d, c, kk, D, bpe) for kk, blocks in micro)
        memory.append(model_states(n, prec, opt_bpp, peak))
    total = (V + s) * h + L * (4 * h * h + 8 * h + h * E + E * (8 * h * h + 5 * h)) + 2 * h + h * V
    from .gpt_moe_time import moe_step_seconds  # as --clock sim charges it

    timed = moe_step_seconds(cfg, D, hw, micro, (dense, experts), bpe, prec.grad)
    timing = (timed["step_s"], timed["compute_s"], timed["comm_s"])
    return moe_run_result(
        cfg, hw, steps, ranks, memory, total, timing, routing, split(cfg.batch, cfg.grad_accum)[0] * s
    )
