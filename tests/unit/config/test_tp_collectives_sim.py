"""--clock sim with tp's tree and parameter-server all-reduces (config/rules.time_tp_collectives): what the
closed form prices exactly validates; the refusals are one line each (test_messages.py)."""

from __future__ import annotations

from simpar.config import RunConfig, validate

GPT = dict(arch="gpt", dataset="copy", vocab=16, seq_len=8)


def test_sim_takes_the_tp_tree_and_ps_layouts_the_closed_form_follows_rank_by_rank():
    """gpt --tp [--sp] [--dp] without --pp with either algorithm (costmodel/tp_group_time.py follows every
    tp rank); mlp/resmlp on 2 tp ranks (the last rank stays on the critical path), or a tree without --sp."""
    for algo in ("tree", "ps"):
        validate(RunConfig(**GPT, tp=4, sp=True, clock="sim", collectives=algo), 4)
        validate(RunConfig(**GPT, tp=2, dp=2, clock="sim", collectives=algo), 4)
        validate(RunConfig(arch="resmlp", tp=2, pp=2, sp=True, clock="sim", collectives=algo), 4)
        validate(RunConfig(**GPT, tp=2, pp=2, collectives=algo), 4)  # the wall clock times nothing
    validate(RunConfig(tp=4, clock="sim", collectives="tree"), 4)
