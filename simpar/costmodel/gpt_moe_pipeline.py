"""MoE blocks on pipeline stages (--arch gpt --experts E --ep P --pp S, D dp ranks a stage) in closed
form: parallel/pipeline/expert_stage.py's bytes and memory written again, not imported.

  micro-steps  a step is G M micro-steps (G = --grad-accum, M = --microbatches): micro-step i has
               N_i = chunk(B, G M, i) sequences, dp rank d chunk(N_i, D, d) = b of them; pass g's
               micro-batch mb is micro-step g M + mb (the serial run's --grad-accum G M)
  chunks       the units (embedding, L MoE blocks of 4h^2 + 8h + hE + E (8h^2 + 5h), head) cut into S
               contiguous runs (interleaved: S V, chunk c on stage c mod S) balanced by parameter count
               (stages.balanced_counts, as partition.py)
  boundaries   per micro-batch and chunk boundary between stages the residual stream b s h forward
               ("pp-send-act") and its gradient b s h backward ("pp-send-grad"), times bpe, as
               costmodel/gpt_pipeline.py
  all-to-all   per micro-step and block of the rank's stage, costmodel/gpt_moe.py's four ops from the
               routing (kept[s][e] of the stage's dp ranks, capacity ceil(C K N_i s / E)), or balanced;
               --recompute full re-runs each forward before its backward: ep-dispatch and ep-combine
               once more (the same routes, so the same rows), the backward's two ops once; with --tp
               also each block's tp-g-allreduce and the first chunk's vocab-embed-allreduce
  gradients    once per step and chunk its dense parameters (embedding, head, blocks' dense parts)
               all-reduced over the D dp ranks, its experts (its blocks' E/P each) over D/P (ring);
               --sp: first each unit's LayerNorm gradients over tp (4h a block, 2h the head)
  --tp, --sp   tp_chunk_ops; under --sp a boundary carries this tp rank's b s h / T, the LayerNorms
               keep n/T rows (gpt_moe_tp.py)
  memory       params, grads, optimizer state of the rank's chunks' dense parameters and experts
  activations  per micro-batch and chunk, gpt_moe.py's per-unit list (token ids 8 b s bytes; a block
               b s (7h + a s + 2) + b s h + kept outputs + 9h per received row + router's b s E; the
               head 2 b s h + b s), alive as the schedule's order says (order.peak_alive);
               --recompute full keeps a chunk's input (8 b s token bytes, or b s h elements) until its
               backward rebuilds the rest, selective drops each block's softmax output (a s b s elements)
               until its backward rebuilds it (recompute.py, as costmodel/gpt_pipeline.py); zb-h1 and
               zb-v hold a micro-batch's bytes from its forward to its W pass
  precision    --precision mixed-*: bpe 2; the router's probabilities and (with --tp) the loss's
               vocab-ce-max and vocab-ce-sums in float32, as parallel/expert_stage.py keeps and sends them
  time         on the hardware profile, as --clock sim charges it (gpt_moe_pipeline_time.py, every
               rank through the schedule).
"""

from __future__ import annotations

from .collectives import ALLREDUCE, Cost, chunk, ring_allgather, ring_reduce_scatter, to_bytes
from .gpt import rank_record
from .gpt_moe import capacity, model_states, moe_run_result
from .moe import EpAlltoalls, kept_in_row_order
from .order import chunk_stage, n_chunks, peak_alive, stage_chunks
from .spec import PRECISIONS, precision_of, split
from .stages import balanced_counts

TOKEN_BYTES = 8


