"""One step in time, in closed form: compute, collectives, the pipeline schedule, overlapped buckets.

What each piece of work costs in seconds -- a forward, a backward and its B and W halves, a
recompute, a gradient bucket's all-reduce -- is chunktime.py's RankCosts (the alpha-beta-gamma model
on a hardware profile); this file puts those pieces in order.

How they add up -- the rules simpar's execution follows, written down as max-plus recurrences
(the cost model never runs the code it predicts):

* A stage does its (micro-batch, chunk) steps in its schedule's order (order.stage_order: naive,
  GPipe, 1F1B, interleaved, zb-h1, zb-v). A forward of micro-batch m on chunk c starts when the
  stage is free and its activations from chunk c-1 have arrived; a backward (zb-h1, zb-v: its B
  pass) when the stage is free and the output gradient from chunk c+1 has arrived; a W pass when the
  stage is free (its B pass came earlier on the same stage). A neighbouring chunk on the same stage
  (zb-v's turn) has the array as soon as the step producing it ends: no message. Tensor-parallel f and g
  all-reduces block inside the layer that needs them.
* A message of n bytes leaves when the stage's outgoing link is free (its activations forward and
  gradients back go out one after another), stays n x beta on the wire and arrives alpha later:
  the latency of a hop is paid on the critical path, not per micro-batch. At the end of its schedule a
  stage waits for its sends to leave.
* Data parallelism (DDP): each gradient bucket's all-reduce starts as soon as backward has
  finished its layers (in the last micro-batch of the last accumulation step), on the dp group's
  stream, one bucket after another; the rank waits for the last one after backward (Li et al.
  2020, sec. 3.2). ZeRO's collectives block: they add up. On a CPU (Hardware.host_progress: the
  `local` profile) MPI moves bytes only while the rank is inside it, on the rank's own core: the
  buckets run one after another from the moment the rank waits for them, overlapping nothing.
  Each rank's buckets are priced here on its own critical path (collectives.ALLREDUCE); without
  ZeRO, predict.py then runs the step again with each stage's buckets followed on every dp rank
  through every round (rounds_time.ddp_steps: chunks that differ by an element, the tree's and the
  parameter server's ranks that end apart) as `dp_streams`.
* --sp (resmlp under --tp): a stage boundary carries the tp rank's rows/t; each unit's once-a-step
  gradient all-reduce over tp blocks its chunk's final backward (zero-bubble: W pass) right after
  that unit, before the unit's gradient bucket is handed to data parallelism.
* --tp with --collectives tree or ps: a tree's or server's ranks leave each tp collective apart,
  and each waits for its own neighbour stage's message, so such a stage's clock is one number per tp
  rank (a NumPy array) and its chunks' steps are run by costs.tp_group (chunk_tp_group.py, gpt's
  gpt_tp_group_pipeline.py); its buckets' starts are per tp rank too (each tp index has its own dp
  group: rounds_time.ddp_steps), and its parts are its last rank's.
* Gradient accumulation repeats the schedule K times; then the optimizer sweeps its parameters.
  The step ends when the slowest rank has finished (the loss all-reduce synchronises the ranks).
* Each stage's timeline is also cut into TIMELINE_PARTS that add up to its end; the last stage to
  finish gives `plan` a step printed as a sum that is one.
"""

from __future__ import annotations

from functools import reduce

import numpy as np

from .chunk_tp_group import tp_group_of
from .chunktime import RankCosts
from .order import chunk_stage, stage_order  # noqa: F401  (re-exported: the recurrence's order)
from .resblocks import row_share
from .spec import Spec, micro_rows

# What fills one stage's timeline, from 0 to the end of its step (they add up to it, nothing overlaps):
# compute (its layers, recompute, the optimizer), the blocking tensor-parallel collectives, waiting for
# its own last pipeline sends to leave, the exposed DDP wait + ZeRO's collectives, waiting for the
# scattered data, and the bubble: waiting for a neighbouring stage's activations or gradients.
TIMELINE_PARTS = ("compute", "tp", "pp", "dp", "data", "bubble")


def _max(a, b):
    """The later of two times: numbers, or one per tp rank (an array) where a stage's chunks follow
    every tp rank (costs.tp_group: --tp with tree or ps)."""
    return np.maximum(a, b) if isinstance(a, np.ndarray) or isinstance(b, np.ndarray) else max(a, b)


def _at(value, i: int) -> float:
    return float(value[i]) if isinstance(value, np.ndarray) else value


