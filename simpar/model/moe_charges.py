"""What an MoE transformer block (model/gpt_moe.py) charges the simulated clock (--clock sim).

The dense block's charges (gpt.charge_block) cut in two: the attention half stays per token row, the
MLP half moves to the experts, per row each expert computes; the routing adds its own memory passes
per kept assignment (a token sent to one expert). costmodel/gpt_moe_time.py writes the same charges
again. Memory-bound elements, in the activations' type:
  attention  forward 32h + 6as per row (24h whole + 8h sharded): gpt.py's 50h less the MLP's bias + GELU 16h
             and bias 2h (LayerNorms 8h twice, q k v o biases, merging heads, both residual adds);
             backward 34h + 4as: 51h less GELU' 12h and the MLP's bias sums 5h (under --tp: split as
             charge_attention says); + accumulating 3 per dense parameter
             (attention, LayerNorms, router); matmuls q k v o and the scores', as gpt.charge_block
  router     its n x h by h x E matmul (model/moe.route), and in backward its two (router_backward)
  expert     per row it computes: forward 18h (bias + GELU, bias), backward 17h (GELU', bias sums),
             its matmuls h x 4h and 4h x h (twice in backward); + accumulating 3 per expert parameter
             in a backward that had rows (an expert that received none is skipped)
  routing    per kept assignment: forward 2h gathering the rows sent (read, write) and 3h adding
             gate x output back (read two, write); backward 4h for the gates' gradients and the gated
             dy (dy read twice, the output once, the piece written) and 3h adding dx back.
The zero-bubble halves (gpt_moe_split.py, parallel/expert_tensor_split.py; --schedule zb-h1/zb-v) cut
the backward's charges as gpt.charge_half cuts the dense block's: B the dx matmuls (q k v o, each
expert's two, the router's dlogits Wr^T, the scores' four) and every memory pass; W the dW matmuls
(q k v o, each expert's two, the router's x^T dlogits) and the accumulations (3 per parameter).
"""

from __future__ import annotations

# attention: per row, whole (LayerNorms, residuals, bo) and on h/t (q k v biases, merging heads)
ATTN_FWD_WHOLE, ATTN_FWD_SHARD, ATTN_FWD_SCORES = 24, 8, 6
ATTN_BWD_WHOLE, ATTN_BWD_BIAS, ATTN_BWD_SHARD, ATTN_BWD_SCORES = 24, 1, 9, 4  # bo's sum: every row
EXPERT_FWD_ELEMS, EXPERT_BWD_ELEMS, ACCUMULATE = 18, 17, 3
PACK_ELEMS, COMBINE_ELEMS, GATE_GRAD_ELEMS, SCATTER_ELEMS = 2, 3, 4, 3


def charge_attention(
    clock, rows: int, h: int, a: int, keys: int, bpe: int, size: int, backward: bool, t: int = 1, whole=None
):
    """A block's attention half: q, k, v, o and the scores' two (rows keys h FLOPs each), twice in
    backward; its memory passes; `size`: the block's dense parameters (accumulated in backward). Under
    --tp t (parallel/expert_tensor_gpt.py) this rank's share, as tensor_gpt.py charges the dense
    block's: the sharded dimension h/t, the bias and merging passes on h/t, LayerNorms and residuals
    whole -- forward 24h + 8h/t (+ 6 a/t s) per row, backward 24h + h + 9h/t (+ 4 a/t s); under --sp the
    whole 24h on this rank's `whole` rows only (its row shard), the rest on every row."""
    hl, al, whole = h // t, a // t, rows if whole is None else whole
    for _ in range(2 if backward else 1):
        for _ in range(3):
            clock.matmul(rows, h, hl)
        clock.matmul(rows, hl, h)
        clock.matmul(rows, hl, keys)
        clock.matmul(rows, keys, hl)
    if backward:
        elems = (
            ATTN_BWD_WHOLE * h * whole
            + (ATTN_BWD_BIAS * h + ATTN_BWD_SHARD * hl + ATTN_BWD_SCORES * al * keys) * rows
        )
        elems += ACCUMULATE * size
        clock.stream(elems * bpe)
    else:
        elems = ATTN_FWD_WHOLE * h * whole + (ATTN_FWD_SHARD * hl + ATTN_FWD_SCORES * al * keys) * rows
        clock.stream(elems * bpe)
        clock.layer_call()


def charge_expert(clock, rows: int, h: int, bpe: int, backward: bool) -> None:
    """One expert's FFN on the `rows` it received (rows > 0); its 8h^2 + 5h parameters accumulated in
    backward (gpt_moe.expert_size)."""
    for _ in range(2 if backward else 1):
        clock.matmul(rows, h, 4 * h)
        clock.matmul(rows, 4 * h, h)
    if backward:
        clock.stream((EXPERT_BWD_ELEMS * rows * h + ACCUMULATE * (8 * h * h + 5 * h)) * bpe)
    else:
        clock.stream(EXPERT_FWD_ELEMS * rows * h * bpe)


def charge_routing(clock, assignments: int, h: int, bpe: int, elems: int) -> None:
    """`elems` x h memory-bound elements per kept assignment (PACK_ELEMS, COMBINE_ELEMS, ...)."""
    clock.stream(elems * assignments * h * bpe)


def charge_attention_half(
    clock, rows: int, h: int, a: int, keys: int, bpe: int, size: int, weights: bool, t: int = 1, whole=None
) -> None:
    """charge_attention's backward cut in two (under --tp t this rank's share, h/t wide, a/t heads): B
    the four dx matmuls, the scores' four and the memory passes; W the four dW matmuls and accumulating
    the block's `size` dense parameters (this rank's shard); under --sp the whole 24h a row on its
    `whole` rows (the row shard), as charge_attention."""
    hl, al, whole = h // t, a // t, rows if whole is None else whole
    for _ in range(3):
        clock.matmul(rows, h, hl)
    clock.matmul(rows, hl, h)
    if weights:
        clock.stream(ACCUMULATE * size * bpe)
        return
    for _ in range(2):
        clock.matmul(rows, hl, keys)
        clock.matmul(rows, keys, hl)
    per_row = ATTN_BWD_BIAS * h + ATTN_BWD_SHARD * hl + ATTN_BWD_SCORES * al * keys
    clock.stream((ATTN_BWD_WHOLE * h * whole + per_row * rows) * bpe)


def charge_expert_half(clock, rows: int, h: int, bpe: int, weights: bool) -> None:
    """charge_expert's backward cut in two: B du = dout W2^T, dx = dz W1^T and the 17h passes a row;
    W u^T dout, x^T dz and accumulating the expert's 8h^2 + 5h parameters."""
    if weights:
        clock.matmul(4 * h, rows, h)
        clock.matmul(h, rows, 4 * h)
        clock.stream(ACCUMULATE * (8 * h * h + 5 * h) * bpe)
    else:
        clock.matmul(rows, h, 4 * h)
        clock.matmul(rows, 4 * h, h)
        clock.stream(EXPERT_BWD_ELEMS * rows * h * bpe)