def unit_params(cfg, T: int = 1) -> list[tuple[int, int]]:
    """(dense parameters, parameters of ONE rank's E/P experts) per unit on one of T tp ranks:
    embedding V h/T + s h, a block 4h^2/T + 3h/T + 5h + hE (attention by heads, LayerNorms, bo and
    the router whole: expert_tensor_gpt.py), head 2h + hV/T; the experts whole on every tp rank."""
    h, s, V, E, P = cfg.hidden, cfg.seq_len, cfg.vocab, cfg.experts, cfg.ep
    block = (4 * h * h // T + 3 * h // T + 5 * h + h * E, (E // P) * (8 * h * h + 5 * h))
    return [(V * h // T + s * h, 0)] + [block] * cfg.blocks + [(2 * h + h * V // T, 0)]


def stage_bounds(cfg) -> list[tuple[int, int]]:
    """Each chunk's units [lo, hi) (one chunk a stage; --schedule interleaved: S V, chunk c on stage
    c mod S): balanced by the full units' sizes, every expert counted."""
    E, h = cfg.experts, cfg.hidden
    full = [
        dense + (E * (8 * h * h + 5 * h) if 0 < u <= cfg.blocks else 0)
        for u, (dense, _) in enumerate(unit_params(cfg))
    ]
    C = n_chunks(cfg.schedule, cfg.pp, cfg.virtual_stages if cfg.schedule == "interleaved" else 1)
    counts = cfg.stage_layers or balanced_counts(full, C)
    return [(sum(counts[:k]), sum(counts[: k + 1])) for k in range(C)]


def micro_kept(cfg, D: int, routing: dict | None, steps: int) -> list[list]:
    """Per micro-step of the run: per block (unit 1..L) the D x E kept matrix, from the run's routing
    (exact) or balanced (fractional rows, no drops)."""
    GM, s, E, K = cfg.grad_accum * cfg.microbatches, cfg.seq_len, cfg.experts, cfg.top_k
    seqs = split(cfg.batch, GM)
    if routing is not None:
        return [
            [kept_in_row_order(H, capacity(cfg, seqs[i % GM] * s)) for H in micro]
            for i, micro in enumerate(routing["routed_by_rank"])
        ]
    return [
        [[[chunk(seqs[i % GM], D, r) * s * K / E] * E for r in range(D)]] * cfg.blocks
        for i in range(steps * GM)
    ]


def block_kept_elems(cfg, kept, n: int, d: int, T: int = 1) -> float:
    """Elements one MoE block keeps on dp rank d for n tokens (router's n E counted apart); under tp
    this rank's heads' q, k, v, output and scores are 1/T (costmodel/gpt_moe_tp.py)."""
    h, a, s, E, P = cfg.hidden, cfg.heads, cfg.seq_len, cfg.experts, cfg.ep
    per, j = E // P, d % P
    received = sum(kept[q][e] for q in range(d - j, d - j + P) for e in range(j * per, (j + 1) * per))
    ln, r = (n * h // T, n // T) if cfg.sp else (n * h, n)  # --sp: LayerNorms' xh, 1/sigma on n/T rows
    attention = n * h + 2 * ln + 4 * n * h // T + a * s * n // T + 2 * r
    return attention + n * h + sum(kept[d]) * h + 9 * h * received


def tp_chunk_ops(cfg, lo: int, hi: int, R: int, k: int) -> list[tuple[str, Cost, int]]:
    """(op, elements, times) tp rank k of a chunk of units lo..hi-1 sends for R token rows
    (expert_tensor_gpt.py): per block attention's g (forward) and f (backward) all-reduces -- under
    --sp 4 all-gathers (f-bar, the MoE input; backward g-bar's and dL/dm's) and 2 reduce-scatters
    (g-bar, f-bar's backward) -- and the vocabulary's ops where the embedding and the head are;
    --recompute full sends the forward's ones again."""
    h, L, T, ar = cfg.hidden, cfg.blocks, cfg.tp, ALLREDUCE[cfg.collectives]
    again = 2 if cfg.recompute == "full" else 1
    nb = sum(1 for u in range(lo, hi) if 0 < u <= L)
    first, last, N = lo == 0, hi == L + 2, R * h
    if cfg.sp:
        ag, rs = ring_allgather(N, T, k), ring_reduce_scatter(N, T, k)
        ops = [("sp-gather", ag, nb * (2 * again + 2)), ("sp-scatter", rs, nb * (again + 1))]
        ops += [("vocab-embed-scatter", rs, again), ("vocab-embed-gather", ag, 1)] if first else []
        ops += [("vocab-head-gather", ag, again), ("vocab-head-scatter", rs, 1)] if last else []
    else:
        ops = [("tp-g-allreduce", ar(N, T, k), nb * again), ("tp-f-allreduce", ar(N, T, k), nb)]
        ops += [("vocab-embed-allreduce", ar(N, T, k), again)] if first else []
        ops += [("vocab-head-allreduce", ar(N, T, k), 1)] if last else []
    if last:
        ops += [("vocab-ce-max", ring_allgather(T * R, T, k), 1), ("vocab-ce-sums", ar(2 * R, T, k), 1)]
    return [op for op in ops if op[2]]


def predict_gpt_moe_pipeline_run(cfg, world_size: int, steps: int, hw, routing: dict | None = None) -> dict:
    """Per-rank bytes (totals over `steps`), memory and the step time on `hw`, keyed like predict_run."""
    S, M, G, h, s, E = cfg.pp, cfg.microbatches, cfg.grad_accum, cfg.hidden, cfg.seq_len, cfg.experts
    Vs = cfg.virtual_stages if cfg.schedule == "interleaved" else 1
    T = cfg.tp
    D, P = (cfg.dp if cfg.dp is not None else world_size // (S * T)), cfg.ep
    prec = PRECISIONS[precision_of(cfg)]
    bpe = prec.act
    micro = micro_kept(cfg, D, routing, steps)
    steps = len(micro) // (G * M)
    seqs = split(cfg.batch, G * M)
    bounds, units = stage_bounds(cfg), unit_params(cfg, T)
    opt_bpp = prec.optimizer[(cfg.optimizer, bool(cfg.momentum))]
    ranks, memory = [], []
    C = len(bounds)
    alltoalls = EpAlltoalls(E, P, h, cfg.alltoall)  # each (matrix, rank) once: moe.py
    for r in range(world_size):
        (st, d), k = divmod(r // T, D), r % T  # world rank (st D + d) T + k
        mine = stage_chunks(cfg.schedule, S, Vs, st)
        act: dict[str, Cost] = {}
        model: dict[str, Cost] = {}

        def add(ops: dict, op: str, cost: Cost, elem_bytes: int, times: int = 1) -> None:
            if cost.messages:
                ops[op] = ops.get(op, Cost()) + to_bytes(cost, elem_bytes, times)

        def blocks(c: int) -> list[int]:
            return [u for u in range(*bounds[c]) if 0 < u <= cfg.blocks]

        for i, kept_blocks in enumerate(micro):
            n = chunk(seqs[i % (G * M)], D, d) * s * h  # this rank's residual stream
            x = n // T if cfg.sp else n  # what crosses a boundary: --sp, this tp rank's rows
            for c in mine:
                if c < C - 1 and chunk_stage(cfg.schedule, S, c + 1) != st:
                    add(act, "pp-send-act", Cost(x, 1, 0, 1, x), bpe)
                if c > 0 and chunk_stage(cfg.schedule, S, c - 1) != st:
                    add(act, "pp-send-grad", Cost(x, 1, 0, 1, x), bpe)
                for op, cost, times in tp_chunk_ops(cfg, *bounds[c], n // h, k) if T > 1 else ():
                    add(
                        act, op, cost, 4 if op.startswith("vocab-ce") and bpe == 2 else bpe, times
                    )  # float32 loss
                for u in blocks(c) if P > 1 else ():
                    for op, cost in alltoalls(kept_blocks[u - 1], d).items():
                        again = cfg.recompute == "full" and op in ("ep-dispatch", "ep-combine")
                        add(act, op, cost, bpe, 2 if again else 1)
        n_params = 0
        for c in mine:  # one all-reduce of the chunk's dense part, one of its experts (expert_stage.py)
            dense = sum(units[u][0] for u in range(*bounds[c]))
            experts = sum(units[u][1] for u in range(*bounds[c]))
            add(model, "grad-allreduce", ALLREDUCE[cfg.collectives](dense, D, d), prec.grad, steps)
            if experts:  # a chunk without blocks has none (expert_stage.py skips an empty buffer)
                edp = ALLREDUCE[cfg.collectives](experts, D // P, d // P)
                add(model, "expert-grad-allreduce", edp, prec.grad, steps)
            n_params += dense + experts
            for u in range(*bounds[c]) if cfg.sp else ():  # LayerNorms' row-shard sums over tp, per unit
                n = 4 * h if 0 < u <= cfg.blocks else 2 * h if u == cfg.blocks + 1 else 0
                if n:
                    add(model, "sp-grad-allreduce", ALLREDUCE[cfg.collectives](n, T, k), prec.grad, steps)
        ranks.append(rank_record(r, {"pp": st, "dp": d, "tp": k}, model=model, activation=act))

        def held(i: int, b: int, c: int) -> float:
            """Bytes micro-step i's forward keeps on chunk c, b = this rank's sequences of it."""
            n, router = b * s, 4 if precision_of(cfg) == "mixed" else bpe
            lo, hi = bounds[c]
            out = TOKEN_BYTES * n if lo == 0 else 0
            head = n * h + n * h // T + n // T if cfg.sp else 2 * n * h + n  # --sp: LN_f on n/T rows
            out += head * bpe if hi == cfg.blocks + 2 else 0
            for u in blocks(c):
                out += block_kept_elems(cfg, micro[i][u - 1], n, d, T) * bpe + n * E * router
            return out

        def kept(b: int, c: int, full: float) -> float:
            """What --recompute lets the forward of b sequences on chunk c keep of its `full` bytes."""
            n = b * s
            if cfg.recompute == "full":  # the chunk's input: tokens, or (--sp: this rank's rows of) n h
                return TOKEN_BYTES * n if bounds[c][0] == 0 else n * h // (T if cfg.sp else 1) * bpe
            if cfg.recompute == "selective":  # each block's P: a s per token row, this rank's heads
                return full - len(blocks(c)) * cfg.heads * s * n // T * bpe
            return full

        peak = 0
        for p in range(0, len(micro), M):  # each grad-accum pass of M micro-batches
            b = [chunk(seqs[(p + m) % (G * M)], D, d) for m in range(M)]
            size = lambda m, c, p=p, b=b: kept(b[m], c, held(p + m, b[m], c))  # noqa: E731
            extra = None
            if cfg.recompute != "none":  # what the backward rebuilds, held until the backward's end
                extra = lambda m, c, p=p, b=b: held(p + m, b[m], c) - size(m, c)  # noqa: E731
            peak = max(peak, peak_alive(cfg.schedule, S, M, st, Vs, size, extra))
        memory.append(model_states(n_params, prec, opt_bpp, peak))
    total = E * (8 * h * h + 5 * h) * cfg.blocks + sum(part for part, _ in unit_params(cfg))
    from .gpt_moe_pipeline_time import moe_pipeline_step_seconds  # as --clock sim charges it

    timed = moe_pipeline_step_seconds(cfg, D, hw, micro, bpe, prec.grad, bounds, units)
    timing = (timed["step_s"], timed["compute_s"], timed["comm_s"])
    return moe_run_result(
        cfg,
        hw,
        steps,
        ranks,
        memory,
        total,
        timing,
        routing,
        seqs[0] * s,
        bubble=(S - 1) / (M + S - 1),
        stage_units=bounds,
    )
