"""The step time of `simpar train --arch gpt --cp C [--dp D]` in closed form, as the simulated clock
(--clock sim) charges it. Nothing here imports the model, the runtime or the code that moves bytes:
parallel/context_attention.py's charges and message pattern are written down again.

A cp rank computes everything but the attention's scores on its own n = s/C tokens of b sequences
(R = b n rows): gpt_time.unit_seconds with no score work (s = 0). Its attention, with m = s/(2C),
d = h/a, on the cp group's link (alpha, bandwidth bw; hardware.group_link, the ranks of a cp group
are consecutive), K and V in the activations' bpe, dK and dV in the wide type (float32 under mixed
precision, else bpe):

  ring, one block (m queries x m keys, every head):
      forward   f = 2 x 2 b m^2 h / rate + 6 b a m^2 bpe stream
      backward  g = 5 x 2 b m^2 h / rate + 6 b a m^2 bpe stream
      blocks a rank computes at hop t: k_0 = 3, k_t = 2 (cp.ring_block_map)
      w_kv = 2 b n h bpe / bw (K and V of both my chunks, one message), w_dkv the same for dK, dV
      in the wide type
  Each hop posts its K/V receive and send (non-blocking) BEFORE computing its blocks, so a hop lasts
  max(blocks, transfer); the last hop has nothing to send:
      forward   F = sum_{t<C-1} max(k_t f, w_kv + alpha) + k_{C-1} f
  Backward also sends each block's dK, dV partial sum on, AFTER its blocks (it needs them), from hop 1:
      hop 0          max(3 g, w_kv + alpha)
      0 < t < C-1    max(2 g, w_kv) + w_dkv + alpha     (the dK/dV send waits for the K/V send to leave)
      t = C-1        2 g + w_dkv + alpha                 (the partial sums go home)
  Ulysses: 4 all-to-alls each way, blocking, pairwise in C-1 rounds of one piece (b n h / C elements):
      A = (C-1) (alpha + b n h bpe / (C bw));   forward 4 A + 2 x 2 b s (h/C) s / rate + 6 b (a/C) s^2
      bpe stream; backward 4 A + 4 x 2 b s (h/C) s / rate + 4 b (a/C) s^2 bpe stream

--tp T inside each cp rank (parallel/context_tensor.py): the attention above with a/T heads and h/T of
the width (the ring's blocks carry the rank's heads only), and gpt_time's tp units on R = b n rows with
their blocking f and g all-reduces on the tp link (gpt_time.tp_collectives); cp's link has stride T.
With --sp those units run their LayerNorms and residuals on R/T rows, f and g are gather/scatter
pairs, and the last micro-step sums each unit's LayerNorm gradients over tp right after its backward
(gpt_time.step_seconds' `sync`).

The rest is gpt_time's step over the dp x C ranks of the dpcp group: units forward, loss, units
backward; in the last micro-step each unit's gradient buckets start on the dpcp stream when ready
(host_progress: when backward ends), the rank waits for the last, runs the optimizer; the step ends
with the slowest rank. The buckets' all-reduce is --collectives': every rank of the dpcp group
followed through every bucket's rounds (rounds_time.py: ring and auto as NCCL runs them, the tree and
Rabenseifner message by message, ps through the server: ps_time.py). Every rank of a cp group does
the same work, so its hops line up.
"""

from __future__ import annotations

from types import SimpleNamespace

from .chunktime import collective_gamma, seconds
from .collectives import ALLREDUCE, chunk, to_bytes
from .gpt_time import loss_bpe, optimizer_seconds, tp_collectives, unit_seconds
from .rounds_time import bucket_ends
from .spec import dp_bucket_layers, split

# context_attention.py's charges, written again: (products, sweeps over the scores) per block or core
RING_FWD, RING_BWD, CORE_FWD, CORE_BWD = (2, 6), (5, 6), (2, 6), (4, 4)
RING_BLOCKS_FIRST, RING_BLOCKS_OTHER = 3, 2  # causal blocks a rank computes at hop 0 and at every other