def bucket_starts(
    costs: RankCosts, buckets: list, backward_start: float, r: int, split=False, first=False, ready=None
):
    """When each gradient bucket's layers are all ready: the final backward (of r rows, starting at
    backward_start; with `split` the W pass; `first`: also the step's first) runs its layers in reverse
    and hands each one's gradients over as it finishes (--no-overlap: all once backward is done).
    `ready`: {layer position: each tp rank's ready time}, where costs.tp_group ran the backward."""
    if ready is not None:  # the first layer is done last
        return _starts(costs, buckets, ready, ready[0])
    n_local = costs.hi - costs.lo
    ready_at, t = {}, backward_start
    layers = [(w, 0.0) for w in costs.weight_layers(r)] if split else costs.backward_layers(r, first)
    kinds = getattr(costs, "kinds", None) or [""] * n_local  # gpt's chunks: f is in its compute
    for pos, (compute, f), sync in zip(
        reversed(range(n_local)), layers, reversed(costs.sp_sync or [0.0] * n_local)
    ):
        t += compute
        # --sp: the unit's collectives, then the sum of its row-shard gradients, then the hook; a resmlp
        # block's LayerNorm gradients need its f all-reduce (tensor_resmlp.py): the hook after it
        if sync or kinds[pos] == "block":
            t += f + sync
            ready_at[pos] = t
            continue
        ready_at[pos] = t  # an mlp layer's hook fires before its f all-reduce
        t += f
    return _starts(costs, buckets, ready_at, t)


def _starts(costs, buckets: list, ready_at: dict, done) -> list:
    """Each bucket's start: its last layer's ready time (`done`: when backward has finished them all;
    --no-overlap: every bucket waits for it)."""
    if not costs.spec.overlap:
        ready_at = dict.fromkeys(ready_at, done)
    return [reduce(_max, (ready_at[i] for i in layers)) for layers, _ in buckets]


def dp_end(
    costs: RankCosts,
    buckets: list,
    backward_start: float,
    r: int,
    stream: float = 0.0,
    split=False,
    first=False,
    ready=None,
):
    """When the last gradient bucket's all-reduce ends, buckets starting as the final backward
    finishes their layers (bucket_starts), one after another on the dp stream (free from `stream` on)."""
    end = _max(backward_start, stream)
    for at, (_, secs) in zip(bucket_starts(costs, buckets, backward_start, r, split, first, ready), buckets):
        end = _max(end, at) + secs
    return end


