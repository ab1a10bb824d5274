"""The device mesh: world rank <-> (pp, dp, tp) coordinates, and one communicator per axis.

Ranks are laid out with tp fastest-varying, then dp, then pp:

    rank = (pp_index * dp + dp_index) * tp + tp_index

so the ranks of one tensor-parallel group are neighbours (on a real cluster: the same node, the
fastest links), and a pipeline stage is a contiguous block of dp*tp ranks.

  tp group: ranks that share (pp, dp)  -- exchange activations inside a layer
  dp group: ranks that share (pp, tp)  -- all-reduce gradients of the same shard
  pp group: ranks that share (dp, tp)  -- pass activations from stage to stage
"""

from __future__ import annotations

from dataclasses import dataclass

from .comm import Communicator


def coords_of(rank: int, dp: int, tp: int, pp: int) -> tuple[int, int, int]:
    """(pp_index, dp_index, tp_index) of a world rank."""
    tp_index = rank % tp
    dp_index = (rank // tp) % dp
    pp_index = rank // (tp * dp)
    return pp_index, dp_index, tp_index


def rank_of(pp_index: int, dp_index: int, tp_index: int, dp: int, tp: int) -> int:
    return (pp_index * dp + dp_index) * tp + tp_index


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

    @classmethod
    def build(cls, world: Communicator, dp: int, tp: int, pp: int) -> "Mesh":
        if dp * tp * pp != world.size:
            raise ValueError(f"dp*tp*pp = {dp}*{tp}*{pp} = {dp * tp * pp} but there are {world.size} ranks")
        p, d, t = coords_of(world.rank, dp, tp, pp)
        # Split keys are the coordinate along the axis, so group rank == coordinate.
        tp_comm = world.split(color=p * dp + d, key=t, name="tp")
        dp_comm = world.split(color=p * tp + t, key=d, name="dp")
        pp_comm = world.split(color=d * tp + t, key=p, name="pp")
        return cls(world, dp, tp, pp, p, d, t, dp_comm, tp_comm, pp_comm)

    def describe(self) -> dict:
        return {"dp": self.dp, "tp": self.tp, "pp": self.pp}
