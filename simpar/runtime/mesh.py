"""The device mesh: ONE ordered list of named axes, from which everything about a rank's place derives.

    AXES = pp, edp, ep, cp, tp    (slowest first; dp = edp x ep; cp: context parallelism, the
                                   sequence split over ranks, between dp and tp)

A world rank is a mixed-radix number over AXES, the last axis fastest:

    rank = (((pp_i * edp + edp_i) * ep + ep_i) * cp + cp_i) * tp + tp_i
         = ((pp_i * dp + dp_i) * cp + cp_i) * tp + tp_i

so the ranks of one tensor-parallel group are neighbours (on a real cluster: the same node, the
fastest links), and a pipeline stage is a contiguous block of dp*cp*tp ranks. A group is the set of
ranks that differ only along some axes:

  tp:    varies tp        -- exchange activations inside a layer
  dp:    varies edp, ep   -- all-reduce gradients of the same shard
  ep:    varies ep        -- experts' all-to-all (expert parallelism, carved out of dp)
  cp:    varies cp        -- pass K/V blocks around the sequence's ring (parallel/context.py)
  dpcp:  varies edp, ep, cp -- all-reduce gradients of the same shard when cp > 1 (every cp rank
                           saw other tokens of the same model: one combined all-reduce, as Megatron)
  edp:   varies edp       -- all-reduce an expert's gradients over its replicas
  edpcp: varies edp, cp   -- the same with cp > 1: every cp rank holds its ep rank's experts
  pp:    varies pp        -- pass activations from stage to stage
  world: varies all

Each group's communicator is made (MPI split, rank in group == coordinate along its axes) and
wrapped (for bfloat16 messages: precision.wire) ONCE, here; strategies take them from the mesh and
split nothing themselves. Placement: a node holds `devices_per_node` consecutive ranks
(network.py): `node_of(rank)`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from .comm import Communicator

AXES = ("pp", "edp", "ep", "cp", "tp")  # slowest first; the mesh's one list of axes
GROUPS = {  # group name -> the axes its ranks differ along
    "tp": ("tp",),
    "dp": ("edp", "ep"),
    "ep": ("ep",),
    "cp": ("cp",),
    "dpcp": ("edp", "ep", "cp"),
    "edp": ("edp",),
    "edpcp": ("edp", "cp"),
    "pp": ("pp",),
    "world": AXES,
}


def axis_sizes(dp: int, tp: int, pp: int, ep: int = 1, cp: int = 1) -> dict:
    if dp % ep:
        raise ValueError(f"ep = {ep} must divide dp = {dp}")
    return {"pp": pp, "edp": dp // ep, "ep": ep, "cp": cp, "tp": tp}


def coords(rank: int, sizes: dict) -> dict:
    """Coordinate of `rank` along every axis (mixed radix, the last axis fastest)."""
    out = {}
    for axis in reversed(AXES):
        rank, out[axis] = divmod(rank, sizes[axis])
    return {axis: out[axis] for axis in AXES}


def rank_at(coord: dict, sizes: dict) -> int:
    rank = 0
    for axis in AXES:
        rank = rank * sizes[axis] + coord[axis]
    return rank


def group_of(rank: int, group: str, sizes: dict) -> list[int]:
    """World ranks of `rank`'s `group`, in group-rank order (the group's axes as a mixed radix)."""
    mine, axes = coords(rank, sizes), GROUPS[group]
    members = []
    for index in range(math.prod(sizes[a] for a in axes)):
        c = dict(mine)
        for axis in reversed(axes):
            index, c[axis] = divmod(index, sizes[axis])
        members.append(rank_at(c, sizes))
    return members


def coords_of(rank: int, dp: int, tp: int, pp: int) -> tuple[int, int, int]:
    """(pp_index, dp_index, tp_index) of a world rank: `coords` on a mesh without expert
    parallelism (lesson 06 prints the groups with it)."""
    c = coords(rank, axis_sizes(dp, tp, pp))
    return c["pp"], c["edp"], c["tp"]


@dataclass
class Mesh:
    world: Communicator
    dp: int
    tp: int
    pp: int
    pp_index: int
    dp_index: int
    tp_index: int
    dp_comm: Communicator
    tp_comm: Communicator
    pp_comm: Communicator
    ep: int = 1
    cp: int = 1
    sizes: dict = field(default_factory=dict)  # axis -> size
    coords: dict = field(default_factory=dict)  # axis -> this rank's coordinate
    groups: dict = field(default_factory=dict)  # group name -> its communicator, wrapped
    devices_per_node: int | None = None

    @classmethod
    def build(
        cls,
        world: Communicator,
        dp: int,
        tp: int,
        pp: int,
        ep: int = 1,
        wrap: Callable = lambda comm: comm,
        devices_per_node: int | None = None,
        experts: bool = False,
        cp: int = 1,
    ) -> "Mesh":
        """Split `world` into every group (tp, dp, pp; with `experts` also ep and edp) and wrap each
        once with `wrap` (run/setup.py: precision.wire, bfloat16 as uint16 on the wire); with cp > 1
        also cp and dpcp."""
        if dp * cp * tp * pp != world.size:
            raise ValueError(
                f"dp*cp*tp*pp = {dp}*{cp}*{tp}*{pp} = {dp * cp * tp * pp} but there are {world.size} ranks"
            )
        sizes = axis_sizes(dp, tp, pp, ep, cp)
        mine = coords(world.rank, sizes)
        names = ["tp", "dp", "pp"] + (["ep", "edp"] if experts else []) + (["cp", "dpcp"] if cp > 1 else [])
        names += ["edpcp"] if experts and cp > 1 else []
        groups = {"world": wrap(world)}
        for name in names:  # every rank splits in this same order (MPI_Comm_split is collective)
            members = group_of(world.rank, name, sizes)
            color = min(members)  # the group's first world rank names it
            key = members.index(world.rank)  # group rank == coordinate along the group's axes
            groups[name] = wrap(world.split(color=color, key=key, name=name))
        d = mine["edp"] * ep + mine["ep"]
        mesh = cls(world, dp, tp, pp, mine["pp"], d, mine["tp"], groups["dp"], groups["tp"], groups["pp"])
        mesh.ep, mesh.cp, mesh.sizes, mesh.coords, mesh.groups = ep, cp, sizes, mine, groups
        mesh.devices_per_node = devices_per_node
        return mesh

    def coords_of(self, rank: int) -> dict:
        """Any world rank's coordinate along every axis, and its dp index (edp and ep together)."""
        c = coords(rank, self.sizes)
        return {**c, "dp": c["edp"] * self.sizes["ep"] + c["ep"]}

    def node_of(self, rank: int) -> int:
        """The node world rank `rank` sits on (all on one when the placement is unknown: wall clock)."""
        return rank // self.devices_per_node if self.devices_per_node else 0

    def describe(self) -> dict:
        return {"dp": self.dp, "tp": self.tp, "pp": self.pp, **({"cp": self.cp} if self.cp > 1 else {})}
