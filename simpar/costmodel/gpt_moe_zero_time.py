"""The step time of ZeRO with experts (--arch gpt --experts E --ep P --dp D [--cp C] [--tp T] --zero 1|2|3) in
closed form, as the simulated clock charges it: gpt_moe_time.py's ranks, each on its own clock through
every all-to-all round (and cp hop), with ZeRO's reduce-scatters and all-gathers where
parallel/expert_zero.py runs them (written again here; nothing imported from parallel/ or the runtime).

Every unit i has n_i dense elements, sharded over the dense group (dp, with --cp dp x cp), and m_i of
the rank's experts, sharded over their group (edp, with --cp edp x cp): gpt_moe_zero.unit_sizes. Each
of ZeRO's collectives is a blocking ring on its group (Rajbhandari et al. 2020, sec. 7), the dense
part's first and then the experts' (none for a part with no elements or a group of one rank), every
rank followed through every round from when it reaches the ring (ring_time.ring_ends):

  stage 1  the micro-steps as gpt_moe_time.py's without traffic; then, unit by unit in unit order, the
           reduce-scatter of its gradients; the optimizer on the rank's chunks; then, unit by unit,
           the all-gather of its parameters
  stage 2  each unit's backward in the LAST micro-step is followed by its reduce-scatters; the
           optimizer; the all-gathers, unit by unit
  stage 3  every micro-step gathers each unit before its forward and again before its backward, and
           reduce-scatters its gradients right after the backward; the optimizer, no gather back
With --tp (expert_zero_tp.py) the units are a tp rank's shares, each tp index's dp and edp groups ring
apart, and under --sp each reduce-scatter of a unit waits first for its LayerNorms' blocking sum over tp
(a block's 4h, the head's 2h: gpt_moe_time.MoEWork.sp_sync's all-reduces, one unit at a time).

The optimizer sweeps the rank's own chunks (gpt_time.optimizer_seconds), so ranks with longer chunks
(np.array_split's first ones) finish it later. Each step starts together and ends with its slowest
rank; the metrics report the median step, and so does this.
"""

from __future__ import annotations

from .collectives import ALLREDUCE, chunk
from .gpt_moe_time import MoEWork, median_step
from .gpt_time import optimizer_seconds
from .ring_time import ring_ends
from .spec import split

DENSE, EXPERT = 0, 1


def moe_zero_step_seconds(cfg, D: int, hw, micro: list, sizes: list, bpe: int) -> dict:
    """{step_s, compute_s, comm_s, steps_s} of --experts --zero (module docstring); `micro` as
    gpt_moe_time.moe_step_seconds takes it, sizes: [(n_i, m_i)] per unit, bpe: the bytes of the
    parameters and gradients ZeRO moves (the compute dtype's)."""
    C = getattr(cfg, "cp", 1)
    if C == 1:
        micro = [(k, [[kept] for kept in blocks]) for k, blocks in micro]
    work = MoEWork(cfg, D, hw, bpe, D * C * cfg.tp)
    lay, stage, G, L = work.lay, cfg.zero, cfg.grad_accum, cfg.blocks
    W, seqs = lay.W, split(cfg.batch, G)
    groups = ((lay.dp, lay.links["dp"]), (lay.edp, lay.links["edp"]))
    place = [{}, {}]  # place[part][w] = (its group's size, its rank in that group)
    for part, (members, _) in enumerate(groups):
        for group in members:
            for rank, w in enumerate(group):
                place[part][w] = (len(group), rank)
    mine = [
        sum(chunk(unit[part], *place[part][w]) for unit in sizes for part in (DENSE, EXPERT))
        for w in range(W)
    ]
    opt = [optimizer_seconds(cfg, mine[w], bpe, work.stream) for w in range(W)]

    def rings(kind: str, i: int, now: list, free: list) -> None:  # unit i's two parts, dense first
        if kind == "reduce-scatter":
            sp_sum(i, now)
        for part, (members, link) in enumerate(groups):
            n = sizes[i][part]
            for group in members if n else ():
                if len(group) > 1:
                    starts, links = [now[w] for w in group], [free[w] for w in group]
                    ends = ring_ends(kind, n, bpe, starts, links, link, work.gamma)
                    for w, end, f in zip(group, ends, links):
                        now[w], free[w] = end, f

    sp_elems = [0] + [4 * cfg.hidden] * L + [2 * cfg.hidden]  # --sp: the LayerNorms' (embedding: none)
    ar = ALLREDUCE[cfg.collectives]

    def sp_sum(i: int, now: list) -> None:  # --tp --sp: unit i's row-shard gradients over tp, first
        for w in range(W) if cfg.sp and sp_elems[i] else ():
            now[w] += work.tp_secs(ar(sp_elems[i], lay.T, lay.k[w]), bpe, True)

    steps, computes = [], []
    for first in range(0, len(micro), G):
        now, compute, free = [0.0] * W, [0.0] * W, [0.0] * W
        batch = micro[first : first + G]
        for step_k, (k, blocks) in enumerate(batch):
            ms = work.micro_step(seqs[k], blocks)
            for u in range(L + 2):
                if stage == 3:  # gathered before its forward
                    rings("all-gather", u, now, free)
                work.forward(now, compute, ms, u, u + 1)
            for u in reversed(range(L + 2)):
                if stage == 3:  # gathered again for its backward
                    rings("all-gather", u, now, free)
                work.backward(now, compute, ms, u, u + 1)
                if stage == 3 or (stage == 2 and step_k == len(batch) - 1):  # as its backward ends
                    rings("reduce-scatter", u, now, free)
        for u in range(L + 2) if stage == 1 else ():
            rings("reduce-scatter", u, now, free)
        for w in range(W):
            now[w] += opt[w]
            compute[w] += opt[w]
        for u in range(L + 2) if stage < 3 else ():
            rings("all-gather", u, now, free)
        steps.append(max(now))
        computes.append(max(compute))
    return median_step(steps, computes)