def step_time(
    spec: Spec, hw, links: dict, stage_costs: dict, zero_dp_s: float, starts: list, dp_streams=None
) -> dict:
    """Run the recurrences for one step. `stage_costs[s]` = ({chunk: RankCosts}, dp index, {chunk: layer
    sizes}) of the slowest rank of stage s; `zero_dp_s` the blocking ZeRO collectives of a rank (0
    without ZeRO); `starts[s]` when stage s has its data (predict.data_ready); `dp_streams[s]`, if
    given, when stage s's last DDP bucket ends (rounds_time.ddp_steps: every dp rank followed), in
    place of this rank's own critical path."""
    S, K, M, V = spec.pp, spec.grad_accum, spec.microbatches_used, spec.virtual_stages
    W, bpe, pp = spec.widths, spec.prec.act, links["pp"]
    C = sum(len(stage_costs[s][0]) for s in range(S))
    split = spec.schedule in ("zb-h1", "zb-v") and S > 1
    clock = list(starts)
    dp_exposed = 0.0
    dp_ready, dp_elems = [[] for _ in range(S)], [[] for _ in range(S)]  # each stage's buckets' starts, sizes
    # each stage's timeline cut into what fills it (the parts add up to the stage's end exactly)
    parts = [dict.fromkeys(TIMELINE_PARTS, 0.0) for _ in range(S)]
    for s in range(S):
        parts[s]["data"] = starts[s]  # --data-source root: idle until rank 0's rows have arrived
    step_rows = [micro_rows(spec, stage_costs[s][1]) for s in range(S)]  # once, not once per micro-step
    # row_share is 1 / row_parts (1 or the tp size); int / int is correctly rounded, as float(Fraction)
    # is, so the floats are the same without Fraction arithmetic in the innermost loop
    share = row_share(spec)
    assert share.numerator == 1, share
    row_parts = share.denominator
    for k in range(K):
        last_k = k == K - 1
        rows = [step_rows[s][k] for s in range(S)]
        order = [stage_order(spec.schedule, S, M, s, V) for s in range(S)]
        pos = [0] * S
        final = [  # each chunk's final backward (or W pass) position: --sp sums its gradients there
            {c: i for i, (kind, _, c) in enumerate(order[s]) if kind == ("W" if split else "B")}
            for s in range(S)
        ]
        act_at, grad_at = {}, {}  # (chunk, m) -> arrival of its input / output gradient
        link, left = [0.0] * S, [0.0] * S  # each stage's outgoing link, and when its last send left
        final_start = [{} for _ in range(S)]  # chunk -> start of its last backward (or W pass)
        final_ready = [{} for _ in range(S)]  # chunk -> its layers' ready times per tp rank (tp_group)
        progress = True
        while progress:
            progress = False
            for s in range(S):
                while pos[s] < len(order[s]):
                    kind, m, c = order[s][pos[s]]
                    costs, r = stage_costs[s][0][c], rows[s][m]
                    need = act_at if kind == "F" else grad_at
                    waits = (kind == "F" and c > 0) or (kind == "B" and c < C - 1)
                    if waits and (c, m) not in need:
                        break  # its input has not been sent yet: let the other stages move
                    start = _max(clock[s], need[(c, m)]) if waits else clock[s]
                    first = k == 0 and M == 1  # a step with one micro-batch per stage, no accumulation
                    if kind == "F":
                        work, tp = costs.forward(r), costs.forward_tp(r)
                    elif kind == "W":
                        work, tp = costs.weight(r), 0.0
                    else:
                        work = costs.backward_input(r) if split else costs.backward(r, first)
                        tp = costs.backward_tp(r)
                    is_final = last_k and final[s].get(c) == pos[s]
                    if is_final:
                        work += sum(costs.sp_sync)
                        tp += sum(costs.sp_sync)
                    parts[s]["bubble"] += start - clock[s]  # waiting for a neighbour's array
                    parts[s]["compute"] += work - tp
                    group = tp_group_of(costs)
                    if group is not None:  # every tp rank's end: its ops leave the ranks apart
                        end, ready = group.step(kind, r, start, first, is_final, split)
                        parts[s]["tp"] += end - start - (work - tp)
                        clock[s] = end
                        if is_final:
                            final_ready[s][c] = ready
                    else:
                        parts[s]["tp"] += tp
                        clock[s] = start + work
                    if kind == ("W" if split else "B"):  # its layers' gradients start after a recompute
                        final_start[s][c] = (start + (0.0 if split else costs.recompute(r)), m)
                    out = None
                    if kind == "F" and c < C - 1:  # send the activations on to chunk c+1
                        out, width, dest = act_at, W[costs.hi], (c + 1, m)
                    if kind == "B" and c > 0:  # send the input gradient back to chunk c-1
                        out, width, dest = grad_at, W[costs.lo], (c - 1, m)
                    if out is not None and chunk_stage(spec.schedule, S, dest[0]) == s:
                        out[dest] = clock[s]  # the turn of the V: handed over in memory
                    elif out is not None:
                        depart = _max(clock[s], link[s])
                        sent = r * width * bpe / row_parts  # --sp: the tp rank's row shard
                        link[s] = left_s = depart + sent * pp.beta
                        out[dest] = left_s + pp.alpha
                        left[s] = _max(left[s], left_s)
                    pos[s] += 1
                    progress = True
        for s in range(S):
            chunk_costs, d, sizes = stage_costs[s]
            if last_k:  # the buckets of each chunk's last backward of the last accumulation step
                stream = 0.0
                for c in sorted(final_start[s], key=lambda c: np.min(final_start[s][c][0])):
                    buckets = chunk_costs[c].bucket_seconds(sizes[c], d)
                    dp_elems[s] += [sum(sizes[c][i] for i in layers) for layers, _ in buckets]
                    if buckets and hw.host_progress:  # they run once the rank waits, after its schedule
                        stream = _max(stream, clock[s]) + sum(secs for _, secs in buckets)
                        dp_ready[s] += [clock[s]] * len(buckets)
                    elif buckets:
                        start, m = final_start[s][c]
                        first = K == 1 and M == 1
                        r, ready = rows[s][m], final_ready[s].get(c)
                        stream = dp_end(chunk_costs[c], buckets, start, r, stream, split, first, ready)
                        dp_ready[s] += bucket_starts(chunk_costs[c], buckets, start, r, split, first, ready)
                if dp_streams is not None and dp_elems[s]:
                    stream = dp_streams[s]
                if np.max(stream) > 0:
                    dp_exposed = _max(dp_exposed, stream - clock[s])
                    parts[s]["dp"] += _max(0.0, stream - clock[s])
                    clock[s] = _max(clock[s], stream)
            parts[s]["pp"] += _max(0.0, left[s] - clock[s])  # its last sends still leaving
            clock[s] = _max(clock[s], left[s])
    optimizer = [next(iter(stage_costs[s][0].values())).optimizer_s for s in range(S)]
    ends = [clock[s] + zero_dp_s + optimizer[s] for s in range(S)]
    for s in range(S):
        parts[s]["dp"] += zero_dp_s  # ZeRO's collectives block
        parts[s]["compute"] += optimizer[s]  # the optimizer's sweep: memory-bound compute
    # a stage that followed its tp ranks: its parts are its last rank's (they add up to its end)
    slowest = [int(np.argmax(e)) if isinstance(e, np.ndarray) else 0 for e in ends]
    parts = [{k: _at(v, i) for k, v in p.items()} for p, i in zip(parts, slowest)]
    ends = [_at(e, i) for e, i in zip(ends, slowest)]
    last = max(range(S), key=lambda s: ends[s])
    return {
        "makespan": max(ends),
        "dp_exposed": max(0.0, float(np.max(dp_exposed))) + zero_dp_s,
        "critical_stage": last,
        "parts": parts[last],
        "ends": ends,  # each stage's end (zero_mesh_time.py adds ZeRO-1's rings after them)
        "stage_parts": parts,
        # each stage's DDP buckets: when they may start, their elements (rounds_time.ddp_steps)
        "dp_ready": dp_ready,
        "dp_elems": dp_elems,
    }
