"""A real 4-rank job builds the groups the numbering formula says (tests/unit/runtime/test_mesh.py
checks the formula itself, in-process)."""

from __future__ import annotations

from pathlib import Path

from tests.mpiutil import run_script

MESH_SCRIPT = """
import sys
from mpi4py import MPI
from simpar.runtime.comm import Communicator, Ledger
from simpar.runtime.mesh import Mesh, axis_sizes, group_of
world = Communicator(MPI.COMM_WORLD, Ledger())
for dp, tp, pp, ep in [(4, 1, 1, 2), (2, 2, 1, 2), (2, 1, 2, 2), (1, 2, 2, 1), (4, 1, 1, 4)]:
    mesh = Mesh.build(world, dp, tp, pp, ep=ep, experts=True, devices_per_node=2)
    sizes = axis_sizes(dp, tp, pp, ep)
    for name, comm in mesh.groups.items():
        assert list(comm.world_ranks) == group_of(world.rank, name, sizes), (name, dp, tp, pp, ep)
        assert comm.runtime is world.runtime  # every group carries the run's runtime
    by_name = (mesh.groups["dp"], mesh.groups["tp"], mesh.groups["pp"])
    assert (mesh.dp_comm, mesh.tp_comm, mesh.pp_comm) == by_name
    assert mesh.node_of(world.rank) == world.rank // 2
    for r in range(world.size):  # any rank's place: dp index = (rank // tp) % dp
        assert mesh.coords_of(r)["dp"] == (r // tp) % dp and mesh.coords_of(r)["pp"] == r // (dp * tp)
print("MESH OK", world.rank)
"""


def test_a_real_job_gets_the_groups_of_the_formula(tmp_path: Path):
    script = tmp_path / "mesh_check.py"
    script.write_text(MESH_SCRIPT)
    res = run_script(4, script, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.count("MESH OK") == 4
