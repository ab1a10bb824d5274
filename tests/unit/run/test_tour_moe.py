"""The tour with --experts in-process: which layouts it offers for E experts on n ranks.

The tests that launch real MPI jobs: tests/mpi/run/test_tour_moe.py.
"""

from __future__ import annotations

from simpar.config import RunConfig
from simpar.run.tour import layouts_for


def names(world: int, **options) -> list[str]:
    return [name for name, _ in layouts_for(world, RunConfig(**options))]


def test_moe_tour_offers_dp_and_each_ep_that_divides():
    assert names(4, experts=4) == ["serial", "dp4", "dp4xep2", "dp4xep4"]
    assert names(4, experts=2) == ["serial", "dp4", "dp4xep2"]  # ep 4 would hold half an expert
    assert names(4, experts=6) == ["serial", "dp4", "dp4xep2"]
    assert names(4, experts=3) == ["serial", "dp4"]  # experts replicated only
    assert names(8, experts=8) == ["serial", "dp8", "dp8xep2", "dp8xep4", "dp8xep8"]
    assert names(2, experts=4) == ["serial", "dp2", "dp2xep2"]
    assert names(1, experts=4) == ["serial"]
    assert names(4, experts=4, dtype="float32", precision="mixed-bf16") == names(4, experts=4)
    # train refuses MoE under mixed-fp16: the serial reference stays, to say so in one line
    assert names(4, experts=4, dtype="float32", precision="mixed-fp16") == ["serial"]
    # a dense model refuses --ep, a mixture of experts --zero, --tp and --pp: neither list leaks
    assert not any("ep" in n for n in names(4))
    assert not any(n.startswith(("tp", "pp")) or "zero" in n for n in names(4, experts=4))
    # --alltoall bruck: the ep layouts use it; serial and dp4 have no all-to-all and stay pairwise
    bruck = dict(layouts_for(4, RunConfig(experts=4, alltoall="bruck")))
    assert list(bruck) == names(4, experts=4)
    assert [bruck[n].get("alltoall", "bruck") for n in bruck] == ["pairwise", "pairwise", "bruck", "bruck"]


def test_gpt_moe_tour_adds_the_cp_layouts_and_dp2_cp2_ep2():
    """--arch gpt --experts: cp layouts run with MoE blocks (parallel/context_expert.py), dp2 x cp2 x ep2
    among them; tp4, dp2 x tp2 (each also with --sp) and dp2 x ep2 x tp2 (expert_tensor_gpt.py) and
    cp2 x tp2 (context_expert_tensor.py); all of them under mixed-bf16 too; no pipeline (its
    micro-batches are serial --grad-accum M's micro-steps)."""
    gpt = dict(experts=4, arch="gpt", dataset="copy")
    cp = ["cp2", "cp4", "dp2xcp2", "dp2xcp2xep2", "cp4-ulysses"]
    tp = ["tp4", "tp4-sp", "dp2xtp2", "dp2xtp2-sp", "dp2xep2xtp2"]
    assert names(4, **gpt) == ["serial", "dp4", "dp4xep2", "dp4xep4", *tp, *cp[:4], "cp2xtp2", cp[4]]
    assert names(4, **gpt, dtype="float32", precision="mixed-bf16") == names(4, **gpt)
    assert "dp2xcp2xep2" not in names(4, arch="gpt", dataset="copy")  # a dense model refuses --ep
