"""--arch gpt --tp t [--sp] [--dp d] in closed form: bytes per rank per op and memory per rank.

parallel/tensor_gpt.py and vocab_parallel.py written down again (nothing here imports them). Per
micro-step of b sequences, R = b s token rows of width h, over the t ranks of a tp group:

  op (activation)          tp, no --sp                          --sp
  tp-g-allreduce           2L all-reduces of R h (attn, MLP)      --
  tp-f-allreduce           2L all-reduces of R h (backward)       --
  sp-gather / sp-scatter   --                                     4L all-gathers / 4L reduce-scatters of R h
  vocab-embed-allreduce    1 all-reduce of R h                    --
  vocab-embed-scatter/gather  --                                  1 reduce-scatter / 1 all-gather of R h
  vocab-head-allreduce     1 all-reduce of R h (backward)         --
  vocab-head-gather/scatter   --                                  1 all-gather / 1 reduce-scatter of R h
  vocab-ce-max             1 all-gather of t R (row maxima)       the same
  vocab-ce-sums            1 all-reduce of 2R (sum exp, label)    the same
(ring: an all-reduce of N sends 2(t-1)/t N per rank, an all-gather or reduce-scatter (t-1)/t N; the
loss's two messages are float32 under mixed precision.) Once per step (model): --sp sums the LayerNorm
gradients over tp, "sp-grad-allreduce" of 4h per block and 2h for the head; with dp > 1 each rank's
gradient buckets of its shards are all-reduced over dp ("grad-allreduce").

Activation memory per rank, elements for b sequences (Korthikanti et al. 2022, Table 2's terms
without dropout; gpt.py's serial count is t = 1):
  block   tp:      4 s b h + 12 s b h/t + a s^2 b/t + 2 s b
          tp + sp: 2 s b h + 14 s b h/t + a s^2 b/t + 2 s b/t   (LayerNorm's xh and 1/sigma / t; the
                   gathered LN outputs that the column-parallel matmuls need are kept whole)
  head    tp: 2 s b h + s b;  tp + sp: s b h + s b h/t + s b/t;  embedding: 8 s b bytes of token ids.
"""

from __future__ import annotations

from .collectives import ALLREDUCE, Cost, chunk, ring_allgather, ring_reduce_scatter, to_bytes
from .gpt import flops_per_step, rank_record, run_result
from .spec import PRECISIONS, dp_buckets, precision_of, split


