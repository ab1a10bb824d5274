"""The mesh's one list of axes (runtime/mesh.py): rank numbering, coordinates, every group, placement.

Checked for every factorisation of 8 ranks into pp x dp x tp, with every ep that divides dp, against
the numbering written out here: rank = (pp_i * dp + dp_i) * tp + tp_i, dp_i = edp_i * ep + ep_i.
Then placement (node = rank // devices_per_node) and the links it gives the simulated clock
(runtime/network.py), against the cost model's own closed form for a group's link (an independent
implementation: the two must agree on every regular layout). Then the groups a real 4-rank job gets.
"""

from __future__ import annotations

import itertools

import pytest

from simpar.costmodel import hardware
from simpar.runtime.mesh import AXES, axis_sizes, coords, coords_of, group_of, rank_at
from simpar.runtime.network import Network


def layouts(n: int):
    for pp, dp in itertools.product(range(1, n + 1), repeat=2):
        if n % (pp * dp) == 0:
            tp = n // (pp * dp)
            for ep in range(1, dp + 1):
                if dp % ep == 0:
                    yield pp, dp, tp, ep


LAYOUTS_8 = list(layouts(8))


def test_every_factorisation_of_8_is_enumerated():
    # 10 ordered (pp, dp, tp) with product 8; dp = 1, 2, 4, 8 has 1, 2, 3, 4 choices of ep
    assert len({(p, d, t) for p, d, t, _ in LAYOUTS_8}) == 10
    assert len(LAYOUTS_8) == 1 * 4 + 2 * 3 + 3 * 2 + 4 * 1  # pp*tp = 8/dp ways for each dp
    assert AXES == ("pp", "edp", "ep", "cp", "tp")  # cp: test_the_mesh_numbers_cp_between_dp_and_tp


