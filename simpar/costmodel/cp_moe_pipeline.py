"""MoE pipeline stages with context parallelism (--arch gpt --experts E --ep P --cp C --pp S [--tp T], D dp
ranks a stage) in closed form: parallel/pipeline/context_expert_stage.py's bytes and memory written again
from gpt_moe_pipeline.py's stage rules and cp_moe.py's routing over segments (nothing here calls the code).

World rank r = ((st D + d) C + c) T + t (mesh.py). A step is G M micro-steps (G = --grad-accum, M =
--microbatches): micro-step i has N_i = chunk(B, G M, i) sequences, dp rank d b = chunk(N_i, D, d) of
them, and cp rank c of each sequence n/b = s/C tokens (chunks c and 2C-1-c of 2C), so n = b s/C tokens.

  chunks       gpt_moe_pipeline.stage_bounds: the full units balanced over S (interleaved: S V) chunks
  boundaries   per micro-step and chunk boundary between stages, the cp rank's own residual stream
               n h forward ("pp-send-act") and n h backward ("pp-send-grad"), times bpe
  cp           per block of the rank's chunks and micro-step, cp.py's cp_kv_bytes(b, s/C, h/T, C, algo)
               in cp_messages(C, algo) messages (ring `cp-kv`, Ulysses `cp-alltoall`): a/T heads' K/V
  tp (T > 1)   per chunk and micro-step gpt_moe_pipeline.tp_chunk_ops for R = b s/C rows: attention's
               g and f per block, the vocabulary's all-reduces and loss on the first and last chunk (the
               MoE part is whole on every tp rank, so each tp index repeats the all-to-alls; cp_moe_tp.py)
  routing      per block and micro-step the segment table T (2C N_i x E, metrics["moe"]
               ["routed_by_segment"]) gives kept[c][d][e] = sum over rank (d, c)'s segments of
               clip(cap_i - sum_{i' < i} T_i'[e], 0, T_i[e]), cap_i = ceil(C_f K N_i s / E)
               (cp_moe.kept_by_rank); balanced without it: b (s/C) K / E, no drops
  all-to-all   gpt_moe.py's four ops over the ep group at cp coordinate c, from kept[c] (h wide)
  --recompute  full: each block's K/V again (cp_pipeline.cp_recompute_kv: ring 2 (C-1) b n h/T, Ulysses
               4 (C-1) b n h/(C T)) and its ep-dispatch and ep-combine again (the same routes); tp's
               forward ops again (tp_chunk_ops); a chunk keeps its input (token ids, or n h, --sp n h/T).
               selective: the ring's K/V again (its lse rebuilt by its forward), Ulysses nothing; each
               block drops its softmax part (ring a n/T wide, Ulysses a s n/T) until its backward
  zb-h1, zb-v  the same bytes (every message is in B); a micro-batch's bytes held until its W pass
  --sp         a boundary carries n h / T; tp_chunk_ops' sp ops; per step each unit's LayerNorm gradients
               over tp ("sp-grad-allreduce": 4h a block, 2h the head); LayerNorms on n/T rows
  gradients    once per step and chunk its dense parameters over the stage's D C dp x cp ranks (place
               d C + c), its experts (E/P a block) over the D/P x C ranks holding them (place (d div P) C
               + c), ring
  memory       params, grads, optimizer: gpt_moe_pipeline.py's tp shards (every cp rank holds its chunks)
  activations  per micro-step and chunk, gpt_moe_pipeline.py's per-unit bytes for n tokens, the scores
               cp.py's: Ulysses P of a/(C T) heads over the sequence, a s n / T (as serial's for n tokens);
               the ring only its log-sum-exp, a n / T in the wide type; alive as the schedule's order says
  time         on the hardware profile gpt_moe_pipeline_time.py (as --clock sim charges it), --sp's
               row shards too.
"""

from __future__ import annotations

from .collectives import ALLREDUCE, Cost, chunk, to_bytes
from .cp import cp_kv_bytes, cp_messages, wide_bytes
from .cp_moe import kept_by_rank
from .cp_pipeline import cp_recompute_kv
from .gpt import rank_record
from .gpt_moe import capacity, model_states, moe_run_result
from .gpt_moe_pipeline import (
    TOKEN_BYTES,
    block_kept_elems,
    stage_bounds,
    tp_chunk_ops,
    unit_params,
)
from .moe import EpAlltoalls
from .order import chunk_stage, peak_alive, stage_chunks
from .spec import PRECISIONS, precision_of, split


