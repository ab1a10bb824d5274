"""--arch gpt --cp C --tp T [--dp D] in closed form: bytes per rank per op, memory per rank, a time.

parallel/context_tensor.py written down again (nothing here imports it). World rank
w = (d C + c) T + j (mesh.py, pp = 1): dp index d, cp index c, tp index j. Per micro-step of b
sequences, a rank holds n = s/C tokens of each (R = b n rows) and a/T heads, h/T of q, k, v's width:

  cp-kv (ring)          per block: forward 2 (C-1) b n h/T, backward 4 (C-1) b n h/T elements
                        (cp.py's cp_kv_bytes with width h/T: the ring carries the rank's heads only)
  cp-alltoall (Ulysses) per block: 8 (C-1)/C b n h/T elements
  tp ops                gpt_tp.micro_step_ops on R = b n rows: 2L g all-reduces and 2L f all-reduces
                        of R h, the vocabulary's embedding and head all-reduces of R h, the loss's
                        all-gather of T R maxima and all-reduce of 2 R sums; --sp: f and g become
                        gpt_tp's 4L all-gathers and 4L reduce-scatters of R h (the same bytes as 4L
                        all-reduces), the vocabulary's as gather/scatter pairs
  grad-allreduce        this rank's P_T = gpt_tp.local_unit_sizes parameters, in dp_buckets, ring
                        all-reduce over the dp C ranks of its `dpcp` group (group rank d C + c)
  sp-grad-allreduce     --sp: the LayerNorms' 4h per block and the head's 2h all-reduced over tp

Memory: params, grads and optimizer state of P_T (every cp rank holds its tp shard of the whole
model). Activations kept per sequence, elements (gpt_tp.py's tp block on n tokens; the scores as
cp.py's, for a/T heads):
  block   4 n h + 12 n h/T + 2 n + (ring: a n / T log-sum-exp in the wide type;
                                    Ulysses: P of a/(T C) heads over s x s = a s n / T)
  head    2 n h + n;   embedding 8 n bytes of token ids.
  --sp    block 2 n h + 14 n h/T + 2 n/T + the scores, head n h + n h/T + n/T (gpt_tp.py's tp + sp).

Time: as the simulated clock charges a step (cp_time.cp_step_seconds: each ring hop overlapping its
blocks, tp's all-reduces blocking on the tp link).
"""

from __future__ import annotations

from .collectives import ALLREDUCE, Cost, chunk, to_bytes
from .cp import cp_kv_bytes, cp_messages, wide_bytes
from .gpt import rank_record, run_result
from .gpt_tp import local_unit_sizes, micro_step_ops
from .spec import PRECISIONS, dp_buckets, precision_of, split


def cp_tp_activation_bytes(
    b: int, s: int, L: int, h: int, a: int, C: int, T: int, algo: str, bpe: int, sp: bool = False
):
    """What one rank keeps for backward for b sequences (the module docstring's table)."""
    n = s // C
    if algo == "ring":
        scores = a * n * b // T * wide_bytes(bpe)  # the log-sum-exp, in bytes
    else:
        scores = a * s * n * b // T * bpe
    if sp:  # gpt_tp.py's tp + sp terms on n tokens: LayerNorm's xh and 1/sigma on this rank's rows
        block = (2 * n * h + 14 * n * h // T + 2 * n // T) * b * bpe + scores
        return 8 * n * b + L * block + (n * h + n * h // T + n // T) * b * bpe
    block = (4 * n * h + 12 * n * h // T + 2 * n) * b * bpe + scores
    return 8 * n * b + L * block + (2 * n * h + n) * b * bpe


def predict_cp_tp_run(cfg, world_size: int, steps: int, hw) -> dict:
    """Per-rank bytes (totals over `steps`), memory and a step time of `simpar train --arch gpt --cp C
    --tp T [--dp D]`, keyed like its metrics."""
    L, h, a, s, V, C, T = cfg.blocks, cfg.hidden, cfg.heads, cfg.seq_len, cfg.vocab, cfg.cp, cfg.tp
    dp = cfg.dp if cfg.dp is not None else world_size // (C * T)
    prec = PRECISIONS[precision_of(cfg)]
    ce_bpe = 4 if prec.act == 2 else prec.act  # the loss in float32 for half logits (vocab_parallel.py)
    sizes = local_unit_sizes(L, h, s, V, T)
    P_T = sum(sizes)
    opt_bpp = prec.optimizer[(cfg.optimizer, bool(cfg.momentum))]
    cp_op = "cp-kv" if cfg.cp_algo == "ring" else "cp-alltoall"
    ranks, memory = [], []
    for w in range(dp * C * T):
        g, j = divmod(w, T)  # g: this rank's place in its dpcp group, d C + c
        d, c = divmod(g, C)
        model, act = {}, {}

        def add(ops: dict, op: str, cost: Cost, bpe: int) -> None:
            if cost.messages:
                ops[op] = ops.get(op, Cost()) + to_bytes(cost, bpe, steps)

        for n_elems in dp_buckets(sizes, prec.grad, cfg.bucket_mb):
            add(model, "grad-allreduce", ALLREDUCE[cfg.collectives](n_elems, dp * C, g), prec.grad)
        if cfg.sp:  # the LayerNorm gradients of this rank's rows, summed over tp (gpt_tp.py)
            for n_elems in [4 * h] * L + [2 * h]:
                add(model, "sp-grad-allreduce", ALLREDUCE[cfg.collectives](n_elems, T, j), prec.grad)
        peak, kv, kv_msgs = 0, 0, 0
        for k_rows in split(cfg.batch, cfg.grad_accum):
            b = chunk(k_rows, dp, d)
            peak = max(peak, cp_tp_activation_bytes(b, s, L, h, a, C, T, cfg.cp_algo, prec.act, cfg.sp))
            for op, costs in micro_step_ops(b * (s // C), h, L, T, j, cfg.sp, cfg.collectives).items():
                for cost in costs:
                    add(act, op, cost, ce_bpe if op.startswith("vocab-ce") else prec.act)
            kv += cp_kv_bytes(b, s // C, h // T, C, cfg.cp_algo, prec.act) * L * steps
            kv_msgs += cp_messages(C, cfg.cp_algo) * L * steps
        act[cp_op] = Cost(sent=kv, messages=kv_msgs)
        ranks.append(rank_record(w, {"pp": 0, "dp": d, "cp": c, "tp": j}, model=model, activation=act))
        memory.append(
            {
                "params": P_T * prec.param,
                "grads": P_T * prec.grad,
                "optimizer": P_T * opt_bpp,
                "activations_peak": peak,
            }
        )
    from .cp_time import cp_step_seconds  # as the simulated clock charges a step

    timed = cp_step_seconds(cfg, dp, sizes, hw, precision_of(cfg), prec.act)
    step_s, compute_s, comm_s = timed["step_s"], timed["compute_s"], timed["comm_s"]
    return run_result(
        cfg, hw, steps, ranks, memory, sum(local_unit_sizes(L, h, s, V, 1)), (step_s, compute_s, comm_s)
    )
