"""--arch gpt --tp t --pp S [--sp] [--dp d] in closed form: bytes, memory and FLOPs per rank.

parallel/pipeline/engine.py running tensor_gpt.GptTensorStack on each chunk, written down again
(nothing here imports the executor). It is the two closed forms put together:
  stages      the units cut by their WHOLE parameter counts as without tp (gpt_pipeline.py), so a
              layout's stages are the same with and without tp; each stage's units split over its own
              tp group (the world rank is ((stage * dp + d) * t + j), runtime/mesh.py)
  tp          per micro-batch of b sequences (R = b s rows), for each chunk, gpt_tp.micro_step_ops with
              L = the chunk's blocks; the vocabulary-parallel embedding's messages only on the chunk
              that holds unit 0, the head's and the loss's only on the chunk that holds the head
  pipeline    a tp rank sends its own copy of the residual stream to the same tp rank of the next
              stage: b s h per boundary and micro-batch each way; under --sp only its rows, b s h / t
  model       each chunk's gradients of this rank's shards all-reduced over dp in its own buckets;
              --sp: the LayerNorm gradients summed over tp once per step, 4h per block, 2h for the head
  activations per sequence, gpt_tp.py's table per unit (a block 4 s h + 12 s h/t + a s^2/t + 2 s
              elements, or under --sp 2 s h + 14 s h/t + a s^2/t + 2 s/t; the head 2 s h + s, or
              s h + s h/t + s/t; the embedding 8 s bytes of token ids), alive as the schedule's order
              says (order.peak_alive); --recompute selective drops each block's a s^2/t, full keeps
              the chunk's input (token ids, or b s h elements, b s h / t under --sp) and its backward
              re-runs the chunk's forward: its tp messages once more (recompute_ops).
  FLOPs       gpt_pipeline.py's per chunk, the matmuls divided over the t ranks.
  time        as the simulated clock charges the step: gpt_pipeline_time.py's recurrences with each
              unit's tp share and its blocking tp collectives.
"""

from __future__ import annotations

from .collectives import ALLREDUCE, Cost, chunk, ring_allgather, ring_reduce_scatter, to_bytes
from .gpt import rank_record, run_result, unit_sizes
from .gpt_pipeline import TOKEN_BYTES, unit_forward_flops
from .gpt_tp import local_unit_sizes, micro_step_ops
from .order import chunk_stage, n_chunks, peak_alive, stage_chunks
from .spec import PRECISIONS, dp_buckets, precision_of, split
from .stages import balanced_counts


