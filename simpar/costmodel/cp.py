"""Context parallelism (--cp C) in closed form: its bytes, its activation memory, its plan.

Notation as gpt.py: L blocks, hidden h, a heads, sequence s, bpe bytes per element; C cp ranks, each
holding n = s/C tokens (chunks r and 2C-1-r of 2C) of b sequences. parallel/context_attention.py's
rules written down again (nothing here calls it):

  ring (Liu et al. 2023; Megatron-LM's context parallelism), op cp-kv, per block per step per rank:
      forward   C-1 hops of K and V                         2 (C-1) b n h elements
      backward  C-1 hops of K and V, C-1 of dK and dV        4 (C-1) b n h elements
  Ulysses (Jacobs et al. 2023, "DeepSpeed Ulysses", sec. 3), op cp-alltoall: 4 all-to-alls forward
      (q, k, v to head shards, o back) and 4 backward, each (C-1)/C b n h elements
                                                            8 (C-1)/C b n h elements
  (the ring's dK, dV partial sums in the wide type: 4 bytes under mixed precision, as its log-sum-exp)
  gradients: one ring all-reduce over dp x C ranks (Megatron's dp group with CP): 2(dp C-1)/(dp C) P.

Activations kept per block per sequence (elements): simpar's serial block keeps 16 s h + a s^2 + 2 s
(gpt.py). A cp rank keeps the same per-token arrays for its n tokens, and of the scores:
      ring     nothing: only the log-sum-exp, a n (P is rebuilt from it in backward, FlashAttention's
               trick): 16 n h + a n + 2 n
      Ulysses  P of its a/C heads over the whole sequence, a s^2 / C = a s n: 16 n h + a s n + 2 n,
               exactly 1/C of the serial block
The plan divides Korthikanti et al.'s (2022, Table 2) per-layer activations by C, as the sequence is
(Megatron-LM's CP documentation: "activation memory per GPU is reduced by CP times").
"""

from __future__ import annotations

from .collectives import ALLREDUCE, Cost, to_bytes
from .gpt import rank_record, run_result, unit_sizes
from .gpt_plan import plan as gpt_plan
from .gpt_plan import score_flops_per_step
from .spec import PRECISIONS, chunk, dp_buckets, precision_of, split

CP_ALGOS_PLANNED = ("ring", "ulysses")


def cp_kv_elems(b: int, n: int, h: int, C: int, algo: str) -> dict:
    """Elements one rank sends per block per step: {"forward", "backward"} (module docstring)."""
    if C == 1:
        return {"forward": 0, "backward": 0}
    if algo == "ring":
        return {"forward": 2 * (C - 1) * b * n * h, "backward": 4 * (C - 1) * b * n * h}
    piece = b * n * h // C  # one rank's piece of one all-to-all
    return {"forward": 4 * (C - 1) * piece, "backward": 4 * (C - 1) * piece}


def ring_block_map(C: int) -> list[list[tuple[int, int] | None]]:
    """For each query chunk q and key chunk k of 2C: (the rank that computes the block, the hop it
    does so at), or None above the causal diagonal. Rank r owns chunks r and 2C-1-r; it computes the
    blocks of its query chunks, and meets rank j's keys at hop (r - j) mod C. Every rank computes
    2C+1 of the C(2C+1) blocks: 3 at hop 0 (two diagonal, one whole), 2 at every other hop."""
    owner = [min(c, 2 * C - 1 - c) for c in range(2 * C)]
    return [
        [(owner[q], (owner[q] - owner[k]) % C) if k <= q else None for k in range(2 * C)]
        for q in range(2 * C)
    ]


def ring_score_flops(B: int, s: int, L: int, h: int, C: int, recompute: str = "none") -> float:
    """The score products the ring computes in a step (hardware FLOPs): C (2C+1) blocks of m = s/(2C)
    queries x m keys per sequence and block (ring_block_map: the causal triangle's, diagonal blocks
    whole), s^2 (2C+1)/(4C) scores -- just over the causal half that model FLOPs count (gpt.py), not
    the s^2 attention.py computes and masks. Each product over a block and every head is 2 m^2 h
    FLOPs: forward q k^T, P v (2); backward P rebuilt from the log-sum-exp, dV, dP, dQ, dK (5,
    FlashAttention-2's); full recomputation runs the forward again (2 more). Selective keeps the
    log-sum-exp: nothing again (plan_cp)."""
    products = 9 if recompute == "full" else 7
    return products * 2 * h * B * L * s * s * (2 * C + 1) / (4 * C)