@pytest.mark.parametrize("pp,dp,tp,ep", LAYOUTS_8)
def test_numbering_and_groups_follow_the_formula(pp, dp, tp, ep):
    sizes = axis_sizes(dp, tp, pp, ep)
    seen = set()
    for p, d, t in itertools.product(range(pp), range(dp), range(tp)):
        rank = (p * dp + d) * tp + t
        e, q = divmod(d, ep)  # edp index, ep index
        c = coords(rank, sizes)
        assert c == {"pp": p, "edp": e, "ep": q, "cp": 0, "tp": t}
        assert rank_at(c, sizes) == rank
        if ep == 1:
            assert coords_of(rank, dp, tp, pp) == (p, d, t)
        seen.add(rank)
        expected = {
            "tp": [(p * dp + d) * tp + i for i in range(tp)],
            "dp": [(p * dp + i) * tp + t for i in range(dp)],
            "ep": [(p * dp + e * ep + i) * tp + t for i in range(ep)],
            "edp": [(p * dp + i * ep + q) * tp + t for i in range(dp // ep)],
            "pp": [(i * dp + d) * tp + t for i in range(pp)],
            "world": list(range(8)),
        }
        for group, members in expected.items():
            assert group_of(rank, group, sizes) == members, (group, rank)
        # a rank's place in each group is its coordinate along that group's axes
        assert expected["tp"].index(rank) == t and expected["dp"].index(rank) == d
        assert expected["ep"].index(rank) == q and expected["edp"].index(rank) == e
        assert expected["pp"].index(rank) == p
    assert seen == set(range(8))


@pytest.mark.parametrize("pp,dp,tp,ep", LAYOUTS_8)
def test_groups_of_one_kind_partition_the_world(pp, dp, tp, ep):
    sizes = axis_sizes(dp, tp, pp, ep)
    for group in ("tp", "dp", "ep", "edp", "pp", "world"):
        groups = {tuple(group_of(r, group, sizes)) for r in range(8)}
        assert sorted(r for g in groups for r in g) == list(range(8)), group


def test_ep_must_divide_dp():
    with pytest.raises(ValueError):
        axis_sizes(dp=4, tp=1, pp=2, ep=3)


# -- placement and links ------------------------------------------------------------------------------


def test_a_message_takes_the_link_between_the_nodes_its_ranks_sit_on():
    net = Network(
        devices_per_node=2,
        intra_alpha=2e-6,
        intra_bw=100e9,
        inter_alpha=10e-6,
        nic_bw=5e9,
        nics_per_node=1,
        per_hop=True,
    )
    assert [net.node_of(r) for r in range(6)] == [0, 0, 1, 1, 2, 2]
    world = list(range(4))
    assert net.link(0, 1, world).alpha == 2e-6 and net.link(0, 1, world).bandwidth == 100e9
    assert net.link(1, 2, world).alpha == 10e-6
    # 2 of the group's members on the node: 2 // 2 = 1 flow through the one NIC
    assert net.link(1, 2, world).bandwidth == 5e9
    # a group with one member per node (stride 2): 2 flows share the NIC
    assert net.link(0, 2, [0, 2]).bandwidth == 2.5e9
    # the default: a group that spans nodes takes its slowest hop for every message (the cost
    # model's rule), a group inside one node the intra-node link
    group = Network(2, 2e-6, 100e9, 10e-6, 5e9, 1)
    assert group.link(0, 1, world).alpha == 10e-6 and group.link(0, 1, [0, 1]).alpha == 2e-6
    # no network cards: one node, whatever the rank
    local = Network(devices_per_node=2, intra_alpha=1e-6, intra_bw=1e9)
    assert local.link(0, 3, world).alpha == 1e-6


def test_a_rank_alone_on_a_part_filled_last_node_has_its_nics_to_itself():
    # 3 ranks on nodes of 2: rank 2 sits alone on node 1. Its dp group [0, 1, 2] has 1 member there
    # and the node holds 1 rank: 1 // 1 = 1 flow through the one NIC, 5 GB/s (not 2 // 1 = 2 flows)
    net = Network(2, 2e-6, 100e9, 10e-6, 5e9, 1, world_size=3)
    assert [net.ranks_on(n) for n in (0, 1)] == [2, 1]
    assert net.group_link(2, [0, 1, 2]).bandwidth == 5e9
    assert net.group_link(0, [0, 1, 2]).bandwidth == 5e9  # node 0: 2 ranks, 2 members, 1 flow
    assert net.uneven_group({"dp": [[0, 1, 2]]}) is None  # one link for every member
    # NCCL's rails: a group drives one NIC per member it has on the node, so with 2 NICs a node the
    # lone rank gets one NIC (5 GB/s), ranks 0 and 1 two (10 GB/s): no one link, refused
    rails = Network(2, 2e-6, 100e9, 10e-6, 5e9, 2, rails=True, world_size=3)
    assert (
        rails.group_link(2, [0, 1, 2]).bandwidth == 5e9 and rails.group_link(0, [0, 1, 2]).bandwidth == 10e9
    )
    assert rails.uneven_group({"dp": [[0, 1, 2]]}) == "dp"


def test_groups_placed_unevenly_on_full_nodes_are_named():
    # 6 ranks, tp 2 x dp 3 on nodes of 3: tp group [0, 1] inside node 0, [2, 3] across nodes 0 and 1
    net = Network(3, 2e-6, 100e9, 10e-6, 5e9, 1, world_size=6)
    sizes = axis_sizes(3, 2, 1)
    tp = [group_of(r, "tp", sizes) for r in (0, 2, 4)]
    assert tp == [[0, 1], [2, 3], [4, 5]] and net.uneven_group({"tp": tp}) == "tp"
    assert net.uneven_group({"pp": [[0], [1]], "tp": [[0, 1, 2], [3, 4, 5]]}) is None


def three_per_node(rails: bool) -> hardware.Hardware:
    return hardware.Hardware(
        "three", "", {"fp64": 1e12}, 1e-12, 2e-6, 100e9, 3, inter_alpha=10e-6, nic_bw=5e9, nics_per_node=2,
        ring_proto={"Simple": [0.0, 0.0, 0.0, 1.0]} if rails else {},
    )  # fmt: skip


PROFILES = {
    "two-per-node": lambda: hardware.Hardware(
        "two", "", {"fp64": 1e12}, 1e-12, 2e-6, 100e9, 2, inter_alpha=10e-6, nic_bw=5e9, nics_per_node=1
    ),
    "three-per-node": lambda: three_per_node(False),
    "three-per-node-rails": lambda: three_per_node(True),
}


@pytest.mark.parametrize(
    "preset",
    ["dgx-h100", "ib-cluster", "ethernet-100g", "two-per-node", "three-per-node", "three-per-node-rails"],
)
@pytest.mark.parametrize("n", [3, 6, 8, 12, 16, 32])
def test_group_links_from_placement_agree_with_the_cost_models_closed_form(preset, n):
    """Every placement the simulated clock accepts (network.uneven_group: each kind of group on one
    link, run/setup.check_placement) gets the closed form's link, part-filled last nodes included."""
    hw = PROFILES[preset]() if preset in PROFILES else hardware.load(preset)
    net = Network(
        hw.devices_per_node,
        hw.intra_alpha,
        hw.intra_bw,
        hw.inter_alpha,
        hw.nic_bw,
        hw.nics_per_node,
        rails=bool(hw.ring_proto),  # GPU profiles: NCCL's rails, as run/setup.py builds it
        world_size=n,
    )
    for pp, dp, tp, ep in layouts(n):
        if ep > 1:
            continue
        sizes = axis_sizes(dp, tp, pp)
        for group in ("tp", "dp", "pp", "world"):
            members_of = [group_of(r, group, sizes) for r in range(n) if min(group_of(r, group, sizes)) == r]
            if len(members_of[0]) == 1 or net.uneven_group({group: members_of}):
                continue  # a group of one sends nothing; an uneven placement is refused under --clock sim
            closed = hardware.group_link(hw, group, dp, tp, pp)
            for members in members_of:
                for rank in members:
                    link = net.group_link(rank, members)
                    assert (link.alpha, link.bandwidth) == pytest.approx((closed.alpha, closed.bw)), (
                        preset,
                        (pp, dp, tp),
                        group,
                        rank,
                    )


# -- the groups a real job gets ------------------------------------------------------------------------


def factorisations(n: int):
    for pp, dp, cp in itertools.product(range(1, n + 1), repeat=3):
        if n % (pp * dp * cp) == 0:
            yield pp, dp, cp, n // (pp * dp * cp)


# every factorisation of 8 ranks, and 16's dp2 x cp2 x tp2 x pp2 (every axis > 1: too many ranks for CI)
@pytest.mark.parametrize("pp,dp,C,tp", [*factorisations(8), (2, 2, 2, 2)])
def test_the_mesh_numbers_cp_between_dp_and_tp(pp, dp, C, tp):
    """rank = ((pp_i dp + dp_i) C + cp_i) tp + tp_i; the cp group varies cp_i alone, dpcp (the gradient
    all-reduce's) varies dp_i and cp_i, dp varies dp_i alone; each rank's place in a group is its
    coordinate (dpcp: dp_i C + cp_i)."""
    sizes = axis_sizes(dp, tp, pp, 1, C)
    for p, d, c, t in itertools.product(range(pp), range(dp), range(C), range(tp)):
        rank = ((p * dp + d) * C + c) * tp + t
        assert coords(rank, sizes) == {"pp": p, "edp": d, "ep": 0, "cp": c, "tp": t}
        assert rank_at(coords(rank, sizes), sizes) == rank
        cp_group = [((p * dp + d) * C + i) * tp + t for i in range(C)]
        dpcp = [((p * dp + j) * C + i) * tp + t for j in range(dp) for i in range(C)]
        assert group_of(rank, "cp", sizes) == cp_group and cp_group.index(rank) == c
        assert group_of(rank, "dpcp", sizes) == dpcp and dpcp.index(rank) == d * C + c
        assert group_of(rank, "dp", sizes) == [((p * dp + j) * C + c) * tp + t for j in range(dp)]
        assert group_of(rank, "tp", sizes) == [((p * dp + d) * C + c) * tp + i for i in range(tp)]
        assert group_of(rank, "pp", sizes) == [((i * dp + d) * C + c) * tp + t for i in range(pp)]


def test_the_edpcp_group_holds_an_experts_replicas_over_dp_and_cp():
    """dp 4 = edp 2 x ep 2, cp 2 (8 ranks, rank = d C + c with d = edp_i ep + ep_i): an expert of ep rank
    j lives on every rank with ep_i = j; the edpcp group is those ranks, its rank edp_i C + cp_i (the
    order costmodel/cp_moe.py prices the expert-gradient all-reduce in)."""
    sizes = axis_sizes(4, 1, 1, 2, 2)
    for d, c in itertools.product(range(4), range(2)):
        rank, (e, j) = d * 2 + c, divmod(d, 2)
        group = [(q * 2 + j) * 2 + i for q in range(2) for i in range(2)]
        assert group_of(rank, "edpcp", sizes) == group and group.index(rank) == e * 2 + c
        assert group_of(rank, "ep", sizes) == [(e * 2 + q) * 2 + c for q in range(2)]
