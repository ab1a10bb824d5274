"""costmodel/chunk_tp_group.py: an mlp chunk's steps on every tp rank under tree / ps. No MPI.

mlp 64,128,128,10 on tp 4: layer 0 column, 1 row, 2 replicated (spec.Shape). Its forward has ONE tp
collective, the row layer's g all-reduce of r x 128 elements; its backward none (the column layer's
f would give layer 0's input gradient: not needed). From equal starts one parameter-server
all-reduce ends (ps_time.py's bucket, by hand there): the last worker at the critical path,
2 alpha + 2 (p-1) W (collectives.ps_allreduce, what RankCosts prices), the server alpha before it,
worker w (p-1-w) W before it, W = r 128 x 4 bytes / bw. So the last worker's forward ends at
RankCosts.forward exactly, the others earlier by those; the backward ends together.
"""

from __future__ import annotations

import pytest

from simpar.config import RunConfig
from simpar.costmodel import hardware
from simpar.costmodel.chunk_tp_group import tp_group_of
from simpar.costmodel.chunktime import RankCosts
from simpar.costmodel.rank import predict_rank
from simpar.costmodel.spec import Shape, Spec

R = 8  # rows of one micro-batch


def costs(algo: str, hw) -> RankCosts:
    cfg = RunConfig(layers=[64, 128, 128, 10], tp=4, batch=R, collectives=algo, dtype="float32")
    cfg.dp = 1
    spec = Spec.from_config(cfg, 4)
    links = {g: hardware.group_link(hw, g, 1, 4, 1) for g in ("tp", "dp", "pp", "world")}
    shape = Shape.of(spec)
    assert shape.kinds == [["column", "row", "replicated"]]
    return RankCosts(spec, hw, links, predict_rank(spec, 0, shape), shape.kinds[0], shape.sizes[0])


@pytest.mark.parametrize("profile", ["dgx-h100", "local"])
def test_ps_ranks_leave_the_row_layers_all_reduce_worker_by_worker(profile):
    hw = hardware.load(profile)
    c = costs("ps", hw)
    link = c.links["tp"]
    W = R * 128 * 4 / link.bw
    end, _ = tp_group_of(c).step("F", R, 5.0, False, False, False)
    last = 5.0 + c.forward(R)
    assert list(end) == pytest.approx([last - link.alpha, last - 2 * W, last - W, last], rel=1e-12)
    end, ready = tp_group_of(c).step("B", R, 5.0, False, True, False)
    assert list(end) == pytest.approx([5.0 + c.backward(R)] * 4, rel=1e-12) and sorted(ready) == [0, 1, 2]


def test_a_ring_keeps_one_clock():
    assert tp_group_of(costs("ring", hardware.load("local"))) is None