def unit_kept(unit: int, L: int, h: int, a: int, s: int, t: int, sp: bool, bpe: int) -> tuple[int, int]:
    """(bytes one tp rank keeps per SEQUENCE for one unit under --recompute selective, without):
    selective drops a block's softmax output, a s^2 / t (gpt_recompute.py)."""
    if unit == 0:
        return TOKEN_BYTES * s, TOKEN_BYTES * s
    if unit > L:
        head = ((s * h + s * h // t + s // t) if sp else (2 * s * h + s)) * bpe
        return head, head
    if sp:
        rest = (2 * s * h + 14 * s * h // t + 2 * s // t) * bpe
    else:
        rest = (4 * s * h + 12 * s * h // t + 2 * s) * bpe
    return rest, rest + a * s * s // t * bpe


def recompute_ops(lo: int, hi: int, L: int, R: int, h: int, t: int, j: int, sp: bool, algorithm: str) -> dict:
    """{op: [Cost, ...]} --recompute full adds per micro-batch: the chunk's forward messages again
    (the g all-reduces, or f-bar's gathers and g-bar's scatters; the embedding's; the head's gather)."""
    blocks = sum(1 for u in range(lo, hi) if 0 < u <= L)
    if not sp:
        ops = {"tp-g-allreduce": [ALLREDUCE[algorithm](R * h, t, j)] * 2 * blocks}
        if lo == 0:
            ops["vocab-embed-allreduce"] = [ALLREDUCE[algorithm](R * h, t, j)]
        return ops
    ops = {"sp-gather": [ring_allgather(R * h, t, j)] * 2 * blocks}
    ops["sp-scatter"] = [ring_reduce_scatter(R * h, t, j)] * 2 * blocks
    if lo == 0:
        ops["vocab-embed-scatter"] = [ring_reduce_scatter(R * h, t, j)]
    if hi == L + 2:
        ops["vocab-head-gather"] = [ring_allgather(R * h, t, j)]
    return ops


def chunk_ops(lo: int, hi: int, L: int, R: int, h: int, t: int, j: int, sp: bool, algorithm: str) -> dict:
    """{op: [Cost, ...]} one micro-batch of R rows through units lo..hi-1 sends over tp (elements)."""
    blocks = sum(1 for u in range(lo, hi) if 0 < u <= L)
    ops = micro_step_ops(R, h, blocks, t, j, sp, algorithm)
    for op in list(ops):
        if (op.startswith("vocab-embed") and lo > 0) or (
            op.startswith(("vocab-head", "vocab-ce")) and hi <= L + 1
        ):
            del ops[op]
    return ops


def predict_tp_pipeline_run(cfg, world_size: int, steps: int, hw) -> dict:
    """predict_run's dict (costmodel/gpt.py) for --tp t > 1 with --pp S > 1."""
    L, h, a, s, V, t = cfg.blocks, cfg.hidden, cfg.heads, cfg.seq_len, cfg.vocab, cfg.tp
    S, M, sched, sp = cfg.pp, cfg.microbatches, cfg.schedule, cfg.sp
    Vs = cfg.virtual_stages if sched == "interleaved" else 1
    p = cfg.dp if cfg.dp is not None else world_size // (S * t)
    prec = PRECISIONS[precision_of(cfg)]
    bpe, mode = prec.act, cfg.recompute
    ce_bpe = 4 if bpe == 2 else bpe  # the loss in float32 for half logits (vocab_parallel.py)
    sizes, local = unit_sizes(L, h, s, V), local_unit_sizes(L, h, s, V, t)
    C = n_chunks(sched, S, Vs)
    counts = cfg.stage_layers or balanced_counts(sizes, C)
    bounds = [(sum(counts[:k]), sum(counts[: k + 1])) for k in range(C)]
    opt_bpp = prec.optimizer[(cfg.optimizer, bool(cfg.momentum))]

    def kept(c: int) -> tuple[int, int]:
        """(held from forward to backward, held during backward) per sequence for chunk c."""
        lo, hi = bounds[c]
        pairs = [unit_kept(u, L, h, a, s, t, sp, bpe) for u in range(lo, hi)]
        full = sum(f for _, f in pairs)
        if mode == "full":  # the chunk's input only: its tokens, or this rank's residual stream
            return (TOKEN_BYTES * s if lo == 0 else (s * h // t if sp else s * h) * bpe), full
        return (sum(k for k, _ in pairs) if mode == "selective" else full), full

    ranks, memory = [], []
    for r in range(world_size):
        st, rest = divmod(r, p * t)
        d, j = divmod(rest, t)
        mine = stage_chunks(sched, S, Vs, st)
        rows = [split(chunk(k_rows, p, d), M) for k_rows in split(cfg.batch, cfg.grad_accum)]
        act: dict[str, Cost] = {}
        model: dict[str, Cost] = {}

        def add(ops: dict, op: str, cost: Cost, elem_bytes: int) -> None:
            if cost.messages:
                ops[op] = ops.get(op, Cost()) + to_bytes(cost, elem_bytes, steps)

        fwd = 0
        for c in mine:
            lo, hi = bounds[c]
            for b in (b for step in rows for b in step):
                n = b * s * h // t if sp else b * s * h  # this tp rank's residual stream
                if c < C - 1 and chunk_stage(sched, S, c + 1) != st:
                    add(act, "pp-send-act", Cost(n, 1, 0, 1, n), bpe)
                if c > 0 and chunk_stage(sched, S, c - 1) != st:
                    add(act, "pp-send-grad", Cost(n, 1, 0, 1, n), bpe)
                ops = chunk_ops(lo, hi, L, b * s, h, t, j, sp, cfg.collectives)
                if mode == "full":
                    for op, costs in recompute_ops(lo, hi, L, b * s, h, t, j, sp, cfg.collectives).items():
                        ops[op] = ops.get(op, []) + costs
                for op, costs in ops.items():
                    for cost in costs:
                        add(act, op, cost, ce_bpe if op.startswith("vocab-ce") else bpe)
                fwd += b * sum(unit_forward_flops(u, L, h, s, V) for u in range(lo, hi)) // t
            if p > 1:
                for n in dp_buckets(local[lo:hi], prec.grad, cfg.bucket_mb):
                    add(model, "grad-allreduce", ALLREDUCE[cfg.collectives](n, p, d), prec.grad)
            if sp:
                for u in range(max(lo, 1), hi):
                    n = 4 * h if u <= L else 2 * h
                    add(model, "sp-grad-allreduce", ALLREDUCE[cfg.collectives](n, t, j), prec.grad)
        P = sum(sum(local[slice(*bounds[c])]) for c in mine)
        mem = {"params": P * prec.param, "grads": P * prec.grad, "optimizer": P * opt_bpp}
        mem["activations_peak"] = max(
            peak_alive(
                sched,
                S,
                len(step),
                st,
                Vs,
                lambda m, c, step=step: step[m] * kept(c)[0],
                None if mode == "none" else (lambda m, c, step=step: step[m] * (kept(c)[1] - kept(c)[0])),
            )
            for step in rows
        )
        memory.append(mem)
        recomputed = fwd if mode == "full" else 0
        if mode == "selective":  # q k^T again, 2 s^2 h per block and sequence, over t
            blocks = sum(1 for c in mine for u in range(*bounds[c]) if 0 < u <= L)
            recomputed = 2 * s * s * h * blocks * sum(map(sum, rows)) // t
        record = rank_record(r, {"pp": st, "dp": d, "tp": j}, model=model, activation=act)
        ranks.append(record | {"flops": {"forward": fwd, "backward": 2 * fwd, "recompute": recomputed}})
    from .gpt_pipeline_time import pipeline_step_seconds

    timed = pipeline_step_seconds(cfg, p, sizes, hw, local)
    step_s, compute_s, comm_s = timed["step_s"], timed["compute_s"], timed["comm_s"]
    pipeline = {"bubble": (S - 1) / (M + S - 1), "stage_units": bounds}
    return run_result(cfg, hw, steps, ranks, memory, sum(sizes), (step_s, compute_s, comm_s), **pipeline)
