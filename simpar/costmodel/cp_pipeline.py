"""--arch gpt --cp C --pp S [--dp D] in closed form: bytes, memory, FLOPs per rank.

parallel/pipeline/context_stage.py's rules written down again (nothing here calls it). Notation as
gpt_pipeline.py and cp.py: L blocks, hidden h, a heads, sequence s, n = s/C tokens per cp rank, b
sequences in a micro-batch, bpe bytes per element; world rank ((stage dp + d) C + c) (mesh.py).

  stages      gpt_pipeline.py's split of the units (embedding, L blocks, head) into S chunks (S V
              under --schedule interleaved, chunk k on stage k mod S)
  pp messages per chunk boundary between two stages and micro-batch, the cp rank's own residual stream: b n h
              forward ("pp-send-act") and b n h backward ("pp-send-grad"), to the rank with the same
              dp and cp coordinates on the neighbouring stage
  cp          per block of the rank's chunk and micro-batch, cp.py's cp_kv_bytes (ring: 2(C-1) b n h
              forward + 4(C-1) b n h backward; Ulysses: 8(C-1)/C b n h) and cp_messages
  gradients   each chunk's buckets (dp_buckets over its units) ring-all-reduced over the stage's
              dp x C ranks (place d C + c)
  activations cp.py's per-token arrays for n tokens, alive as the schedule's order says (order.peak_alive;
              zb-h1 and zb-v hold them until the W pass)
  --recompute full keeps a chunk's input only (its n tokens' ids, or n h elements a sequence) and
              re-runs the chunk's forward before its backward: every block's attention again, so the
              ring's C-1 K/V hops (or Ulysses' 4 forward all-to-alls) are sent once more.
              selective keeps every per-token array and drops each block's softmax part -- the ring's
              log-sum-exp (a n in the wide type), Ulysses' P (a s n) -- and rebuilds it before the
              block's backward: the ring by running its forward again (its K/V hops sent again, as
              --recompute full's), Ulysses from its kept q and k, no message (context_attention.py's
              rebuild_softmax). Per block of the chunk and micro-batch of b sequences, on top of cp.py's
              (cp_recompute_kv):
                  full       ring 2 (C-1) b n h bpe in C-1 messages; Ulysses 4 (C-1) (b n h / C) bpe
                             in 4 (C-1)
                  selective  ring 2 (C-1) b n h bpe in C-1 messages; Ulysses 0
              so a ring rank sends, per block per micro-batch, 8 (C-1) b n h elements instead of 6.
  zb-h1, zb-v split each unit's backward into B (dL/dx) and W (the weights' gradients): all of the
              attention's cp traffic is on dL/dx's path, so it is in B, with the same bytes.
  FLOPs       gpt_pipeline.py's per unit, / C (every term is linear in s but the scores' 4 s^2 h,
              which the balanced split divides by C too: 4 s n h, what Ulysses computes); the ring
              computes its 2C+1 causal blocks instead (cp.ring_rank_product_flops, P1 a product over
              them): 2 P1 forward, 5 P1 backward (P rebuilt from the lse), selective 2 P1 again
  time        as --clock sim charges the step: cp_pipeline_time.py (steptime.py's recurrences over
              each chunk's units, its blocks' attention priced hop by hop as cp_time.py)
"""

from __future__ import annotations

from .collectives import ALLREDUCE, Cost, chunk, to_bytes
from .cp import cp_block_elems, cp_kv_bytes, cp_messages, ring_rank_product_flops, wide_bytes
from .gpt import rank_record, run_result, unit_sizes
from .gpt_pipeline import TOKEN_BYTES, unit_forward_flops
from .order import chunk_stage, n_chunks, peak_alive, stage_chunks
from .spec import PRECISIONS, dp_buckets, precision_of, split
from .stages import balanced_counts


def cp_unit_kept_bytes(unit: int, L: int, h: int, a: int, s: int, C: int, algo: str, bpe: int) -> int:
    """Bytes one SEQUENCE's forward keeps in a unit on a cp rank (cp.py's cp_activation_bytes per unit)."""
    n = s // C
    if unit == 0:
        return TOKEN_BYTES * n
    if unit <= L:
        lse = a * n * (wide_bytes(bpe) - bpe) if algo == "ring" else 0
        return cp_block_elems(s, 1, h, a, C, algo) * bpe + lse
    return (2 * n * h + n) * bpe


