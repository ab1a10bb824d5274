"""The MoE x cp combinations built last (config/moe.py no longer refuses them): --experts --cp --pp with
the zero-bubble schedules and --recompute, with and without --tp (pipeline/context_expert_stage.py), and
--experts --cp --tp --sp, with and without --pp (context_expert_tensor.py on row shards),
in full and mixed precision; and under --clock sim the layouts gpt_moe_time.py now prices (--sp with --cp,
every --collectives algorithm)."""

from __future__ import annotations

import pytest

from simpar.config import RunConfig, validate

MOE = dict(arch="gpt", dataset="copy", experts=2, vocab=16, seq_len=8)


@pytest.mark.parametrize(
    "fields,world",
    [
        (dict(cp=2, pp=2, schedule="zb-h1", recompute="full"), 4),
        (dict(cp=2, pp=2, schedule="zb-v", recompute="selective"), 4),
        (dict(cp=2, pp=2, tp=2, schedule="zb-v", recompute="full"), 8),
        (dict(cp=2, tp=2, sp=True), 4),
        (dict(cp=2, tp=2, pp=2, sp=True, schedule="zb-h1", recompute="selective"), 8),
        (dict(cp=2, pp=2, schedule="zb-v", precision="mixed-bf16", dtype="float32"), 4),
        (dict(cp=2, tp=2, sp=True, precision="mixed-fp16", dtype="float32"), 4),
        # --clock sim prices --recompute and the zb halves on cp stages (gpt_moe_pipeline_time.py)
        (dict(cp=2, pp=2, recompute="selective", clock="sim"), 4),
        (dict(cp=2, pp=2, schedule="zb-v", clock="sim"), 4),
        (dict(cp=2, pp=2, tp=2, recompute="full", cp_algo="ulysses", clock="sim"), 8),
        # --clock sim prices cp's row shards (gpt_moe_time.py: --sp's collectives on the b s/C rows)
        (dict(cp=2, tp=2, sp=True, clock="sim"), 4),
        (dict(cp=2, tp=2, sp=True, zero=3, clock="sim"), 4),
        # ... and every all-reduce algorithm (allreduce_ends.py; tp's: moe_tp_rounds.py)
        (dict(dp=4, ep=2, collectives="tree", clock="sim"), 4),
        (dict(dp=2, ep=2, pp=2, collectives="ps", clock="sim"), 4),
        (dict(dp=2, tp=2, collectives="rabenseifner", clock="sim"), 4),
        (dict(tp=2, pp=2, sp=True, collectives="ps", clock="sim"), 4),
        (dict(tp=2, pp=2, collectives="tree", schedule="zb-v", clock="sim"), 4),
    ],
)
def test_built_combinations_validate(fields, world):
    validate(RunConfig(**MOE, **fields), world)
