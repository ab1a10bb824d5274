"""One rank's step: the bytes and messages it sends, by category and by collective, the memory it
holds and the FLOPs it computes (predict_rank).

Part of the cost model: the formulas of each collective are in collectives.py, the Spec and how
simpar cuts it up in spec.py, what each layer's compute costs per row in work.py; predict.py turns
these numbers into a step time. The bytes and the
params/grads/optimizer memory are derived from the same rules the implementation follows, and the
tests hold the ledger to them to the byte.

Where the numbers come from (p ranks in a group, N elements; the ring reduce-scatter, all-gather and
all-reduce of N, and how chunks are cut, are in collectives.py):

  data parallel        each gradient BUCKET is one all-reduce, so a rank sends the sum over buckets
                       (buckets: spec.dp_buckets; 2(p-1)/p * P * bpe overall)
  ZeRO-1               reduce-scatter + all-gather of the flat P        (ZeRO paper, Rajbhandari et al.
  ZeRO-2               the same, layer by layer                          2020, sec. 7.2.1: = DDP)
  ZeRO-3               per micro-step, per layer: all-gather in forward, again in backward, and a
                       reduce-scatter of the gradient: 3(p-1)/p * P       (sec. 7.2.2: 1.5x DDP)
  tensor parallel      per (column, row) pair per micro-batch: g = all-reduce of rows x out-width in
                       forward, f = all-reduce of rows x in-width in backward (skipped at layer 0)
                       (Megatron-LM, Shoeybi et al. 2019, sec. 3, Fig. 3)
  pipeline             per micro-batch and chunk boundary between two stages: rows x out-width
                       forward ("pp-send-act"), rows x in-width backward ("pp-send-grad"); with one
                       chunk per stage from every stage but the last / the first. zb-v: 2S chunks,
                       2S-2 boundaries cross stages (the turn S-1 -> S stays on stage S-1). --sp:
                       each tp rank sends its rows/t shard (Korthikanti et al. 2022, sec. 4.2.2)
  data (root)          rank 0 sends each rank its rows: x (rows x width) to first-stage ranks and
                       labels (rows x 8 bytes, int64) to the loss stage's ranks (last; zb-v: first),
                       every tp rank its own copy

Memory of ZeRO (S_r = this rank's chunk of every layer, n_max = the largest layer's n_l = fi*fo + fo):
  params     stage 1/2: P;  stage 3: S_r + n_max -- the shard, plus one full layer gathered while it
             computes (layers are gathered one at a time, so the largest one is the peak)
  grads      stage 1: P;  stage 2/3: S_r + n_max (one layer's buffer while it is reduce-scattered),
             or S_r + P for stage 2 with grad-accum > 1 (a full accumulation buffer)
  optimizer  stage 1: its chunk of the flat P;  stage 2/3: S_r  (times the optimizer's bytes per element)
"""

from __future__ import annotations

from collections import Counter

from .collectives import ALLREDUCE, Cost, chunk, ring_allgather, ring_reduce_scatter, to_bytes
from .order import alive_window, chunk_stage, loss_stage, peak_alive
from .resblocks import block_collectives, row_share, sp_grad_allreduces
from .spec import Shape, Spec, coords_of, layer_flops, micro_rows, split
from .work import (
    elementwise_bytes,
    layer_work,
    optimizer_passes,
    recompute_elems,
)

CATS = ("data", "model", "activation")
MEMORY_KINDS = ("params", "grads", "optimizer", "activations_peak")


# -- one rank's step --------------------------------------------------------------------------------


class Book:
    """What one rank sends in a step, per (category, op, group): bytes, messages, reduced bytes and
    the critical-path rounds -- the same keys as the ledger's by_op ("category/op")."""

    def __init__(self):
        self.ops: dict[tuple[str, str, str], Cost] = {}

    def add(self, category: str, op: str, group: str, cost: Cost, elem_bytes: int, times: int = 1) -> None:
        if cost.messages == 0:  # a group of one rank sends nothing (and books nothing)
            return
        key = (category, op, group)
        self.ops[key] = self.ops.get(key, Cost()) + to_bytes(cost, elem_bytes, times)


