"""MoE blocks under tensor parallelism (--arch gpt --experts E [--ep P] --tp T [--dp D]) in closed form:
parallel/expert_tensor_gpt.py written again, not imported. World rank d T + k (dp index d, tp index k).

  tp (activation, per micro-step of R = b s rows, b = chunk(N_k, D, d)): gpt_tp.py's ops with the MLP's
      f and g gone: tp-g-allreduce and tp-f-allreduce L all-reduces of R h each (attention only), the
      vocabulary's embed/head all-reduces of R h, vocab-ce-max (t R) and vocab-ce-sums (2R); --sp:
      4L all-gathers of R h ("sp-gather": attention's f-bar, the MoE input's, and backward both g-bar's
      and dL/dm's) and 2L reduce-scatters ("sp-scatter": attention's g-bar and f-bar backward; the MoE
      output and dL/dh2 are complete on every rank, each takes its rows), gpt_tp.py's vocabulary ops,
      and once per step "sp-grad-allreduce" (model) of each block's 4h LayerNorm and the head's 2h
  ep (activation): costmodel/gpt_moe.py's four all-to-alls per block and micro-step for dp rank d,
      from the routing -- the same on every tp rank (the MoE part is replicated over tp)
  model, once per step: this rank's dense shards all-reduced over D (one call), its L E/P experts over
      D/P (ring)
  memory: dense shards -- embedding V h/T + s h, a block 4h^2/T + 3h/T + 5h + hE, head 2h + hV/T --
      plus L E/P experts of 8h^2 + 5h, each x params, grads, optimizer bytes
  activations per micro-step (elements, bpe; token ids 8 B): a block keeps LN1's xh, attention's
      input, LN2's xh (3 n h), this rank's q, k, v and output (4 n h/T), scores (a s n/T), two 1/sigma
      (2n), then gpt_moe.py's MoE part (n h + kept outputs + 9h per received row + the router's n E,
      4 bytes each under --precision mixed-*); the head 2 n h + n; --sp: the LayerNorms' xh and
      1/sigma on n/T rows (the rest as without). Under mixed-*: 2-byte activations and messages, but
      the loss's vocab-ce-max and vocab-ce-sums in float32 (gpt_tp.py)
  time on a hardware profile (every --collectives): as --clock sim charges it
      (gpt_moe_time.py: the tp collectives blocking, --sp's gathers and LayerNorm sums too, each tp
      group followed where they leave its ranks apart (moe_tp_rounds.py), every rank through every
      all-to-all round and gradient all-reduce; with --cp: cp_moe_tp.py).
"""

from __future__ import annotations

from .collectives import ALLREDUCE, Cost, chunk, to_bytes
from .gpt import rank_record
from .gpt_moe import kept_per_micro_step, model_states, moe_run_result
from .gpt_tp import micro_step_ops
from .moe import EpAlltoalls
from .spec import PRECISIONS, precision_of, split


def dense_shard(cfg) -> int:
    """Parameters of one tp rank outside the experts (the module docstring's memory line)."""
    L, h, s, V, E, T = cfg.blocks, cfg.hidden, cfg.seq_len, cfg.vocab, cfg.experts, cfg.tp
    block = 4 * h * h // T + 3 * h // T + 5 * h + h * E
    return V * h // T + s * h + L * block + 2 * h + h * V // T


