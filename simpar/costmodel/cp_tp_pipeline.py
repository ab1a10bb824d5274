"""--arch gpt --cp C --tp T --pp S [--dp D] in closed form: bytes, memory, FLOPs per rank.

parallel/pipeline/context_tensor_stage.py's rules written down again (nothing here calls it): the
three pairwise closed forms put together, cp_pipeline.py's stages and boundaries, cp_tp.py's work
inside a chunk, gpt_tp_pipeline.py's per-chunk tp messages. World rank ((stage dp + d) C + c) T + j
(mesh.py); n = s/C tokens per cp rank, b sequences in a micro-batch, R = b n rows, bpe bytes per element.

  stages      gpt_pipeline.py's split of the units (embedding, L blocks, head) by their WHOLE sizes
              into S chunks (S V under --schedule interleaved, chunk k on stage k mod S)
  pp messages per chunk boundary between two stages and micro-batch, every tp rank its own copy of
              the cp rank's residual stream: b n h forward ("pp-send-act"), b n h backward
              ("pp-send-grad"), to the same (dp, cp, tp) coordinates on the neighbouring stage;
              --sp: only the tp rank's contiguous shard of the b n rows, b n h / T each way
  cp          per block of the chunk and micro-batch, cp.py's cp_kv_bytes with width h/T (the ring
              carries the rank's a/T heads only) and cp_messages
  tp          gpt_tp_pipeline.chunk_ops on R = b n rows: the chunk's blocks' f and g, the vocabulary
              embedding's on the chunk holding unit 0, the head's and the loss's on the last chunk
              (--sp: their all-gathers and reduce-scatters, the same bytes as the all-reduces)
  gradients   each chunk's P_T shards (gpt_tp.local_unit_sizes) in dp_buckets, ring all-reduced over
              the stage's dp x C ranks of the same tp index (place d C + c); --sp: each of the
              chunk's units' LayerNorm gradients (4h a block, 2h the head) all-reduced over tp
  activations cp_tp.py's per-unit table on n tokens (its --sp rows too), alive as the schedule's
              order says (order.peak_alive; zb-h1 and zb-v hold them until the W pass)
  --recompute per block of the chunk and micro-batch, cp_pipeline.cp_recompute_kv with width h/T: ring
              2 (C-1) b n h/T bpe again under full and selective (the ring's forward rebuilds the
              log-sum-exp), Ulysses 4 (C-1) (b n h/T)/C bpe under full only; full adds the chunk's
              forward tp messages again (gpt_tp_pipeline.recompute_ops on R = b n rows: each block's 2
              g all-reduces of R h, the embedding's; --sp their gathers/scatters and the head's
              gather). Kept per sequence (kept_bytes): full the chunk's input (8 n bytes of token ids,
              or n h elements, n h/T under --sp), selective all but each block's softmax part
              (softmax_per_sequence: the lse a n/T wide, or Ulysses' P a s n/T); the backward holds
              the chunk's whole again
  zb-h1, zb-v the same bytes: the cp attention's backward and tp's input-gradient collectives in B,
              W local
  FLOPs       gpt_pipeline.py's per unit, / C (the balanced split), / T (the matmuls split); the
              ring's scores are its causal blocks' of a/T heads, as cp_pipeline.py counts them
  time        as --clock sim charges the step: cp_tp_pipeline_time.py (steptime.py's recurrences over
              cp_time.py's hops of a/T heads and gpt_time.py's tp units and blocking tp collectives)
"""

from __future__ import annotations

from .collectives import ALLREDUCE, Cost, chunk, to_bytes
from .cp import cp_kv_bytes, cp_messages, ring_rank_product_flops, wide_bytes
from .cp_pipeline import cp_recompute_kv
from .gpt import rank_record, run_result, unit_sizes
from .gpt_pipeline import TOKEN_BYTES, unit_forward_flops
from .gpt_tp import local_unit_sizes
from .gpt_tp_pipeline import chunk_ops, recompute_ops
from .order import chunk_stage, n_chunks, peak_alive, stage_chunks
from .spec import PRECISIONS, dp_buckets, precision_of, split
from .stages import balanced_counts


