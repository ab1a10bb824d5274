"""--arch gpt on pipeline stages (--pp, any dp), in closed form: bytes, memory, FLOPs per rank.

simpar's executor (parallel/pipeline/) is NOT imported: its rules are written down again here.
  stages      the units (embedding, L blocks, head) cut into contiguous runs balanced by parameter
              count, later parts as long as they can be (stages.balanced_counts, found by bisection;
              the executor's partition.py finds the same split by dynamic programming)
  messages    each chunk boundary between two ranks: per micro-batch of b sequences, the residual
              stream b s h forward ("pp-send-act") and its gradient b s h backward ("pp-send-grad"),
              times the compute type's bytes (Narayanan et al. 2021, sec. 2.2: the pipeline moves only
              the activations at stage boundaries)
  dp          each chunk's gradients all-reduced over the dp group in its own buckets (data.py)
  activations what each unit keeps per sequence (costmodel/gpt.py, gpt.py's units): the embedding 8 s
              bytes of int64 token ids, a block 16 s h + a s^2 + 2 s elements, the head 2 s h + s;
              alive as the schedule's order says (order.peak_alive).
              --recompute full keeps the chunk's input only (its tokens, or b s h elements: Korthikanti
              et al. 2022, Table 2's last row, 2 s b h in 16-bit) and rebuilds the rest in backward;
              selective drops each block's softmax output P (a s^2 per sequence, the "s^2 part" of
              Korthikanti et al. sec. 4.2) and recomputes it from the kept q and k.
  FLOPs       per sequence, a block's forward 24 s h^2 + 4 s^2 h, the head's 2 s h V (Narayanan et al.
              2021, sec. 5.1: 72 B s L h^2 (1 + s/6h + V/12Lh) = 3 x these); the backward twice the
              forward; recompute full: the chunk's forward again; selective: q k^T again, 2 s^2 h a block.
  time        as the simulated clock charges the step: gpt_pipeline_time.py (steptime.py's recurrences
              over gpt's units).
"""

from __future__ import annotations

from .collectives import ALLREDUCE, Cost, chunk, to_bytes
from .gpt import rank_record, run_result, unit_sizes
from .order import chunk_stage, n_chunks, peak_alive, stage_chunks
from .spec import PRECISIONS, dp_buckets, precision_of, split
from .stages import balanced_counts

TOKEN_BYTES = 8  # int64 token ids, whatever the precision


def unit_kept_bytes(unit: int, L: int, h: int, a: int, s: int, bpe: int, recompute: str) -> tuple[int, int]:
    """(bytes every forward keeps, bytes its backward holds in full) per SEQUENCE for one unit, before
    --recompute full (which keeps only a chunk's input: chunk_held)."""
    if unit == 0:
        full = TOKEN_BYTES * s
    elif unit <= L:
        full = (16 * s * h + a * s * s + 2 * s) * bpe
    else:
        full = (2 * s * h + s) * bpe
    kept = full - (a * s * s * bpe if recompute == "selective" and 0 < unit <= L else 0)
    return kept, full


def unit_forward_flops(unit: int, L: int, h: int, s: int, V: int) -> int:
    """Matmul FLOPs of one sequence's forward through a unit (module docstring)."""
    if unit == 0:
        return 0
    return 24 * s * h * h + 4 * s * s * h if unit <= L else 2 * s * h * V