def ring_parts(b: int, n: int, h: int, a: int, bpe: int, rate: float, stream: float, link) -> tuple:
    """(f, g, w_kv, w_dkv): one ring block's forward and backward, and one hop's K/V and dK/dV
    message on the wire (module docstring)."""
    m = n // 2

    def block(charges):
        products, sweeps = charges
        return products * 2 * b * m * h * m / rate + sweeps * b * a * m * m * bpe * stream

    w_kv = 2 * b * n * h * bpe / link.bw
    w_dkv = 2 * b * n * h * loss_bpe(bpe) / link.bw  # the partial sums travel in the wide type
    return block(RING_FWD), block(RING_BWD), w_kv, w_dkv


def ring_seconds(b: int, n: int, h: int, a: int, C: int, bpe: int, rate: float, stream: float, link):
    """(forward, backward, compute only) seconds of one block's ring attention on one rank (module
    docstring)."""
    f, g, w_kv, w_dkv = ring_parts(b, n, h, a, bpe, rate, stream, link)
    blocks = [RING_BLOCKS_FIRST] + [RING_BLOCKS_OTHER] * (C - 1)
    forward = sum(max(k * f, w_kv + link.alpha) for k in blocks[:-1]) + blocks[-1] * f
    backward = max(blocks[0] * g, w_kv + link.alpha)
    for k in blocks[1:-1]:
        backward += max(k * g, w_kv) + w_dkv + link.alpha
    backward += blocks[-1] * g + w_dkv + link.alpha
    return forward, backward, sum(blocks) * (f + g)


def ulysses_seconds(b: int, n: int, h: int, a: int, C: int, bpe: int, rate: float, stream: float, link):
    """(forward, backward, compute only) seconds of one block's all-to-all attention on one rank."""
    piece, forward, backward = ulysses_parts(b, n, h, a, C, bpe, rate, stream, link)
    A = (C - 1) * (link.alpha + piece)
    return 4 * A + forward, 4 * A + backward, forward + backward