def activation_bytes(cfg, kept_blocks: list, d: int, k: int, D: int, bpe: int) -> int:
    h, a, s, E, P, T = cfg.hidden, cfg.heads, cfg.seq_len, cfg.experts, cfg.ep, cfg.tp
    n = chunk(split(cfg.batch, cfg.grad_accum)[k], D, d) * s
    per, j = E // P, d % P
    # --sp: LayerNorms' xh and 1/sigma on n/T rows; attention's input and the MoE part on every row
    ln, r = (n * h // T, n // T) if cfg.sp else (n * h, n)
    elems = n * h + ln + r  # the head: LN_f's output (gathered under --sp), xh, 1/sigma
    routed = {}  # id(kept) -> (d's kept assignments, rows its experts received): once per matrix
    for kept in kept_blocks:
        if id(kept) not in routed:
            group, mine = range(d - j, d - j + P), range(j * per, (j + 1) * per)
            routed[id(kept)] = (sum(kept[d]), sum(kept[q][e] for q in group for e in mine))
        assigned, received = routed[id(kept)]
        elems += n * h + 2 * ln + 4 * n * h // T + a * s * n // T + 2 * r
        elems += n * h + assigned * h + 9 * h * received
    router_bpe = 4 if bpe == 2 else bpe  # the router's probabilities: float32 under --precision mixed-*
    return 8 * n + round(elems * bpe) + len(kept_blocks) * n * E * router_bpe


def predict_gpt_moe_tp_run(cfg, world_size: int, steps: int, hw, routing: dict | None = None) -> dict:
    """Per-rank bytes (totals over `steps`), memory and the step time on `hw`, keyed like predict_run."""
    L, h, s, V, E, T = cfg.blocks, cfg.hidden, cfg.seq_len, cfg.vocab, cfg.experts, cfg.tp
    D, P = (cfg.dp if cfg.dp is not None else world_size // T), cfg.ep
    prec = PRECISIONS[precision_of(cfg)]
    bpe = prec.act
    micro = kept_per_micro_step(cfg, D, routing, steps)
    steps = len(micro) // cfg.grad_accum if routing is not None else steps
    dense, experts = dense_shard(cfg), L * (E // P) * (8 * h * h + 5 * h)
    opt_bpp = prec.optimizer[(cfg.optimizer, bool(cfg.momentum))]
    ranks, memory = [], []
    alltoalls = EpAlltoalls(E, P, h, cfg.alltoall)  # each (matrix, rank) once: moe.py
    for r in range(world_size):
        d, j = divmod(r, T)
        act: dict[str, Cost] = {}
        model: dict[str, Cost] = {}

        def add(ops: dict, op: str, cost: Cost, elem_bytes: int, times: int = 1) -> None:
            if cost.messages:
                ops[op] = ops.get(op, Cost()) + to_bytes(cost, elem_bytes, times)

        for k, blocks in micro:
            R = chunk(split(cfg.batch, cfg.grad_accum)[k], D, d) * s
            for op, costs in micro_step_ops(R, h, L, T, j, cfg.sp, cfg.collectives).items():
                if op in ("tp-g-allreduce", "tp-f-allreduce"):
                    costs = costs[:L]  # attention's g (forward) and f (backward) only: no MLP split
                if op == "sp-scatter":  # attention's g-bar and f-bar backward; the MoE output is sliced
                    costs = costs[: 2 * L]
                for c in costs:  # the loss's two messages are float32 for half logits (gpt_tp.py)
                    add(act, op, c, 4 if op.startswith("vocab-ce") and bpe == 2 else bpe)
            for kept in blocks if P > 1 else ():
                for op, c in alltoalls(kept, d).items():
                    add(act, op, c, bpe)
        add(model, "grad-allreduce", ALLREDUCE[cfg.collectives](dense, D, d), prec.grad, steps)
        for n in [4 * h] * L + [2 * h] if cfg.sp else ():  # LayerNorms' row-shard gradients, per unit
            add(model, "sp-grad-allreduce", ALLREDUCE[cfg.collectives](n, T, j), prec.grad, steps)
        add(
            model,
            "expert-grad-allreduce",
            ALLREDUCE[cfg.collectives](experts, D // P, d // P),
            prec.grad,
            steps,
        )
        ranks.append(rank_record(r, {"pp": 0, "dp": d, "tp": j}, model=model, activation=act))
        n = dense + experts
        peak = max(activation_bytes(cfg, blocks, d, k, D, bpe) for k, blocks in micro)
        memory.append(model_states(n, prec, opt_bpp, peak))
    total = (V + s) * h + L * (4 * h * h + 8 * h + h * E + E * (8 * h * h + 5 * h)) + 2 * h + h * V
    from .gpt_moe_time import moe_step_seconds  # as --clock sim charges it

    timed = moe_step_seconds(cfg, D, hw, micro, (dense, experts), bpe, prec.grad)
    timing = (timed["step_s"], timed["compute_s"], timed["comm_s"])
    return moe_run_result(
        cfg, hw, steps, ranks, memory, total, timing, routing, split(cfg.batch, cfg.grad_accum)[0] * s
    )
