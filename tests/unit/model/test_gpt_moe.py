"""The mixture-of-experts transformer block (model/gpt_moe.py) against finite differences in float64:
router, top-k gates, capacity drops, the Switch aux loss, the experts and the attention around them,
chained through the whole model by train_pass (the code the strategy runs)."""

from __future__ import annotations

import numpy as np

from simpar.model.gpt_build import gpt_units
from simpar.model.gpt_moe import LOCAL, MoEBlockUnit, MoEFFN, dense_size, expert_size, train_pass
from simpar.model.mlp import softmax_cross_entropy
from simpar.model.moe import capacity

B, S, H, A, V, E = 3, 4, 8, 2, 11, 4


class Cfg:
    blocks, hidden, heads, seq_len, vocab = 2, H, A, S, V
    experts, top_k, capacity_factor, aux_loss_coef = E, 2, 1.0, 0.1


def setup():
    units = gpt_units(Cfg)
    flats = [u.init(3, np.float64) for u in units]
    rng = np.random.default_rng(19)
    tokens, labels = rng.integers(0, V, (B, S)), rng.integers(0, V, (B, S))
    return units, flats, tokens, labels


def run(units, flats, tokens, labels, record=None):
    """train_pass with every expert local: (loss, [grad of each unit's full flat vector])."""
    grads = [np.zeros_like(f) for f in flats]
    pairs, ffns = [], {}
    for u, f, g in zip(units, flats, grads):
        if isinstance(u, MoEBlockUnit):
            experts = dict(enumerate(zip(u.expert_flats(f), u.expert_flats(g))))
            ffns[u.index] = MoEFFN(H, E, Cfg.top_k, Cfg.capacity_factor, Cfg.aux_loss_coef, experts, LOCAL)
            ffns[u.index].record = record
            pairs.append((f[: u.dense], g[: u.dense]))
        else:
            pairs.append((f, g))
    N = B * S
    loss = train_pass(units, pairs, ffns, tokens, labels, N, N, lambda x: softmax_cross_entropy(x, labels, B))
    return loss, grads


def test_sizes():
    block = gpt_units(Cfg)[1]
    assert (
        block.size
        == dense_size(H, E) + E * expert_size(H)
        == 4 * H * H + 8 * H + H * E + E * (8 * H * H + 5 * H)
    )


def test_moe_gpt_gradients_match_finite_differences():
    """Every parameter's gradient (embedding, attention, router, every expert, head), with capacity
    dropping some tokens (C = 1, K = 2: cap = ceil(2 N / E)) and the aux loss on."""
    units, flats, tokens, labels = setup()
    routed = []
    loss, grads = run(units, flats, tokens, labels, record=lambda H_, kept: routed.append((H_, kept)))
    N = B * S
    assert capacity(Cfg.capacity_factor, Cfg.top_k, N, E) == 6
    dropped = sum(int(H_.sum() - kept.sum()) for H_, kept in routed)
    assert dropped > 0  # the drops are exercised
    eps = 1e-6
    rng = np.random.default_rng(0)
    for f, g in zip(flats, grads):
        picks = list(rng.choice(f.size, size=min(f.size, 12), replace=False))
        if f.size == units[1].size:  # a block: also its router and the first entries of every expert
            Wr0 = units[1].dense - H * E
            picks += [Wr0, Wr0 + 5] + [units[1].dense + e * expert_size(H) + 3 for e in range(E)]
        for i in picks:
            keep = f[i]
            f[i] = keep + eps
            up = run(units, flats, tokens, labels)[0]
            f[i] = keep - eps
            down = run(units, flats, tokens, labels)[0]
            f[i] = keep
            numeric = (up - down) / (2 * eps)
            assert abs(numeric - g[i]) <= 1e-6 * max(1.0, abs(numeric)), (i, numeric, g[i])
    assert all(np.abs(g).max() > 0 for g in grads)


def test_router_and_every_expert_receive_gradient():
    units, flats, tokens, labels = setup()
    _, grads = run(units, flats, tokens, labels)
    block = units[1]
    dWr = block.dense_views(grads[1][: block.dense])[-1]
    assert np.abs(dWr).max() > 0
    assert all(np.abs(g).max() > 0 for g in block.expert_flats(grads[1]))