def local_unit_sizes(L: int, h: int, s: int, V: int, t: int) -> list[int]:
    """A tp rank's units: embedding V h/t + s h, block 12h^2/t + 7h/t + 6h, head 2h + h V/t."""
    return [V * h // t + s * h] + [12 * h * h // t + 7 * h // t + 6 * h] * L + [2 * h + h * V // t]


def tp_activation_bytes(b: int, s: int, L: int, h: int, a: int, t: int, sp: bool, bpe: int) -> int:
    """What one tp rank keeps for backward for b sequences (the module docstring's table)."""
    if sp:
        block = 2 * s * b * h + 14 * s * b * h // t + a * s * s * b // t + 2 * s * b // t
        head = s * b * h + s * b * h // t + s * b // t
    else:
        block = 4 * s * b * h + 12 * s * b * h // t + a * s * s * b // t + 2 * s * b
        head = 2 * s * b * h + s * b
    return 8 * s * b + (L * block + head) * bpe


def micro_step_ops(R: int, h: int, L: int, t: int, j: int, sp: bool, algorithm: str) -> dict:
    """{op: [Cost, ...]} of one micro-step for tp rank j (elements, not yet bytes)."""
    ar = ALLREDUCE[algorithm]
    N = R * h
    if sp:
        ops = {
            "sp-gather": [ring_allgather(N, t, j)] * 4 * L,
            "sp-scatter": [ring_reduce_scatter(N, t, j)] * 4 * L,
            "vocab-embed-scatter": [ring_reduce_scatter(N, t, j)],
            "vocab-embed-gather": [ring_allgather(N, t, j)],
            "vocab-head-gather": [ring_allgather(N, t, j)],
            "vocab-head-scatter": [ring_reduce_scatter(N, t, j)],
        }
    else:
        ops = {
            "tp-g-allreduce": [ar(N, t, j)] * 2 * L,
            "tp-f-allreduce": [ar(N, t, j)] * 2 * L,
            "vocab-embed-allreduce": [ar(N, t, j)],
            "vocab-head-allreduce": [ar(N, t, j)],
        }
    ops["vocab-ce-max"] = [ring_allgather(t * R, t, j)]
    ops["vocab-ce-sums"] = [ar(2 * R, t, j)]
    return ops


def predict_tp_run(cfg, world_size: int, steps: int, hw) -> dict:
    """Per-rank bytes (totals over `steps`) and memory of `simpar train --arch gpt --tp t [--sp]`."""
    L, h, a, s, V, t = cfg.blocks, cfg.hidden, cfg.heads, cfg.seq_len, cfg.vocab, cfg.tp
    p = cfg.dp if cfg.dp is not None else world_size // t
    prec = PRECISIONS[precision_of(cfg)]
    ce_bpe = 4 if prec.act == 2 else prec.act  # the loss is computed in float32 for half logits
    sizes = local_unit_sizes(L, h, s, V, t)
    P = sum(sizes)
    opt_bpp = prec.optimizer[(cfg.optimizer, bool(cfg.momentum))]
    ranks, memory, comm_s = [], [], 0.0
    for rank in range(world_size):
        d, j = divmod(rank, t)  # rank = dp_index * t + tp_index (mesh.py, pp = 1)
        model: dict[str, Cost] = {}
        act: dict[str, Cost] = {}

        def add(ops: dict, op: str, cost: Cost, bpe: int) -> None:
            if cost.messages:
                ops[op] = ops.get(op, Cost()) + to_bytes(cost, bpe, steps)

        for n in dp_buckets(sizes, prec.grad, cfg.bucket_mb):
            add(model, "grad-allreduce", ALLREDUCE[cfg.collectives](n, p, d), prec.grad)
        if cfg.sp:
            for n in [4 * h] * L + [2 * h]:
                add(model, "sp-grad-allreduce", ALLREDUCE[cfg.collectives](n, t, j), prec.grad)
        peak = 0
        for k_rows in split(cfg.batch, cfg.grad_accum):
            b = chunk(k_rows, p, d)
            peak = max(peak, tp_activation_bytes(b, s, L, h, a, t, cfg.sp, prec.act))
            for op, costs in micro_step_ops(b * s, h, L, t, j, cfg.sp, cfg.collectives).items():
                for c in costs:
                    add(act, op, c, ce_bpe if op.startswith("vocab-ce") else prec.act)
        memory.append(
            {
                "params": P * prec.param,
                "grads": P * prec.grad,
                "optimizer": P * opt_bpp,
                "activations_peak": peak,
            }
        )
        if hw is not None:
            from .hardware import group_link

            tp_link, dp_link = group_link(hw, "tp", p, t, 1), group_link(hw, "dp", p, t, 1)
            seconds = sum(c.rounds * tp_link.alpha + c.round_elems * tp_link.beta for c in act.values())
            seconds += sum(c.rounds * dp_link.alpha + c.round_elems * dp_link.beta for c in model.values())
            comm_s = max(comm_s, seconds)
        ranks.append(rank_record(rank, {"pp": 0, "dp": d, "tp": j}, model=model, activation=act))
    if hw is not None:  # as the simulated clock charges a step (gpt_time.py)
        from .gpt_time import step_seconds

        timed = step_seconds(cfg, p, sizes, hw, precision_of(cfg), prec.act)
        step_s, compute_s, comm_s = timed["step_s"], timed["compute_s"], timed["comm_s"]
    else:
        rows = max(chunk(cfg.batch, p, d) for d in range(p))
        rate = hw.flop_rate(precision_of(cfg)) if hw is not None else 0.0
        compute_s = flops_per_step(rows, s, L, h, V) / t / rate if rate else 0.0
        comm_s /= max(steps, 1)
        step_s = compute_s + comm_s
    return run_result(
        cfg, hw, steps, ranks, memory, sum(local_unit_sizes(L, h, s, V, 1)), (step_s, compute_s, comm_s)
    )
