"""The step time of MoE blocks on pipeline stages (--arch gpt --experts E --ep P --pp S [--dp D] [--tp T];
--schedule naive, gpipe, 1f1b, interleaved, zb-h1, zb-v) in closed form, as the simulated clock charges it:
steptime.py's max-plus recurrence over the schedule's order, with every rank of a stage on its own
clock, because its chunk's all-to-alls make the ranks of one stage wait for each other and routing
makes them unequal (gpt_moe_time.MoEWork prices a chunk's units on a stage's ranks).

World rank (st D + d) T + k (stage st, dp index d, tp index k). A stage does its (micro-batch, chunk)
steps in order.stage_order's order; micro-batch mb of grad-accum pass g is micro-step g M + mb (the
serial run's --grad-accum G M: parallel/pipeline/expert_stage.py). Rank (st, d, k):
  forward of chunk c   starts when the rank is free and its input from chunk c-1's rank (same d, k)
                       has arrived (a blocking receive), runs the chunk's units (the last chunk: the
                       head and the loss too), then posts its output to chunk c+1's rank: b s h bpe
                       bytes (with --tp every tp rank sends its own copy, --sp its 1/T of the rows)
                       leave when its pp link is
                       free, arrive alpha after their last byte (a chunk on the same stage: at once)
  backward of chunk c  the same with the output gradient from chunk c+1, sent back to chunk c-1;
                       with --recompute, after the receive, full runs the chunk's forward again (no
                       loss: its all-to-alls, tp collectives and cp hops again), selective rebuilds
                       each block's softmax (q k^T, 2 b s^2 h / T FLOPs; --cp: Ulysses' a/(C T) heads,
                       or the ring's forward again, hops and blocks)
  zb-h1, zb-v          the backward is its B half, both all-to-alls (and --cp's hops) in it; the W
                       half is its own step, compute only (moe_split_time.py)
At the end of each pass the rank waits for its sends to leave; before that, in the last pass, each of
its chunks' gradients (ascending chunk order) are all-reduced (--sp: first its units' LayerNorm
gradients summed over tp): the chunk's dense parameters over the
stage's dp ranks, then its experts over their D/P replicas (blocking, no buckets; any --collectives:
allreduce_ends.py). Then the
optimizer over the rank's chunks. The step ends with the slowest rank (the metrics' median over steps).
"""

from __future__ import annotations

from .gpt_moe_time import MoEWork, median_step
from .gpt_time import optimizer_seconds
from .moe_rounds import members_link
from .moe_split_time import backward_input, weight
from .moe_tp_rounds import sp_sums
from .order import chunk_stage, stage_chunks, stage_order
from .spec import split


