"""tp's blocking collectives in an MoE step (gpt_moe_time.MoEWork, moe_split_time.py): each rank's own
seconds, or, where the algorithm leaves a tp group's ranks apart, the group followed rank by rank.

A tp group's ranks do the same work (the MoE part is replicated on them, attention split evenly:
parallel/expert_tensor_gpt.py), and with NCCL's ring (--collectives ring, auto) each leaves a tp
collective when the others do, so adding its own price (gpt_time.tp_collectives, MoEWork.tp_block) is
exact. The other all-reduces are not symmetric: the binomial tree's root and the parameter server end
at other times than their leaves and workers, Rabenseifner's folding ranks (tp not a power of two) too,
so the group's ranks go on apart -- into their ep groups' all-to-alls, and into tp's next collective,
which then waits on the latest. There every tp group is followed through each of its collectives from
its ranks' own times: the all-reduces by the same rounds as the dp gradients (allreduce_ends.py; mpi's
closed form is each rank's own, as before), the ring halves by ring_time.ring_ends. The ops, per R
token rows of a rank (vocab_parallel.py, expert_tensor_gpt.py; gpt_time.tp_collectives and
MoEWork.tp_block price the same), all-reduces of R h unless said:
  embedding   forward its all-reduce (--sp: a reduce-scatter); backward none (--sp: an all-gather)
  block       each way attention's all-reduce (--sp: f's and the MoE input's all-gathers, g's
              reduce-scatter; a tp group does the same work between them, so their order is immaterial)
  head        forward none (--sp: an all-gather); backward its f (--sp: a reduce-scatter)
  loss        an all-gather of T R (vocab-ce-max), an all-reduce of 2 R (vocab-ce-sums), in the loss's
              type (gpt_time.loss_bpe)
  --sp sums   once a step (a pipeline chunk: before its all-reduces), each block's LayerNorm gradients
              (4h) then the head's (2h), one all-reduce each (tensor_gpt._sync_sequence_grads)
"""

from __future__ import annotations

from .gpt_time import loss_bpe
from .tp_group_time import group_ends


def apart(cfg, T: int) -> bool:
    """Whether tp's all-reduces may leave a tp group's ranks apart: every algorithm but NCCL's ring
    (module docstring)."""
    return T > 1 and cfg.collectives not in ("ring", "auto")


def own_seconds(ms: dict, w: int, which: str) -> float:
    """Rank w's own seconds of `which` (MoEWork.micro_step's per-rank prices)."""
    if which == "block":
        return ms["tp_block"][w]
    fwd, bwd, loss = ms["tp"][w]
    return {
        "embed-forward": fwd[0],
        "head-forward": fwd[-1],
        "head-forward-loss": fwd[-1] + loss,
        "embed-backward": bwd[0],
        "head-backward": bwd[-1],
    }[which]


def ops(cfg, T: int, R: int, bpe: int, which: str) -> list:
    """[(elements, bytes each, the ring half's kind or None: an all-reduce)] of `which` on a tp group of
    R rows each (module docstring)."""
    N = R * cfg.hidden
    loss = [(T * R, loss_bpe(bpe), "all-gather"), (2 * R, loss_bpe(bpe), None)]
    if cfg.sp:
        ag, rs = (N, bpe, "all-gather"), (N, bpe, "reduce-scatter")
        return {
            "embed-forward": [rs],
            "head-forward": [ag],
            "head-forward-loss": [ag] + loss,
            "embed-backward": [ag],
            "head-backward": [rs],
            "block": [ag, rs, ag],
        }[which]
    if which == "head-forward-loss":
        return loss
    return [(N, bpe, None)] if which in ("embed-forward", "block", "head-backward") else []


def tp_sync(work, now: list, ms: dict, which: str) -> None:
    """tp's blocking collectives `which` on every rank of `work`'s Layout (module docstring): each
    rank's own seconds added, or each tp group followed from its ranks' times."""
    lay, cfg = work.lay, work.cfg
    if not apart(cfg, lay.T):
        for w in range(lay.W):
            now[w] += own_seconds(ms, w, which)
        return
    follow(work, now, lambda first: ops(cfg, lay.T, ms["n"][first], work.bpe, which))


def sp_sums(work, now: list, lo: int, hi: int) -> None:
    """--sp, units lo..hi-1 in order: each block's LayerNorm gradients (4h) and the head's (2h) summed
    over tp, one blocking all-reduce each (tensor_gpt._sync_sequence_grads; the embedding's are whole)."""
    cfg, lay, h = work.cfg, work.lay, work.cfg.hidden
    sizes = [4 * h if u <= cfg.blocks else 2 * h for u in range(max(lo, 1), min(hi, cfg.blocks + 2))]
    if not cfg.sp:
        return
    if not apart(cfg, lay.T):
        for w in range(lay.W):
            now[w] += sum(work.tp_allreduce(n, lay.k[w]) for n in sizes)
        return
    follow(work, now, lambda first: [(n, work.bpe, None) for n in sizes])


def follow(work, now: list, group_ops) -> None:
    """Every tp group (T consecutive ranks: world rank (d C + c) T + k) through group_ops(its first
    rank): [(elements, bytes each, the ring half's kind or None: an all-reduce by --collectives)]."""
    lay, link = work.lay, work.lay.links["tp"]
    for first in range(0, lay.W, lay.T):
        group = range(first, first + lay.T)
        t = [now[w] for w in group]
        for n, eb, half in group_ops(first):  # dense tp's follower (tp_group_time.py), op by op
            t = group_ends((half or "all-reduce", n, eb), t, work.cfg.collectives, link, work.gamma)
        for w, end in zip(group, t):
            now[w] = end
