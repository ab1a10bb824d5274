"""--clock sim takes tp's tree and parameter-server all-reduces on every layout without --cp: the closed
form follows every tp rank through them (costmodel/tp_group_time.py, gpt_tp_group_pipeline.py,
chunk_tp_group.py). With --cp and --tp they are refused in one line (test_messages.py)."""

from __future__ import annotations

import pytest

from simpar.config import RunConfig, validate

GPT = dict(arch="gpt", dataset="copy", vocab=16, seq_len=8)
RESMLP = dict(arch="resmlp", layers=[64, 128, 128, 10])


@pytest.mark.parametrize("algo", ["tree", "ps"])
def test_sim_takes_tp_with_tree_and_ps(algo):
    sim = dict(clock="sim", collectives=algo)
    validate(RunConfig(**GPT, tp=4, sp=True, **sim), 4)
    validate(RunConfig(**GPT, tp=2, dp=2, **sim), 4)
    validate(RunConfig(**GPT, tp=2, pp=2, sp=True, schedule="zb-v", **sim), 4)
    validate(RunConfig(tp=4, **sim), 4)
    validate(RunConfig(**RESMLP, tp=4, sp=True, **sim), 4)
    validate(RunConfig(**RESMLP, tp=2, pp=2, sp=True, **sim), 4)
