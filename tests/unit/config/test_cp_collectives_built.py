"""--cp on the dense gpt with every --collectives (config/rules.layout_cp): the dp x cp gradient
all-reduce runs the chosen algorithm; what is still refused is one line each (test_messages.py)."""

from __future__ import annotations

import pytest

from simpar.config import RunConfig, SimparError, validate

GPT = dict(arch="gpt", dataset="copy", vocab=16, seq_len=8)
ALGORITHMS = ["rabenseifner", "tree", "ps", "mpi", "auto"]


@pytest.mark.parametrize("algo", ALGORITHMS)
@pytest.mark.parametrize(
    "fields,world",
    [
        (dict(cp=2), 2),
        (dict(cp=2, dp=2), 4),
        (dict(cp=2, tp=2, sp=True), 4),
        (dict(cp=2, pp=2, schedule="zb-h1"), 4),
        (dict(cp=2, tp=2, pp=2), 8),
    ],
)
def test_every_allreduce_algorithm_validates_with_cp(algo, fields, world):
    validate(RunConfig(**GPT, **fields, collectives=algo), world)


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_the_simulated_clock_takes_cp_and_dp_x_cp_with_each_algorithm(algo):
    validate(RunConfig(**GPT, cp=2, clock="sim", collectives=algo), 2)
    validate(RunConfig(**GPT, cp=2, dp=2, clock="sim", collectives=algo), 4)
    validate(RunConfig(**GPT, cp=2, pp=2, clock="sim", collectives="ps"), 4)  # a stage's 2 ranks


def test_zero_with_cp_keeps_its_own_ring_refusal():
    with pytest.raises(SimparError, match="--zero uses ring reduce-scatter and all-gather"):
        validate(RunConfig(**GPT, cp=2, zero=1, collectives="tree"), 2)