def ulysses_parts(b: int, n: int, h: int, a: int, C: int, bpe: int, rate: float, stream: float, link):
    """(piece, core forward, core backward): one all-to-all round's message on the wire (b n h / C
    elements) and the attention of a/C heads over all s = n C tokens (module docstring)."""
    s = n * C

    def core(charges):
        products, sweeps = charges
        return products * 2 * b * s * (h // C) * s / rate + sweeps * b * (a // C) * s * s * bpe * stream

    return b * n * h // C * bpe / link.bw, core(CORE_FWD), core(CORE_BWD)


def cp_step_seconds(cfg, dp: int, sizes: list[int], hw, precision: str, bpe: int) -> dict:
    """{step_s, compute_s, comm_s} of a --cp C [--tp T] [--dp D] step (no --zero; mixed precision: the
    optimizer's masters and casts as gpt_time.optimizer_seconds). `sizes`: one rank's units (its tp
    shards). Under --tp the rank's attention is that of its a/T heads (h/T of the width), and its
    units are gpt_time's tp units with their blocking f and g all-reduces on the tp link."""
    from .hardware import group_link

    C, T, h, a, s, L = cfg.cp, cfg.tp, cfg.hidden, cfg.heads, cfg.seq_len, cfg.blocks
    p = dp * C  # the dpcp group: world rank (d C + c) T + j (mesh.py with pp = 1)
    on_node = min(p * T, hw.devices_per_node)
    rate = hw.flop_rate(precision) * hw.compute_share(on_node)
    stream = hw.gamma / 3 / hw.stream_share(on_node)
    overhead = hw.layer_overhead / hw.compute_share(on_node)
    cp_link, dpcp_link = group_link(hw, "dp", C, T, 1), group_link(hw, "dp", p, T, 1)
    tp_link, gamma = group_link(hw, "tp", p, T, 1), collective_gamma(hw)
    attention = ring_seconds if cfg.cp_algo == "ring" else ulysses_seconds
    # the units without their score work (s = 0): context_attention.py charges that, hop by hop
    local = SimpleNamespace(
        hidden=h, heads=a, seq_len=0, vocab=cfg.vocab, tp=T, sp=cfg.sp, blocks=L, collectives=cfg.collectives
    )

    # --collectives: ring and auto are NCCL's ring (auto: or NVLink SHARP), the rest alpha-beta (gpt_time.py)
    ring, nvls = cfg.collectives in ("ring", "auto"), cfg.collectives == "auto"

    def tp_secs(cost, elem_bytes, as_ring):  # gpt_time.tp_collectives' pricing, on the tp link
        return seconds(to_bytes(cost, elem_bytes), tp_link, gamma, as_ring, nvls) if cost.messages else 0.0

    optimizer_s = optimizer_seconds(cfg, sum(sizes), bpe, stream)
    ends, computes, comms, before_dp = [], [], [], []
    buckets, starts = dp_bucket_layers(sizes, bpe, cfg.bucket_mb), {}  # starts: each rank's buckets'
    for w in range(p * T):  # the cp ranks of a dp row do the same work; their ring chunks differ
        g, j = divmod(w, T)  # g: the rank's place in its dpcp group, d C + c
        d = g // C
        sync = [0.0] * len(sizes)  # --sp: each unit's LayerNorm gradients summed over tp (gpt_time.py)
        if cfg.sp:
            sync = [0.0] + [tp_secs(ALLREDUCE[cfg.collectives](4 * h, T, j), bpe, ring)] * L
            sync.append(tp_secs(ALLREDUCE[cfg.collectives](2 * h, T, j), bpe, ring))
        clock = compute = comm = 0.0
        micro = split(cfg.batch, cfg.grad_accum)
        for k, k_rows in enumerate(micro):
            b = chunk(k_rows, dp, d)
            R = b * (s // C)
            fwd, bwd, loss = unit_seconds(local, R, sizes, bpe, rate, stream, overhead)
            fwd_c, bwd_c, loss_c = tp_collectives(local, R, j, bpe, tp_secs)
            attn_f, attn_b, attn_compute = attention(b, s // C, h // T, a // T, C, bpe, rate, stream, cp_link)
            fwd = [t + (attn_f if 0 < i <= L else 0.0) for i, t in enumerate(fwd)]
            bwd = [t + (attn_b if 0 < i <= L else 0.0) for i, t in enumerate(bwd)]
            clock += sum(fwd) + sum(fwd_c) + loss + loss_c
            backward_start, ready = clock, {}
            last = k == len(micro) - 1
            for i in reversed(range(len(sizes))):
                clock += bwd[i] + bwd_c[i] + (sync[i] if last else 0.0)
                ready[i] = clock
            compute += sum(fwd) + loss + sum(bwd) - L * (attn_f + attn_b - attn_compute)
            comm += L * (attn_f + attn_b - attn_compute)  # the attention's exposed transfers
            comm += sum(fwd_c) + loss_c + sum(bwd_c)  # tp's blocking all-reduces
        comm += sum(sync)
        before_dp.append((clock, compute, comm))  # before the gradient buckets (zero_mesh_time.py)
        end, starts[w] = backward_start, []
        for layers in buckets:  # the last micro-step's buckets
            cost = ALLREDUCE[cfg.collectives](sum(sizes[i] for i in layers), p, g)
            grad_s = seconds(to_bytes(cost, bpe), dpcp_link, gamma, ring, nvls)
            start = clock if (hw.host_progress or not cfg.overlap) else max(ready[i] for i in layers)
            starts[w].append(start)
            end = max(end, start) + grad_s
            comm += grad_s
        ends.append(max(clock, end) + optimizer_s)
        computes.append(compute + optimizer_s)
        comms.append(comm)
    if p > 1 and cfg.collectives != "mpi":  # every rank through every bucket's rounds (rounds_time.py)
        elems = [sum(sizes[i] for i in layers) for layers in buckets]
        for j in range(T):  # the dpcp group of tp index j: world ranks g T + j (ps: the server g = 0)
            starts_j = [starts[g * T + j] for g in range(p)]
            done = bucket_ends(cfg.collectives, starts_j, elems, bpe, dpcp_link, gamma)
            for g in range(p):
                ends[g * T + j] = max(before_dp[g * T + j][0], done[g]) + optimizer_s
    return {"step_s": max(ends), "compute_s": max(computes), "comm_s": max(comms), "before_dp": before_dp}
