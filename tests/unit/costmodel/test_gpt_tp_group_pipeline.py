"""costmodel/gpt_tp_group_pipeline.py: a pipeline chunk's steps on every tp rank under tree / ps. No MPI.

Two tp ranks, a chunk of blocks only (no head: no loss all-gather), no --sp: its forward is one tree
all-reduce of N = R h after each block's attention and MLP -- 2L of them, nothing else between them
but compute. With p = 2 the tree is one push and one reply: the root (rank 0) leaves it alpha before
rank 1 (tp_group_time's test), and from there rank 1, the leaf, still starts each next tree last, so
its clock is the critical path all along: from equal starts rank 1 ends at GptChunkCosts.forward's
seconds (each tree priced alone on its critical path, collectives.tree_allreduce) and rank 0 alpha
earlier. The backward's trees the same. With the head (the loss's ring all-gather after a tree, where
rank 0 sends first) rank 1 gains: the whole step is shorter than priced alone.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from simpar.config import RunConfig
from simpar.costmodel.gpt_pipeline_time import GptChunkCosts
from simpar.costmodel.hardware import group_link, load

L, H, A, S, V, B = 2, 16, 4, 8, 16, 2
T, PP = 2, 2


def chunk(algo: str, bounds: tuple[int, int], hw) -> GptChunkCosts:
    cfg = RunConfig(arch="gpt", dataset="copy", blocks=L, hidden=H, heads=A, seq_len=S, vocab=V, batch=4)
    cfg.tp, cfg.pp, cfg.dp, cfg.collectives = T, PP, 1, algo
    spec = SimpleNamespace(dp=1, world=T * PP, prec=SimpleNamespace(act=4, grad=4))
    links = {g: group_link(hw, g, 1, T, PP) for g in ("dp", "pp", "tp")}
    local = [V * H // T + S * H] + [12 * H * H // T + 7 * H // T + 6 * H] * L + [2 * H + V * H // T]
    return GptChunkCosts(cfg, spec, hw, links, bounds, local, 0.0)


@pytest.mark.parametrize("hardware", ["dgx-h100", "local"])
def test_two_tp_ranks_through_trees_alone_end_on_the_critical_path(hardware):
    hw = load(hardware)
    costs = chunk("tree", (1, L + 1), hw)  # the L blocks
    alpha = costs.links["tp"].alpha
    end, _ = costs.tp_group.step("F", B, 10.0, False, False, False)
    assert end[1] == pytest.approx(10.0 + costs.forward(B), rel=1e-12)
    assert end[0] == pytest.approx(end[1] - alpha, rel=1e-12)
    end, ready = costs.tp_group.step("B", B, 10.0, False, True, False)
    assert end[1] == pytest.approx(10.0 + costs.backward(B), rel=1e-12)
    assert sorted(ready) == [0, 1] and list(ready[0]) == list(end)  # the first block is done last


def test_ps_on_two_ranks_is_the_tree():
    hw = load("dgx-h100")
    tree, ps = chunk("tree", (L, L + 2), hw), chunk("ps", (L, L + 2), hw)
    assert list(tree.tp_group.step("F", B, 0.0, False, False, False)[0]) == list(
        ps.tp_group.step("F", B, 0.0, False, False, False)[0]
    )


def test_the_head_s_ring_lets_the_late_rank_catch_up():
    """The loss's all-gather after the trees on a GPU profile: NCCL's per-step latency is under the
    link's alpha, so rank 1 receives rank 0's early chunk sooner than a message it waits for."""
    costs = chunk("tree", (L, L + 2), load("dgx-h100"))  # the last block and the head
    end, _ = costs.tp_group.step("F", B, 0.0, False, False, False)
    assert max(end) < costs.forward(B)
    assert costs.tp_group is not None and chunk("ring", (L, L + 2), load("local")).tp_group is None