def ring_rank_product_flops(n: int, h: int, C: int) -> int:
    """One score product (q k^T, P v, or one of backward's) over the 2C+1 causal blocks a ring rank
    computes, for one sequence and one block of the model, every head of width h: (2C+1) x 2 m^2 h,
    m = n/2. attention.py's count of the same product, the rank's share of the square, is 2 s n h."""
    m = n // 2
    return (2 * C + 1) * 2 * m * m * h


def cp_messages(C: int, algo: str) -> int:
    """Messages one rank sends per block per step: ring 2(C-1) K/V + (C-1) dK/dV; Ulysses 8 x (C-1)."""
    return 3 * (C - 1) if algo == "ring" else 8 * (C - 1)


def wide_bytes(bpe: int) -> int:
    """Bytes of the type the attention's sums are kept in: float32 for 16-bit inputs (attention.py)."""
    return 4 if bpe == 2 else bpe


def cp_kv_bytes(b: int, n: int, h: int, C: int, algo: str, bpe: int) -> int:
    """Bytes one rank sends per block per step, forward and backward. The ring's dK, dV partial sums
    travel in the wide type (float32 under mixed precision: summed on C-1 ranks, they are not rounded
    to 16 bits on the way), its K and V in the activations' type."""
    e = cp_kv_elems(b, n, h, C, algo)
    if algo != "ring" or C == 1:
        return (e["forward"] + e["backward"]) * bpe
    grads = 2 * (C - 1) * b * n * h
    return (e["forward"] + e["backward"] - grads) * bpe + grads * wide_bytes(bpe)


def cp_block_elems(s: int, b: int, h: int, a: int, C: int, algo: str) -> int:
    n = s // C
    scores = a * n if algo == "ring" else a * s * n
    return b * (16 * n * h + scores + 2 * n)


def cp_activation_bytes(b: int, s: int, L: int, h: int, a: int, C: int, algo: str, bpe: int) -> int:
    """A cp rank's kept arrays for b sequences: its int64 tokens, L blocks, the head's 2 n h + n. The
    ring's log-sum-exp (a n per sequence) is kept in the wide type."""
    n = s // C
    lse = L * a * n * b * (wide_bytes(bpe) - bpe) if algo == "ring" else 0
    return 8 * n * b + L * cp_block_elems(s, b, h, a, C, algo) * bpe + (2 * n * b * h + n * b) * bpe + lse