def micro_kept(cfg, D: int, routing: dict | None, steps: int) -> list[list]:
    """Per micro-step of the run, per block: kept[c][d][e] (module docstring), exact or balanced."""
    GM, s, E, K, C = cfg.grad_accum * cfg.microbatches, cfg.seq_len, cfg.experts, cfg.top_k, cfg.cp
    seqs = split(cfg.batch, GM)
    if routing is not None:
        return [
            [kept_by_rank(T, capacity(cfg, seqs[i % GM] * s), D, C) for T in micro]
            for i, micro in enumerate(routing["routed_by_segment"])
        ]
    balanced = lambda i: [[[chunk(seqs[i % GM], D, d) * s / C * K / E] * E for d in range(D)]] * C  # noqa: E731
    return [[balanced(i)] * cfg.blocks for i in range(steps * GM)]


def cp_block_kept_bytes(cfg, kept, n: int, d: int, bpe: int) -> float:
    """Bytes one MoE block keeps on dp rank d (kept: its cp coordinate's D x E) for n tokens, router
    apart: block_kept_elems' per-token arrays of a tp rank; its a s n / T scores are Ulysses' (a/(C T)
    heads x s x n), the ring keeps a n / T log-sum-exps in the wide type instead."""
    T, a = cfg.tp, cfg.heads
    elems = block_kept_elems(cfg, kept, n, d, T)
    if cfg.cp_algo == "ring":
        return (elems - a * cfg.seq_len * n // T) * bpe + a * n // T * wide_bytes(bpe)
    return elems * bpe


def predict_cp_moe_pipeline_run(cfg, world_size: int, steps: int, hw, routing: dict | None = None) -> dict:
    """Per-rank bytes (totals over `steps`), memory and the step time on `hw`, keyed like predict_run."""
    S, M, G, C, T = cfg.pp, cfg.microbatches, cfg.grad_accum, cfg.cp, cfg.tp
    h, s, E = cfg.hidden, cfg.seq_len, cfg.experts
    Vs = cfg.virtual_stages if cfg.schedule == "interleaved" else 1
    D, P = (cfg.dp if cfg.dp is not None else world_size // (S * C * T)), cfg.ep
    prec = PRECISIONS[precision_of(cfg)]
    bpe, algo = prec.act, cfg.cp_algo
    micro = micro_kept(cfg, D, routing, steps)
    steps = len(micro) // (G * M)
    seqs = split(cfg.batch, G * M)
    bounds, units = stage_bounds(cfg), unit_params(cfg, T)
    opt_bpp = prec.optimizer[(cfg.optimizer, bool(cfg.momentum))]
    cp_op = "cp-kv" if algo == "ring" else "cp-alltoall"
    # --recompute selective drops, per sequence and block, the ring's log-sum-exps (a n / T, wide type)
    # or Ulysses' P of a/(C T) heads over s x s (a s n / T): cp_pipeline.cp_unit_softmax_bytes over tp
    a, n_seq = cfg.heads, s // C
    softmax_bytes = a * n_seq // T * wide_bytes(bpe) if algo == "ring" else a * s * n_seq // T * bpe
    ranks, memory, K = [], [], len(bounds)

    def blocks(k: int) -> list[int]:
        return [u for u in range(*bounds[k]) if 0 < u <= cfg.blocks]

    alltoalls = EpAlltoalls(E, P, h, cfg.alltoall)  # each (matrix, rank) once: moe.py
    for r in range(world_size):
        (st, d), c, t = divmod(r // (C * T), D), r // T % C, r % T
        mine = stage_chunks(cfg.schedule, S, Vs, st)
        act: dict[str, Cost] = {}
        model: dict[str, Cost] = {}

        def add(ops: dict, op: str, cost: Cost, elem_bytes: int, times: int = 1) -> None:
            if cost.messages:
                ops[op] = ops.get(op, Cost()) + to_bytes(cost, elem_bytes, times)

        for i, kept_blocks in enumerate(micro):
            b = chunk(seqs[i % (G * M)], D, d)
            n = b * (s // C) * h  # this cp rank's residual stream
            x = n // T if cfg.sp else n  # what crosses a boundary: --sp, this tp rank's rows of it
            for k in mine:
                if k < K - 1 and chunk_stage(cfg.schedule, S, k + 1) != st:
                    add(act, "pp-send-act", Cost(x, 1, 0, 1, x), bpe)
                if k > 0 and chunk_stage(cfg.schedule, S, k - 1) != st:
                    add(act, "pp-send-grad", Cost(x, 1, 0, 1, x), bpe)
                if blocks(k) and C > 1:  # --recompute: the ring's forward hops again (Ulysses': full only)
                    again, again_msgs = cp_recompute_kv(b, s // C, h // T, C, algo, bpe, cfg.recompute)
                    kv = cp_kv_bytes(b, s // C, h // T, C, algo, bpe) + again
                    msgs = cp_messages(C, algo) + again_msgs
                    add(act, cp_op, Cost(kv, msgs, 0, msgs, kv), 1, len(blocks(k)))  # already bytes
                for op, cost, times in tp_chunk_ops(cfg, *bounds[k], b * (s // C), t) if T > 1 else ():
                    add(
                        act, op, cost, 4 if op.startswith("vocab-ce") and bpe == 2 else bpe, times
                    )  # float32 loss
                for u in blocks(k) if P > 1 else ():
                    for op, cost in alltoalls(kept_blocks[u - 1][c], d).items():
                        again = cfg.recompute == "full" and op in ("ep-dispatch", "ep-combine")
                        add(act, op, cost, bpe, 2 if again else 1)
        n_params = 0
        for k in mine:  # one all-reduce of the chunk's dense part over dp x cp, one of its experts
            dense = sum(units[u][0] for u in range(*bounds[k]))
            experts = sum(units[u][1] for u in range(*bounds[k]))
            replicas = ALLREDUCE[cfg.collectives](dense, D * C, d * C + c)
            add(model, "grad-allreduce", replicas, prec.grad, steps)
            if experts:
                edp = ALLREDUCE[cfg.collectives](experts, (D // P) * C, (d // P) * C + c)
                add(model, "expert-grad-allreduce", edp, prec.grad, steps)
            n_params += dense + experts
            for u in range(*bounds[k]) if cfg.sp else ():  # LayerNorms' row-shard sums over tp, per unit
                ln = 4 * h if 0 < u <= cfg.blocks else 2 * h if u == cfg.blocks + 1 else 0
                if ln:
                    add(model, "sp-grad-allreduce", ALLREDUCE[cfg.collectives](ln, T, t), prec.grad, steps)
        ranks.append(rank_record(r, {"pp": st, "dp": d, "cp": c, "tp": t}, model=model, activation=act))

        def held(i: int, b: int, k: int) -> float:
            """Bytes micro-step i's forward keeps on chunk k, b = this rank's sequences of it."""
            n, router = b * (s // C), 4 if precision_of(cfg) == "mixed" else bpe
            lo, hi = bounds[k]
            out = TOKEN_BYTES * n if lo == 0 else 0
            head = n * h + n * h // T + n // T if cfg.sp else 2 * n * h + n  # --sp: LN_f on n/T rows
            out += head * bpe if hi == cfg.blocks + 2 else 0
            for u in blocks(k):
                out += cp_block_kept_bytes(cfg, micro[i][u - 1][c], n, d, bpe) + n * E * router
            return out

        def kept(b: int, k: int, full: float) -> float:
            """What --recompute lets the forward of b sequences on chunk k keep of its `full` bytes."""
            n = b * (s // C)
            if cfg.recompute == "full":  # the chunk's input: its n tokens' ids, or n h elements
                return TOKEN_BYTES * n if bounds[k][0] == 0 else n * h // (T if cfg.sp else 1) * bpe
            if cfg.recompute == "selective":  # each block's softmax part, this rank's a/T heads
                return full - len(blocks(k)) * b * softmax_bytes
            return full

        peak = 0
        for p in range(0, len(micro), M):  # each grad-accum pass of M micro-batches
            b = [chunk(seqs[(p + m) % (G * M)], D, d) for m in range(M)]
            size = lambda m, k, p=p, b=b: kept(b[m], k, held(p + m, b[m], k))  # noqa: E731
            extra = None
            if cfg.recompute != "none":  # what the backward rebuilds, held until the backward's end
                extra = lambda m, k, p=p, b=b: held(p + m, b[m], k) - size(m, k)  # noqa: E731
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