def kept_per_sequence(
    unit: int, L: int, h: int, a: int, s: int, C: int, T: int, algo: str, bpe: int, sp: bool = False
) -> int:
    """Bytes one sequence's forward keeps in a unit on a (cp, tp) rank (cp_tp.py's table)."""
    n = s // C
    if unit == 0:
        return TOKEN_BYTES * n
    if unit > L:
        return ((n * h + n * h // T + n // T) if sp else (2 * n * h + n)) * bpe
    scores = softmax_per_sequence(unit, L, a, s, C, T, algo, bpe)
    if sp:  # LayerNorms and residuals on the tp rank's n/T rows
        return (2 * n * h + 14 * n * h // T + 2 * n // T) * bpe + scores
    return (4 * n * h + 12 * n * h // T + 2 * n) * bpe + scores


def softmax_per_sequence(unit: int, L: int, a: int, s: int, C: int, T: int, algo: str, bpe: int) -> int:
    """Bytes of one sequence's block that --recompute selective drops on a (cp, tp) rank: the ring's
    log-sum-exp of the a/T heads (a n / T, wide type), Ulysses' P of its a/(T C) heads (a s n / T)."""
    if not 0 < unit <= L:
        return 0
    n = s // C
    return a * n // T * wide_bytes(bpe) if algo == "ring" else a * s * n // T * bpe


def kept_bytes(bounds, L, h, a, s, C, T, algo, bpe, sp, mode) -> list[tuple[int, int]]:
    """Per chunk (held from forward to backward, held during its backward) per sequence under
    --recompute `mode` (module docstring): full keeps the chunk's input, selective all but the
    softmax parts, none everything."""
    n, out = s // C, []
    for lo, hi in bounds:
        full = sum(kept_per_sequence(u, L, h, a, s, C, T, algo, bpe, sp) for u in range(lo, hi))
        if mode == "full":  # its n tokens' ids, or the tp rank's copy (--sp: shard) of the stream
            out.append((TOKEN_BYTES * n if lo == 0 else (n * h // T if sp else n * h) * bpe, full))
        elif mode == "selective":
            drop = sum(softmax_per_sequence(u, L, a, s, C, T, algo, bpe) for u in range(lo, hi))
            out.append((full - drop, full))
        else:
            out.append((full, full))
    return out


def predict_cp_tp_pipeline_run(cfg, world_size: int, steps: int, hw) -> dict:
    """predict_run's dict for --cp C --tp T --pp S: one entry per world rank (module docstring)."""
    L, h, a, s, V = cfg.blocks, cfg.hidden, cfg.heads, cfg.seq_len, cfg.vocab
    C, T, S, M, sched = cfg.cp, cfg.tp, cfg.pp, cfg.microbatches, cfg.schedule
    Vs = cfg.virtual_stages if sched == "interleaved" else 1
    K = n_chunks(sched, S, Vs)
    n, algo = s // C, cfg.cp_algo
    dp = cfg.dp if cfg.dp is not None else world_size // (S * C * T)
    prec = PRECISIONS[precision_of(cfg)]
    bpe = prec.act
    ce_bpe = 4 if bpe == 2 else bpe  # the loss in float32 for half logits (vocab_parallel.py)
    sizes, local = unit_sizes(L, h, s, V), local_unit_sizes(L, h, s, V, T)
    counts = cfg.stage_layers or balanced_counts(sizes, K)
    bounds = [(sum(counts[:k]), sum(counts[: k + 1])) for k in range(K)]
    opt_bpp = prec.optimizer[(cfg.optimizer, bool(cfg.momentum))]
    cp_op = "cp-kv" if algo == "ring" else "cp-alltoall"
    mode = cfg.recompute
    held = kept_bytes(bounds, L, h, a, s, C, T, algo, bpe, cfg.sp, mode)
    ranks, memory, stage_s = [], [], []
    for r in range(world_size):
        st, rest = divmod(r, dp * C * T)
        g, j = divmod(rest, T)  # g = d C + c: the place in the stage's dpcp group
        d, c = divmod(g, C)
        rows = [split(chunk(k_rows, dp, d), M) for k_rows in split(cfg.batch, cfg.grad_accum)]
        act: dict[str, Cost] = {}
        model: dict[str, Cost] = {}

        def add(ops: dict, op: str, cost: Cost, elem_bytes: int) -> None:
            if cost.messages:
                ops[op] = ops.get(op, Cost()) + to_bytes(cost, elem_bytes, steps)

        fwd = bwd = redo = 0
        mine = stage_chunks(sched, S, Vs, st)
        for k in mine:
            lo, hi = bounds[k]
            blocks = sum(1 for u in range(lo, hi) if 0 < u <= L)
            for b in (b for step in rows for b in step):
                stream = b * n * h // T if cfg.sp else b * n * h  # the cp rank's residual stream
                if k < K - 1 and chunk_stage(sched, S, k + 1) != st:
                    add(act, "pp-send-act", Cost(stream, 1, 0, 1, stream), bpe)
                if k > 0 and chunk_stage(sched, S, k - 1) != st:
                    add(act, "pp-send-grad", Cost(stream, 1, 0, 1, stream), bpe)
                ops = chunk_ops(lo, hi, L, b * n, h, T, j, cfg.sp, cfg.collectives)
                if mode == "full":  # the chunk's forward again: its tp messages once more
                    again_tp = recompute_ops(lo, hi, L, b * n, h, T, j, cfg.sp, cfg.collectives)
                    for op, costs in again_tp.items():
                        ops[op] = ops.get(op, []) + costs
                for op, costs in ops.items():
                    for cost in costs:
                        add(act, op, cost, ce_bpe if op.startswith("vocab-ce") else bpe)
                if blocks:
                    again, again_msgs = cp_recompute_kv(b, n, h // T, C, algo, bpe, mode)
                    sent = blocks * (cp_kv_bytes(b, n, h // T, C, algo, bpe) + again)
                    messages = blocks * (cp_messages(C, algo) + again_msgs)
                    act[cp_op] = act.get(cp_op, Cost()) + Cost(sent * steps, messages * steps)
                chunk_fwd = b * sum(unit_forward_flops(u, L, h, s, V) for u in range(lo, hi)) // (C * T)
                chunk_bwd = 2 * chunk_fwd
                square = 2 * s * n * (h // T)  # one score product over my share of the square (Ulysses')
                if algo == "ring":  # its causal blocks instead: 2 products forward, 5 backward
                    one = ring_rank_product_flops(n, h // T, C)
                    chunk_fwd += blocks * b * 2 * (one - square)
                    chunk_bwd += blocks * b * (5 * one - 4 * square)
                fwd, bwd = fwd + chunk_fwd, bwd + chunk_bwd
                if mode == "full":
                    redo += chunk_fwd
                elif mode == "selective":  # the ring's forward again (its lse); Ulysses' q k^T
                    redo += blocks * b * (2 * one if algo == "ring" else square)
            for elems in dp_buckets(local[lo:hi], prec.grad, cfg.bucket_mb):
                add(model, "grad-allreduce", ALLREDUCE[cfg.collectives](elems, dp * C, g), prec.grad)
            for u in range(max(lo, 1), hi) if cfg.sp else ():  # LayerNorm gradients of my rows
                add(
                    model,
                    "sp-grad-allreduce",
                    ALLREDUCE[cfg.collectives](4 * h if u <= L else 2 * h, T, j),
                    prec.grad,
                )
        P = sum(sum(local[slice(*bounds[k])]) for k in mine)
        mem = {"params": P * prec.param, "grads": P * prec.grad, "optimizer": P * opt_bpp}
        mem["activations_peak"] = max(
            peak_alive(
                sched,
                S,
                len(step),
                st,
                Vs,
                lambda m, k, step=step: step[m] * held[k][0],
                None if mode == "none" else (lambda m, k, step=step: step[m] * (held[k][1] - held[k][0])),
            )
            for step in rows
        )
        memory.append(mem)
        stage_s.append((fwd + bwd + redo) / hw.flop_rate(precision_of(cfg)) if hw is not None else 0.0)
        record = rank_record(r, {"pp": st, "dp": d, "cp": c, "tp": j}, model=model, activation=act)
        ranks.append(record | {"flops": {"forward": fwd, "backward": bwd, "recompute": redo}})
    compute_s = step_s = max(stage_s) * (M + S - 1) / M
    comm_s = 0.0
    if hw is not None:  # as --clock sim charges it
        from .cp_tp_pipeline_time import cp_tp_pipeline_step_seconds

        timed = cp_tp_pipeline_step_seconds(cfg, dp, sizes, local, hw)
        step_s, compute_s, comm_s = timed["step_s"], timed["compute_s"], timed["comm_s"]
    pipeline = {"bubble": (S - 1) / (M + S - 1), "stage_units": bounds}
    return run_result(cfg, hw, steps, ranks, memory, sum(sizes), (step_s, compute_s, comm_s), **pipeline)