def predict_pipeline_run(cfg, world_size: int, steps: int, hw) -> dict:
    """predict_run's dict (costmodel/gpt.py) for --pp S > 1: one entry per world rank, pp outermost."""
    L, h, a, s, V = cfg.blocks, cfg.hidden, cfg.heads, cfg.seq_len, cfg.vocab
    S, M, sched = cfg.pp, cfg.microbatches, cfg.schedule
    Vs = cfg.virtual_stages if sched == "interleaved" else 1
    p = cfg.dp if cfg.dp is not None else world_size // S
    prec = PRECISIONS[precision_of(cfg)]
    bpe, mode = prec.act, cfg.recompute
    sizes = unit_sizes(L, h, s, V)
    C = n_chunks(sched, S, Vs)
    counts = cfg.stage_layers or balanced_counts(sizes, C)
    bounds = [(sum(counts[:k]), sum(counts[: k + 1])) for k in range(C)]
    opt_bpp = prec.optimizer[(cfg.optimizer, bool(cfg.momentum))]

    def kept(c: int) -> tuple[int, int]:
        """(held from forward to backward, held during backward) per sequence for chunk c."""
        lo, hi = bounds[c]
        pairs = [unit_kept_bytes(u, L, h, a, s, bpe, mode) for u in range(lo, hi)]
        full = sum(f for _, f in pairs)
        if mode == "full":
            return (TOKEN_BYTES * s if lo == 0 else s * h * bpe), full
        return sum(k for k, _ in pairs), full

    ranks, memory, stage_s = [], [], []
    for r in range(world_size):
        st, d = r // p, r % p
        mine = stage_chunks(sched, S, Vs, st)
        rows = [split(chunk(k_rows, p, d), M) for k_rows in split(cfg.batch, cfg.grad_accum)]
        ops: dict[str, Cost] = {}

        def add(op: str, cost: Cost, elem_bytes: int, times: int = 1) -> None:
            ops[op] = ops.get(op, Cost()) + to_bytes(cost, elem_bytes, times * steps)

        fwd = 0
        for c in mine:
            lo, hi = bounds[c]
            for b in (b for step in rows for b in step):
                n = b * s * h  # the residual stream of b sequences
                if c < C - 1 and chunk_stage(sched, S, c + 1) != st:
                    add("pp-send-act", Cost(n, 1, 0, 1, n), bpe)
                if c > 0 and chunk_stage(sched, S, c - 1) != st:
                    add("pp-send-grad", Cost(n, 1, 0, 1, n), bpe)
                fwd += b * sum(unit_forward_flops(u, L, h, s, V) for u in range(lo, hi))
        model_ops: dict[str, Cost] = {}
        local = [n for c in mine for n in sizes[slice(*bounds[c])]]
        if p > 1:
            for c in mine:
                for n in dp_buckets(sizes[slice(*bounds[c])], prec.grad, cfg.bucket_mb):
                    cost = to_bytes(ALLREDUCE[cfg.collectives](n, p, d), prec.grad, steps)
                    model_ops["grad-allreduce"] = model_ops.get("grad-allreduce", Cost()) + cost
        P = sum(local)
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
        recomputed = {"none": 0, "full": fwd}.get(mode, 0)
        if mode == "selective":
            blocks = sum(1 for c in mine for u in range(*bounds[c]) if 0 < u <= L)
            recomputed = 2 * s * s * h * blocks * sum(map(sum, rows))
        stage_s.append(((3 * fwd + recomputed) / hw.flop_rate(precision_of(cfg))) if hw is not None else 0.0)
        record = rank_record(r, {"pp": st, "dp": d, "tp": 0}, model=model_ops, activation=ops)
        ranks.append(record | {"flops": {"forward": fwd, "backward": 2 * fwd, "recompute": recomputed}})
    bubble = (S - 1) / (M + S - 1)
    compute_s = step_s = max(stage_s) * (M + S - 1) / M
    comm_s = 0.0
    if hw is not None:  # as the simulated clock charges a step (gpt_pipeline_time.py)
        from .gpt_pipeline_time import pipeline_step_seconds

        timed = pipeline_step_seconds(cfg, p, sizes, hw)
        step_s, compute_s, comm_s = timed["step_s"], timed["compute_s"], timed["comm_s"]
    pipeline = {"bubble": bubble, "stage_units": bounds}
    return run_result(cfg, hw, steps, ranks, memory, sum(sizes), (step_s, compute_s, comm_s), **pipeline)