def moe_pipeline_step_seconds(cfg, D: int, hw, micro: list, bpe: int, grad_bpe: int, bounds, params) -> dict:
    """{step_s, compute_s, comm_s, steps_s}; `micro`: gpt_moe_pipeline.micro_kept's per micro-step list
    of kept (D x E) per block, G M micro-steps a step; `bounds`, `params`: its stage_bounds (each chunk's
    units) and unit_params (each unit's dense and expert parameters on one rank)."""
    S, T, M, G, h = cfg.pp, cfg.tp, cfg.microbatches, cfg.grad_accum, cfg.hidden
    V = cfg.virtual_stages if cfg.schedule == "interleaved" else 1
    C = getattr(cfg, "cp", 1)
    Ws = D * C * T  # a stage's ranks: world rank ((st D + d) C + c) T + k
    n_chunks, GM = len(bounds), G * M
    halves = cfg.schedule in ("zb-h1", "zb-v")

    def rows(ms):  # a boundary's rows on each rank: under --sp its tp rank's 1/T of them
        return [n // T for n in ms["n"]] if cfg.sp else ms["n"]

    works = [MoEWork(cfg, D, hw, bpe, S * Ws, offset=st * Ws) for st in range(S)]
    pp = members_link(hw, [st * Ws for st in range(S)])  # the pp group of (d, k) = (0, 0)
    mine = [stage_chunks(cfg.schedule, S, V, st) for st in range(S)]
    sizes = [[sum(params[u][i] for u in range(lo, hi)) for i in (0, 1)] for lo, hi in bounds]
    optimizer = [
        optimizer_seconds(cfg, sum(sum(sizes[c]) for c in mine[st]), bpe, works[0].stream) for st in range(S)
    ]
    seqs, steps, computes = split(cfg.batch, GM), [], []
    for first in range(0, len(micro), GM):
        now, compute = [[0.0] * Ws for _ in range(S)], [[0.0] * Ws for _ in range(S)]
        free = [[0.0] * Ws for _ in range(S)]  # each rank's outgoing pp link
        cache: dict = {}

        def step_of(st, i):  # micro-step i's work on stage st's ranks
            if (st, i) not in cache:
                blocks = micro[first + i] if C > 1 else [[kept] for kept in micro[first + i]]
                cache[(st, i)] = works[st].micro_step(seqs[i % GM], blocks)
            return cache[(st, i)]

        for g in range(G):
            order = [stage_order(cfg.schedule, S, M, st, V) for st in range(S)]
            pos, arrive, left = [0] * S, {}, [[0.0] * Ws for _ in range(S)]
            progress = True
            while progress:
                progress = False
                for st in range(S):
                    while pos[st] < len(order[st]):
                        kind, mb, c = order[st][pos[st]]
                        if kind == "W":  # zero-bubble: the weight half, no message (moe_split_time.py)
                            weight(works[st], now[st], compute[st], step_of(st, g * M + mb), *bounds[c])
                            pos[st] += 1
                            progress = True
                            continue
                        waits = (kind == "F" and c > 0) or (kind == "B" and c < n_chunks - 1)
                        if waits and (kind, c, mb) not in arrive:
                            break  # its input has not been sent yet: let the other stages move
                        for w, t in enumerate(arrive.pop((kind, c, mb), [0.0] * Ws)):
                            now[st][w] = max(now[st][w], t)  # the blocking receive
                        ms = step_of(st, g * M + mb)
                        if kind == "B":
                            recompute(cfg, works[st], now[st], compute[st], ms, *bounds[c])
                        if kind == "F":
                            works[st].forward(now[st], compute[st], ms, *bounds[c])
                        elif halves:  # zero-bubble: B, the dL/dx half (moe_split_time.py)
                            backward_input(works[st], now[st], compute[st], ms, *bounds[c])
                        else:
                            works[st].backward(now[st], compute[st], ms, *bounds[c])
                        dest = c + 1 if kind == "F" else c - 1
                        if 0 <= dest < n_chunks and chunk_stage(cfg.schedule, S, dest) == st:
                            arrive[(kind, dest, mb)] = list(now[st])  # the V's turn: handed over in memory
                        elif 0 <= dest < n_chunks:
                            arrive[(kind, dest, mb)] = send(
                                now[st], free[st], left[st], rows(ms), h * bpe, pp
                            )
                        pos[st] += 1
                        progress = True
            for st in range(S):
                if g == G - 1:  # AllReduceGrads, the schedule's last step: each chunk, dense then experts
                    for c in mine[st]:
                        sp_sums(works[st], now[st], *bounds[c])  # --sp: its units' LayerNorm sums
                        works[st].allreduce(now[st], sizes[c][0], grad_bpe, False)
                        if sizes[c][1]:
                            works[st].allreduce(now[st], sizes[c][1], grad_bpe, True)
                now[st] = [max(t, sent) for t, sent in zip(now[st], left[st])]  # waiting for its sends
        steps.append(max(max(now[st]) + optimizer[st] for st in range(S)))
        computes.append(max(max(compute[st]) + optimizer[st] for st in range(S)))
    return median_step(steps, computes)


def recompute(cfg, work, now: list, compute: list, ms: dict, lo: int, hi: int) -> None:
    """--recompute before a backward (pipeline/recompute.py, after its blocking receive): full runs the
    chunk's forward again without the loss -- its all-to-alls, tp collectives and cp hops too, on the
    same routes; selective rebuilds each block's softmax from its kept q, k (gpt_recompute.restore_selective,
    every block of the chunk in turn): b (a/T) matmuls s x (h/a) x s per block on a rank of b sequences,
    with --cp Ulysses b (a/(C T)) of them (its heads over all s tokens), with the ring the ring's whole
    forward again, hops and blocks (context_attention.rebuild_softmax; cp_pipeline_time.py's rule)."""
    if cfg.recompute == "full":
        work.forward(now, compute, ms, lo, hi, loss=False)
    elif cfg.recompute == "selective":
        s, h, a, T, C = cfg.seq_len, cfg.hidden, cfg.heads, work.lay.T, work.lay.C
        blocks = sum(1 for u in range(lo, hi) if 0 < u <= cfg.blocks)
        if C > 1 and cfg.cp_algo == "ring":
            for _ in range(blocks):
                ring_again(work, now, compute, ms["b"])
            return
        for w, b in enumerate(ms["b"]):
            seconds = blocks * b * (a // (T * C)) * 2.0 * s * (h // a) * s / work.rate
            now[w] += seconds
            compute[w] += seconds


def ring_again(work, now: list, compute: list, b: list) -> None:
    """One block's ring forward again (rebuild_softmax): every cp group's hops from each rank's own
    clock (MoEWork.cp_attention), and their blocks' compute for the compute share (as MoEWork.forward)."""
    from .cp_time import ring_seconds

    cfg, lay = work.cfg, work.lay
    work.cp_attention(now, b, False)
    for w in range(lay.W):
        args = (b[w], cfg.seq_len // lay.C, cfg.hidden // lay.T, cfg.heads // lay.T, lay.C, work.bpe)
        compute[w] += ring_seconds(*args, work.rate, work.stream, lay.links["cp"])[2]


def send(now: list, free: list, left: list, tokens: list, row_bytes: int, link) -> list:
    """Each rank's message of tokens[w] rows posted at now[w]: when it arrives (free, left updated)."""
    out = []
    for w, t in enumerate(now):
        free[w] = max(t, free[w]) + tokens[w] * row_bytes / link.bw
        left[w] = max(left[w], free[w])
        out.append(free[w] + link.alpha)
    return out
