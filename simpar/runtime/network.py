"""Where ranks sit, and which link a message between two of them takes (for the simulated clock).

A node holds `devices_per_node` consecutive world ranks (node = rank // devices_per_node, the
placement mesh.py's numbering is designed for: tp neighbours share a node). A message between two
ranks of one node takes the intra-node link (NVLink, shared memory); between nodes it leaves through
the node's network cards, which every group with members on that node shares:

    intra:  (intra_alpha, intra_bw)
    inter:  (inter_alpha, min(nic_bw, nics_per_node * nic_bw / flows)),  flows = c // m

with c the ranks placed on the sender's node (devices_per_node G, but fewer on a part-filled last
node: 3 ranks on nodes of 2 put one rank on the second node, and it has the node's NICs to itself)
and m the members of the message's group there: the c/m groups of that kind cross the node boundary
at once, each with one flow (a ring's one hop out of the node). A profile without network cards
(nics_per_node = 0, the `local` machine) is one node.

Which pair of nodes decides: with `per_hop` each message's own two ranks (a ring of 4 over nodes of
2 then has two fast hops and two slow ones); without it (the default) the group's: every message of
a group that spans nodes takes the inter-node link, the group's slowest hop -- the rule the cost
model's closed form uses ("a ring waits for its slowest link", costmodel/hardware.group_link), so
that predict == simulate holds. Either way the nodes come from the placement, not from the cost
model's table: tests/unit/runtime/test_mesh.py checks the two derivations agree on every layout. Measured
(4 ranks, dp 4, 4 experts over ep 2, nodes of 2 devices, tests/mpi/runtime/test_simclock.py's TWO_PER_NODE
numbers): a step of 205.5 us with the group's link, 133.7 us per hop; the cost model predicts 204.1.

The numbers are plain data copied from the hardware profile when the run is set up (run/setup.py):
the runtime never imports the cost model, so a mistake in the cost model's own closed form for a
group's link (costmodel/hardware.group_link) cannot move the simulated clock with it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Link:
    alpha: float  # s per message
    bandwidth: float  # bytes/s


@dataclass(frozen=True)
class Network:
    devices_per_node: int
    intra_alpha: float
    intra_bw: float
    inter_alpha: float = 0.0
    nic_bw: float = 0.0
    nics_per_node: int = 0
    per_hop: bool = False  # True: each message's own two nodes decide; False: its group's span
    rails: bool = False  # GPU profiles: a group drives one rail (NIC) per member it has on a node
    world_size: int = 0  # ranks placed (0: every node full); the last node may hold fewer than G

    def ranks_on(self, node: int) -> int:
        """How many ranks sit on `node`: G, or what is left of the world on a part-filled last node."""
        G = self.devices_per_node
        return min(G, self.world_size - node * G) if self.world_size else G

    def node_of(self, world_rank: int) -> int:
        return world_rank // self.devices_per_node

    def link(self, src: int, dst: int, members: list[int]) -> Link:
        """The link a message from world rank `src` to world rank `dst` takes inside the group whose
        world ranks are `members`."""
        if not self.per_hop:
            return self.group_link(src, members)
        if self.nics_per_node <= 0 or self.node_of(src) == self.node_of(dst):
            return Link(self.intra_alpha, self.intra_bw)
        return self._inter(src, members)

    def group_link(self, me: int, members: list[int]) -> Link:
        """The slowest hop of a group, seen from world rank `me`: what a collective whose messages
        MPI hides (--collectives mpi) is timed on."""
        if self.nics_per_node <= 0 or len({self.node_of(r) for r in members}) == 1:
            return Link(self.intra_alpha, self.intra_bw)
        return self._inter(me, members)

    def _inter(self, src: int, members: list[int]) -> Link:
        on_node = sum(self.node_of(r) == self.node_of(src) for r in members)
        flows = max(1, self.ranks_on(self.node_of(src)) // max(1, on_node))
        if self.rails:  # NCCL's channels leave through every member's own NIC, at most the NVLink ring
            per_flow = min(self.intra_bw, min(on_node, self.nics_per_node / flows) * self.nic_bw)
        else:
            per_flow = min(self.nic_bw, self.nics_per_node * self.nic_bw / flows)
        return Link(self.inter_alpha, per_flow)

    def uneven_group(self, groups: dict) -> str | None:
        """The first kind of group (name -> the world ranks of each of its groups) whose messages would
        not all take one link -- a group with more members on one node than on another (tp 2 on nodes
        of 3 devices: ranks 2 and 3 sit apart while 0 and 1 share a node), or a part-filled last node
        whose ranks get more of its NICs each; None when every kind has one link. The closed form
        prices each kind of collective on one link (costmodel/hardware.group_link), so under --clock
        sim such a placement is refused rather than priced wrong (run/setup.py)."""
        for name, members_of in groups.items():
            seen = {
                (link.alpha, link.bandwidth, self.node_span(members))
                for members in members_of
                if len(members) > 1  # a group of one sends nothing
                for link in (self.group_link(r, members) for r in members)
            }
            if len(seen) > 1:
                return name
        return None

    def node_span(self, members: list[int]) -> int:
        """How many nodes a group's ranks sit on (1 without network cards: one machine)."""
        return 1 if self.nics_per_node <= 0 else len({self.node_of(r) for r in members})
