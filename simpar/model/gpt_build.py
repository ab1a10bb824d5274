"""A GPT's units, dense or Mixture-of-Experts: [embedding, L blocks, head] (gpt.py's units; with
--experts E each block's MLP is E experts, gpt_moe.py). It sits above both: gpt_moe.py builds its
block on gpt.py's, so the choice between them cannot live in gpt.py without an import cycle."""

from __future__ import annotations

from ..runtime.context import PLAIN
from .gpt import BlockUnit, EmbeddingUnit, HeadUnit
from .gpt_moe import MoEBlockUnit


def gpt_units(model, rt=PLAIN) -> list:
    """[embedding, L blocks, head] with unit indices 0 .. L+1 of `model` (the model section: blocks,
    hidden, heads, seq_len, vocab); `rt`: the run's runtime (its kernels), which every unit gets."""
    L = model.blocks
    block = lambda i: BlockUnit(i, model.hidden, model.heads, model.seq_len, L)  # noqa: E731
    if getattr(model, "experts", 0):  # --experts E: every block's MLP is E experts (gpt_moe.py)
        block = lambda i: MoEBlockUnit.of(model, i)  # noqa: E731
    units = (
        [EmbeddingUnit(model.vocab, model.seq_len, model.hidden)]
        + [block(i) for i in range(1, L + 1)]
        + [HeadUnit(L + 1, model.hidden, model.vocab, model.seq_len)]
    )
    for unit in units:
        unit.rt = rt
    return units


def gpt_param_count(model) -> int:
    return sum(u.size for u in gpt_units(model))