def predict_cp_run(cfg, world_size: int, steps: int, hw) -> dict:
    """Per-rank bytes (totals over `steps`), memory and a step time of `simpar train --arch gpt --cp C
    [--dp D]`, keyed like its metrics (world rank = d C + c: mesh.py's numbering with pp = tp = 1).
    Time: as the simulated clock charges it (cp_time.py: each ring hop overlapping the blocks it
    computes), in every precision."""
    L, h, a, s, V, C = cfg.blocks, cfg.hidden, cfg.heads, cfg.seq_len, cfg.vocab, cfg.cp
    dp = cfg.dp if cfg.dp is not None else world_size // C
    prec = PRECISIONS[precision_of(cfg)]
    sizes = unit_sizes(L, h, s, V)
    P = sum(sizes)
    op = "cp-kv" if cfg.cp_algo == "ring" else "cp-alltoall"
    from .hardware import group_link

    grad_link, cp_link = group_link(hw, "dp", dp * C, 1, 1), group_link(hw, "dp", C, 1, 1)
    ranks, memory, comm_s = [], [], 0.0
    for r in range(dp * C):
        d, c = divmod(r, C)
        model, grad_s = Cost(), 0.0
        for n_elems in dp_buckets(sizes, prec.grad, cfg.bucket_mb):
            bucket = to_bytes(ALLREDUCE[cfg.collectives](n_elems, dp * C, r), prec.grad, steps)
            model = model + bucket
            grad_s += bucket.rounds * grad_link.alpha + bucket.round_elems * grad_link.beta
        rows = [chunk(k_rows, dp, d) for k_rows in split(cfg.batch, cfg.grad_accum)]
        kv = sum(cp_kv_bytes(b, s // C, h, C, cfg.cp_algo, prec.act) for b in rows) * L
        act_sent, act_msgs = kv * steps, cp_messages(C, cfg.cp_algo) * L * len(rows) * steps
        # not overlapped: an upper bound (the ring overlaps each hop with its block)
        comm_s = max(comm_s, grad_s + act_sent * cp_link.beta + act_msgs * cp_link.alpha)
        activation = {op: Cost(sent=act_sent, messages=act_msgs)}
        coords = {"pp": 0, "dp": d, "cp": c, "tp": 0}
        ranks.append(rank_record(r, coords, model={"grad-allreduce": model}, activation=activation))
        opt_bpp = prec.optimizer[(cfg.optimizer, bool(cfg.momentum))]
        mem = {"params": P * prec.param, "grads": P * prec.grad, "optimizer": P * opt_bpp}
        mem["activations_peak"] = cp_activation_bytes(max(rows), s, L, h, a, C, cfg.cp_algo, prec.act)
        memory.append(mem)
    # as the simulated clock charges a step: each ring hop overlaps its blocks (cp_time.py)
    from .cp_time import cp_step_seconds

    timed = cp_step_seconds(cfg, dp, sizes, hw, precision_of(cfg), prec.act)
    step_s, compute_s, comm_s = timed["step_s"], timed["compute_s"], timed["comm_s"] * max(steps, 1)
    return run_result(cfg, hw, steps, ranks, memory, P, (step_s, compute_s, comm_s / max(steps, 1)))


def plan_cp(shape, batch: int, hw, cp: int, algo: str = "ring", dp: int = 1, **kw) -> dict:
    """gpt_plan.plan for dp x cp x tp x pp GPUs, plus the cp traffic, its attention timed hop by hop.

    gpt_plan.plan run with dp x C ranks sharing the batch is already right for everything but the
    attention: a cp rank holds b = B/(dp M K) sequences of s/C tokens, and Korthikanti's per-layer
    bytes for s tokens of b/C sequences (every term linear in b) equal those for s/C tokens of b
    sequences with the s^2 term divided by C -- the activations of the layout without cp, / C. The
    gradient all-reduce runs over the dp x C ranks (stride tp, as the mesh numbers them), ZeRO shards
    over them too (Megatron's distributed optimizer), and every matmul but the attention's scores
    divides over them.

    The attention is priced as the simulated clock prices simpar's (cp_time.py, on the cp group's
    link: C ranks, stride tp; h/t wide, a/t heads under tp), at the plan's matmul rate (the ring
    keeps a block's scores on chip, as FlashAttention does, so gpt_plan.plan charges no memory passes
    over them -- its per-token ones stand; Ulysses' a/C heads over s tokens pass through memory as
    attention.py's do, the same count as without cp): gpt_plan.plan's score
    products, Narayanan's s/(6h) term (12 B s^2 L h FLOPs, 16 under full recomputation), leave its
    compute, and each layer of a stage adds per micro-batch
      ring      forward  sum_{t<C-1} max(k_t f, w + alpha) + 2 f, backward likewise (cp_time.py's table):
                only the 2C+1 causal blocks of a rank, each hop's K/V transfer hidden behind them
      Ulysses   4 blocking all-to-alls each way + the core of a/C heads over all s tokens
    the forward twice under full recomputation, every micro-batch slot of 1F1B's (M + pp - 1) per
    accumulation step (full recomputation's second forward sends its K/V again: counted in the bytes).
    compute_s keeps the blocks' compute, cp_s the transfer time left exposed; cp_wire_s is the
    traffic's whole time on the link (bytes x beta + messages x alpha): cp_s never exceeds it
    stretched by the bubble, (M + pp - 1)/M. The hardware's FLOPs follow the time: the ring's are
    gpt_plan.plan's less its score products plus ring_score_flops (its causal blocks); Ulysses computes
    every score of its heads and masks them, as attention.py, so gpt_plan.plan's stand. Model FLOPs, and
    so MFU's numerator, are gpt_plan.plan's causal count whatever the layout."""
    from .cp_time import ring_parts, ring_seconds, ulysses_parts, ulysses_seconds
    from .hardware import group_link

    C, L, h, a, s = cp, shape.layers, shape.hidden, shape.heads, shape.seq
    attention = kw.get("attention", "materialized")
    if attention == "flash" and algo == "ulysses" and C > 1:  # its core is priced as attention.py's
        raise ValueError(
            "attention flash with cp's ulysses is not planned (its a/C heads are priced as "
            "attention.py computes them, every score); the ring keeps its blocks on chip already"
        )
    # the ring keeps each block's scores on chip (below): no memory passes over them; Ulysses runs
    # attention.py on its a/C heads, whose scores go through memory as without cp
    base = gpt_plan(shape, batch, hw, dp=dp * C, materialized_scores=algo != "ring" or C == 1, **kw)
    tp, pp = base["layout"]["tp"], base["layout"]["pp"]
    M, K = base["layout"]["microbatches"], base["layout"]["grad_accum"]
    b = batch / (dp * M * K)
    layers = -(-L // pp)
    precision, mode = kw.get("precision", "mixed"), kw.get("recompute", "none")
    full = mode == "full"
    # full: the forward runs again in backward. selective: Ulysses rebuilds P from its local q and k
    # (q k^T, half its forward, as gpt_plan.plan counts for attention without cp); the plan keeps the ring's
    # log-sum-exp (a n per sequence, as FlashAttention-style kernels do), so the ring runs once -- while
    # simpar's own --cp --pp run drops it and re-runs the ring (parallel/pipeline/context_stage.py)
    redo = 1.0 if mode == "full" else 0.5 if mode == "selective" and algo == "ulysses" else 0.0
    bpe, rate = PRECISIONS[precision].act, hw.flop_rate(precision)
    per_layer = cp_kv_bytes(1, s // C, h // tp, C, algo, bpe) * b
    messages = cp_messages(C, algo)
    if full and C > 1:  # the forward's K/V (or all-to-alls) once more
        per_layer += cp_kv_elems(1, s // C, h // tp, C, algo)["forward"] * bpe * b
        messages += (C - 1) * (1 if algo == "ring" else 4)
    cp_bytes = per_layer * layers * M * K
    link = group_link(hw, "dp", C, tp, 1)
    cp_wire_s = cp_bytes * link.beta + messages * layers * M * K * link.alpha if C > 1 else 0.0
    t = base["time"]
    compute_s, cp_s = t["compute_s"], 0.0
    if C > 1:
        slots = K * M * base["bubble_stretch"] * layers  # a stage's layer passes a step, the bubble's too
        # gpt_plan.plan's score matmuls (gpt_plan.score_flops_per_step: 12 B s^2 L h a step, 14 selective, 16
        # full; a FlashAttention kernel's causal 7 or 9)
        per_step = score_flops_per_step(batch, s, L, h, mode, attention)
        scores = per_step / base["world"] / rate * base["bubble_stretch"]
        n, forwards, computes = s // C, 2 if full else 1, 1 + redo
        if algo == "ring":
            forward, backward, _ = ring_seconds(b, n, h // tp, a // tp, C, bpe, rate, 0.0, link)
            f, g, _, _ = ring_parts(b, n, h // tp, a // tp, bpe, rate, 0.0, link)
            f, g = (2 * C + 1) * f, (2 * C + 1) * g  # a rank's blocks: its share of the triangle
        else:
            forward, backward, _ = ulysses_seconds(b, n, h // tp, a // tp, C, bpe, rate, 0.0, link)
            _, f, g = ulysses_parts(b, n, h // tp, a // tp, C, bpe, rate, 0.0, link)
        compute_s += slots * (computes * f + g) - scores
        cp_s = slots * (forwards * (forward - f) + backward - g)
    # memory_s: gpt_plan.plan's, per row
    # imbalance_s: gpt_plan.plan's too -- the ring's blocks cost every stage alike, the head stays on the last
    step_s = compute_s + t["memory_s"] + t["imbalance_s"] + t["tp_s"] + t["pp_s"] + t["dp_s"] + cp_s
    hw_flops, scores = base["hardware_flops_per_step"], base["attention_scores"]
    if C > 1 and algo == "ring":  # gpt_plan.plan's score products for the ring's blocks
        whole = score_flops_per_step(batch, s, L, h, mode, attention)
        hw_flops += ring_score_flops(batch, s, L, h, C, mode) - whole
        scores = f"the causal blocks, (2C+1)/(4C) = {(2 * C + 1) / (4 * C):.3g} of s^2"
    return {
        **base,
        "layout": dict(base["layout"], dp=dp, cp=C, cp_algo=algo),
        "hardware_flops_per_step": hw_flops,
        "attention_scores": scores,
        "cp_bytes_per_gpu": cp_bytes,
        "time": dict(t, step_s=step_s, compute_s=compute_s, cp_s=cp_s, cp_wire_s=cp_wire_s),
        "mfu": base["mfu"] * t["step_s"] / step_s,
    }