def predict_rank(spec: Spec, rank: int, shape: Shape | None = None) -> dict:
    """Bytes, messages, memory and FLOPs of one rank in one step (see the module docstring)."""
    shape = shape or Shape.of(spec)
    s, d, t = coords_of(rank, spec)
    prec, W = spec.prec, spec.widths
    mine = shape.chunks[s]  # the model chunks this stage holds (one unless interleaved)
    C = len(shape.bounds)
    book, allreduce = Book(), ALLREDUCE[spec.collectives]
    rows = micro_rows(spec, d)
    total_rows = sum(map(sum, rows))
    # Per row of a micro-batch: matmul FLOPs, and activation elements kept for backward (a layer's
    # Context holds its input x and pre-activation z; for the raw-logits layer z IS the output).
    # --recompute: full keeps only the chunk's input, selective the input and every counted z.
    fwd = bwd = 0
    act_row, held_row = {}, {}  # chunk -> activation elements per row: all, and kept by recompute
    for c in mine:
        (lo, hi), act_row[c] = shape.bounds[c], 0
        held_row[c] = W[lo]
        for i, kind in zip(range(lo, hi), shape.kinds[c]):
            f, g = layer_flops(1, W[i], W[i + 1], i == 0)
            share = 1 if kind in ("full", "replicated") else spec.tp
            fwd, bwd = fwd + f // share, bwd + g // share
            z = 0 if i == spec.n_layers - 1 else W[i + 1]
            z_l = W[i + 1] // spec.tp if kind == "column" else z
            act_row[c] += {"column": W[i], "row": W[i] // spec.tp}.get(kind, W[i]) + z_l
            held_row[c] += z_l if spec.recompute == "selective" else 0
    if spec.recompute == "none":
        held_row = act_row
    if spec.arch == "resmlp":  # units, not layers (--tp: resblocks.py): their own FLOPs and kept arrays
        fwd = bwd = 0
        for c in mine:
            lo, hi = shape.bounds[c]
            works = [layer_work(spec, i, "full") for i in range(lo, hi)]
            fwd += sum(w["fwd_flops"] for w in works)
            bwd += sum(w["bwd_flops"] for w in works)
            act_row[c] = sum(w["act_row"] for w in works)
            sp_share = row_share(spec)  # --sp: the chunk's input and unit outputs are 1/t row shards
            blocks = [i for i in range(lo, hi) if 0 < i < spec.n_layers - 1]
            held_row[c] = {  # what --recompute keeps from the forward to the backward, per row
                "none": act_row[c],
                "full": W[lo] * sp_share,  # the chunk's input
                # + each block's z1 (this rank's d/t columns under --tp; under --sp also f-bar's
                # gathered h, d on all rows) and every unit's output but the chunk's last
                "selective": W[lo] * sp_share
                + sum(W[i] // spec.tp + (W[i] if sp_share != 1 else 0) for i in blocks)
                + sum(W[i + 1] * sp_share for i in range(lo, hi - 1)),
            }[spec.recompute]
    for b, times in Counter(b for step in rows for b in step).items():  # micro-batch rows -> count
        for c in mine:
            (lo, hi), kinds = shape.bounds[c], shape.kinds[c]
            for i, kind in zip(range(lo, hi), kinds):
                if kind == "column" and i > 0:  # f: backward all-reduce of dL/dX (none at layer 0)
                    cost = allreduce(b * W[i], spec.tp, t)
                    book.add("activation", "tp-f-allreduce", "tp", cost, prec.act, times)
                elif kind == "block":  # resmlp under --tp: g / f, or --sp's gathers and scatters
                    for phase in ("forward", "backward"):
                        again = 2 if phase == "forward" and spec.recompute == "full" else 1
                        for op, cost in block_collectives(spec, b, i, t, phase):
                            book.add("activation", op, "tp", cost, prec.act, times * again)
                elif kind == "row":  # g: forward all-reduce of the partial products (again if recomputed)
                    cost = allreduce(b * W[i + 1], spec.tp, t)
                    again = 2 if spec.recompute == "full" else 1
                    book.add("activation", "tp-g-allreduce", "tp", cost, prec.act, times * again)
            # Each chunk boundary between two stages: rows x width forward, and back (zb-v's turn,
            # chunks S-1 -> S on one stage, moves nothing). --sp: this tp rank's b/t rows only.
            b_sent = int(b * row_share(spec))
            if c < C - 1 and chunk_stage(spec.schedule, spec.pp, c + 1) != s:
                n = b_sent * W[hi]
                book.add("activation", "pp-send-act", "pp", Cost(n, 1, 0, 1, n), prec.act, times)
            if c > 0 and chunk_stage(spec.schedule, spec.pp, c - 1) != s:
                n = b_sent * W[lo]
                book.add("activation", "pp-send-grad", "pp", Cost(n, 1, 0, 1, n), prec.act, times)

    units = [i for c in mine for i in range(*shape.bounds[c])]
    for cost in sp_grad_allreduces(spec, t, units):  # --sp: partial gradients of the row-shard parameters
        book.add("model", "sp-grad-allreduce", "tp", cost, prec.grad)

    # Gradients / parameters over the data-parallel group.
    p = spec.dp
    layer_n = [n for c in mine for n in shape.sizes[c]]  # ZeRO-2/3 run with tp = pp = 1: the full layers
    P = sum(layer_n)
    opt_bpp = prec.optimizer[(spec.optimizer, bool(spec.momentum))]
    if spec.zero == 0:
        for n in (n for c in mine for n in shape.buckets[c]):
            book.add("model", "grad-allreduce", "dp", allreduce(n, p, d), prec.grad)
        memory = {"params": P * prec.param, "grads": P * prec.grad, "optimizer": P * opt_bpp}
        updated = P  # parameters this rank's optimizer sweeps
    else:
        S_r = sum(chunk(n, p, d) for n in layer_n)  # this rank's chunk of every layer
        n_max = max(layer_n)
        if spec.zero == 1:  # one flat store per chunk (the whole model without --pp; with --tp its shard)
            stores = [sum(shape.sizes[c]) for c in mine]  # parallel/zero.py, zero_mesh.py
            for n in stores:
                book.add("model", "grad-reduce-scatter", "dp", ring_reduce_scatter(n, p, d), prec.grad)
                book.add("model", "param-all-gather", "dp", ring_allgather(n, p, d), prec.param)
            updated = sum(chunk(n, p, d) for n in stores)
            memory = {"params": P * prec.param, "grads": P * prec.grad, "optimizer": updated * opt_bpp}
        else:
            updated = S_r
            passes = 1 if spec.zero == 2 else spec.grad_accum
            for n in layer_n:
                book.add(
                    "model", "grad-reduce-scatter", "dp", ring_reduce_scatter(n, p, d), prec.grad, passes
                )
                book.add(
                    "model",
                    "param-all-gather",
                    "dp",
                    ring_allgather(n, p, d),
                    prec.param,
                    1 if spec.zero == 2 else 2 * passes,
                )
            held = P if spec.zero == 2 and spec.grad_accum > 1 else n_max
            memory = {
                "params": (P if spec.zero == 2 else S_r + n_max) * prec.param,
                "grads": (S_r + held) * prec.grad,
                "optimizer": S_r * opt_bpp,
            }
    memory["activations_peak"] = int(activations_peak(spec, s, rows, act_row, held_row) * prec.act)

    if rank == 0 and spec.data_source == "root":
        _book_root_scatter(spec, book)
    sent = {c: 0 for c in CATS}
    messages = {c: 0 for c in CATS}
    for (cat, _, _), c in book.ops.items():
        sent[cat] += c.sent
        messages[cat] += c.messages
    return {
        "rank": rank,
        "coords": {"pp": s, "dp": d, "tp": t},
        "sent": sent,
        "messages": messages,
        "ops": book.ops,
        "memory": memory,
        "flops": {  # int: under --sp a projection's per-row share is a Fraction, its total whole
            "forward": int(fwd * total_rows),
            "backward": int(bwd * total_rows),
            "recompute": int(fwd * total_rows) if spec.recompute == "full" else 0,  # the forward again
        },
        "elementwise_bytes": int(
            sum(elementwise_bytes(spec, *shape.bounds[c], shape.kinds[c], rows, 0) for c in mine)
            + sum(recompute_elems(spec, *shape.bounds[c], shape.kinds[c]) for c in mine)
            * total_rows
            * prec.act
            + optimizer_passes(spec) * updated * prec.param
        ),
        "params_updated": updated,
        "layers": (shape.bounds[mine[0]][0], shape.bounds[mine[-1]][1]),
        "chunks": mine,
        "layer_count": sum(shape.bounds[c][1] - shape.bounds[c][0] for c in mine),
        "params_local": P,
    }


def peak_alive_rows(spec: Spec, s: int, rows: list[list[int]]) -> int:
    """Most rows whose activations stage s holds at once (one chunk per stage): the largest sum of
    `alive_window` consecutive micro-batches (order.py). Each grad-accum micro-step starts empty."""
    if spec.pp == 1:
        return max(max(step) for step in rows)
    k = alive_window(spec.schedule, spec.pp, spec.microbatches, s)
    return max(sum(step[i : i + k]) for step in rows for i in range(len(step) - k + 1))


def activations_peak(spec: Spec, s: int, rows: list[list[int]], act_row: dict, held_row: dict) -> int:
    """Activation elements stage s holds at its peak: rows x elements per row of each alive
    (micro-batch, chunk), at the worst point of its order (order.peak_alive). With --recompute a unit
    holds held_row per row from its forward on, and the rest of act_row while its backward runs."""
    if spec.pp == 1:
        return max(max(step) for step in rows) * act_row[s]
    extra = (
        None if spec.recompute == "none" else (lambda step: lambda m, c: step[m] * (act_row[c] - held_row[c]))
    )
    return max(
        peak_alive(
            spec.schedule,
            spec.pp,
            len(step),
            s,
            spec.virtual_stages,
            lambda m, c: step[m] * held_row[c],
            extra and extra(step),
        )
        for step in rows
    )


def _book_root_scatter(spec: Spec, book: Book) -> None:
    """--data-source root: rank 0 sends every other rank its rows (data.BatchFeeder): x to each rank of
    the first stage, int64 labels to each rank of the loss stage (the last; zb-v: the first), one
    message per grad-accum micro-step."""
    K, n_stage = spec.grad_accum, spec.dp * spec.tp
    own_rows = sum(chunk(k_rows, spec.dp, 0) for k_rows in split(spec.batch, K))
    x_bytes = (spec.tp * spec.batch - own_rows) * spec.widths[0] * spec.prec.act
    x_msgs = (n_stage - 1) * K
    last_is_mine = loss_stage(spec.schedule, spec.pp) == 0
    y_bytes = (spec.tp * spec.batch - (own_rows if last_is_mine else 0)) * 8
    y_msgs = (n_stage - (1 if last_is_mine else 0)) * K
    c = Cost(x_bytes + y_bytes, x_msgs + y_msgs, 0, x_msgs + y_msgs, x_bytes + y_bytes)
    book.add("data", "scatter-batch", "world", c, 1)