def cp_recompute_kv(b: int, n: int, h: int, C: int, algo: str, bpe: int, mode: str) -> tuple[int, int]:
    """(bytes, messages) one rank sends AGAIN per block per micro-batch of b sequences under --recompute
    `mode` (module docstring): the ring's forward hops 2 (C-1) b n h bpe in C-1 messages under full or
    selective; Ulysses' 4 forward all-to-alls, 4 (C-1) pieces of b n h / C, under full only."""
    if mode == "none" or C == 1 or (algo != "ring" and mode == "selective"):
        return 0, 0
    if algo == "ring":
        return 2 * (C - 1) * b * n * h * bpe, C - 1
    return 4 * (C - 1) * (b * n * h // C) * bpe, 4 * (C - 1)


def cp_unit_softmax_bytes(unit: int, L: int, a: int, s: int, C: int, algo: str, bpe: int) -> int:
    """Bytes of one sequence's block that --recompute selective drops: the ring's lse (a n, wide type),
    Ulysses' P (a s n); 0 for the embedding and the head."""
    if not 0 < unit <= L:
        return 0
    n = s // C
    return a * n * wide_bytes(bpe) if algo == "ring" else a * s * n * bpe


def predict_cp_pipeline_run(cfg, world_size: int, steps: int, hw) -> dict:
    """predict_run's dict for --cp C --pp S: one entry per world rank (module docstring)."""
    L, h, a, s, V = cfg.blocks, cfg.hidden, cfg.heads, cfg.seq_len, cfg.vocab
    C, S, M, sched = cfg.cp, cfg.pp, cfg.microbatches, cfg.schedule
    Vs = cfg.virtual_stages if sched == "interleaved" else 1
    K = n_chunks(sched, S, Vs)
    n, algo = s // C, cfg.cp_algo
    dp = cfg.dp if cfg.dp is not None else world_size // (S * C)
    prec = PRECISIONS[precision_of(cfg)]
    bpe = prec.act
    sizes = unit_sizes(L, h, s, V)
    counts = cfg.stage_layers or balanced_counts(sizes, K)
    bounds = [(sum(counts[:k]), sum(counts[: k + 1])) for k in range(K)]
    opt_bpp = prec.optimizer[(cfg.optimizer, bool(cfg.momentum))]
    cp_op = "cp-kv" if algo == "ring" else "cp-alltoall"
    mode = cfg.recompute

    def kept(k: int) -> tuple[int, int]:
        """(held from forward to backward, held during backward) per sequence for chunk k."""
        lo, hi = bounds[k]
        full = sum(cp_unit_kept_bytes(u, L, h, a, s, C, algo, bpe) for u in range(lo, hi))
        if mode == "full":
            return (TOKEN_BYTES * n if lo == 0 else n * h * bpe), full
        if mode == "selective":
            return full - sum(cp_unit_softmax_bytes(u, L, a, s, C, algo, bpe) for u in range(lo, hi)), full
        return full, full

    ranks, memory, stage_s = [], [], []
    for r in range(world_size):
        st, rest = divmod(r, dp * C)
        d, c = divmod(rest, C)
        mine = stage_chunks(sched, S, Vs, st)
        rows = [split(chunk(k_rows, dp, d), M) for k_rows in split(cfg.batch, cfg.grad_accum)]
        ops: dict[str, Cost] = {}

        def add(op: str, sent: int, messages: int) -> None:
            ops[op] = ops.get(op, Cost()) + Cost(sent * steps, messages * steps, 0, 0, 0)

        fwd = bwd = redo = 0
        model = Cost()
        for k in mine:
            lo, hi = bounds[k]
            blocks = sum(1 for u in range(lo, hi) if 0 < u <= L)
            for b in (b for step in rows for b in step):
                if k < K - 1 and chunk_stage(sched, S, k + 1) != st:
                    add("pp-send-act", b * n * h * bpe, 1)
                if k > 0 and chunk_stage(sched, S, k - 1) != st:
                    add("pp-send-grad", b * n * h * bpe, 1)
                if blocks:
                    again, again_msgs = cp_recompute_kv(b, n, h, C, algo, bpe, mode)
                    sent = cp_kv_bytes(b, n, h, C, algo, bpe) + again
                    add(cp_op, blocks * sent, blocks * (cp_messages(C, algo) + again_msgs))
                chunk_fwd = b * sum(unit_forward_flops(u, L, h, s, V) for u in range(lo, hi)) // C
                chunk_bwd = 2 * chunk_fwd
                square = 2 * s * n * h  # one score product over my share of the square (Ulysses')
                if algo == "ring":  # its causal blocks instead: 2 products forward, 5 backward
                    one = ring_rank_product_flops(n, h, C)
                    chunk_fwd += blocks * b * 2 * (one - square)
                    chunk_bwd += blocks * b * (5 * one - 4 * square)
                fwd, bwd = fwd + chunk_fwd, bwd + chunk_bwd
                if mode == "full":
                    redo += chunk_fwd
                elif mode == "selective":  # the ring's forward again (its lse); Ulysses' q k^T
                    redo += blocks * b * (2 * one if algo == "ring" else square)
            for elems in dp_buckets(sizes[lo:hi], prec.grad, cfg.bucket_mb):
                model = model + to_bytes(
                    ALLREDUCE[cfg.collectives](elems, dp * C, d * C + c), prec.grad, steps
                )
        P = sum(sizes[u] for k in mine for u in range(*bounds[k]))
        mem = {"params": P * prec.param, "grads": P * prec.grad, "optimizer": P * opt_bpp}
        held = [kept(k) for k in range(K)]
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
        record = rank_record(
            r, {"pp": st, "dp": d, "cp": c, "tp": 0}, activation=ops, model={"grad-allreduce": model}
        )
        ranks.append(record | {"flops": {"forward": fwd, "backward": bwd, "recompute": redo}})
    compute_s = step_s = max(stage_s) * (M + S - 1) / M
    comm_s = 0.0
    if hw is not None and cfg.tp == 1:  # as --clock sim charges it
        from .cp_pipeline_time import cp_pipeline_step_seconds

        timed = cp_pipeline_step_seconds(cfg, dp, sizes, hw)
        step_s, compute_s, comm_s = timed["step_s"], timed["compute_s"], timed["comm_s"]
    pipeline = {"bubble": (S - 1) / (M + S - 1), "stage_units": bounds}
    return run_result(cfg, hw, steps, ranks, memory, sum(sizes), (step_s, compute_s, comm_s), **pipeline)
