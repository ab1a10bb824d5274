"""Run under mpiexec by test_errors: rank 2 raises in its 4th step while the others are inside
a collective. `python -m mpi4py` must turn that into MPI_Abort, ending every rank."""

from simpar import parallel
from simpar.config import RunConfig
from simpar.run.loop import init_mpi, run_training

world = init_mpi()
original = parallel.build_strategy


def faulty_build(cfg, mesh):
    strategy = original(cfg, mesh)
    step = strategy.train_step
    calls = {"n": 0}

    def train_step(micro, batch):
        calls["n"] += 1
        if world.rank == 2 and calls["n"] == 4:
            raise RuntimeError("injected fault on rank 2")
        return step(micro, batch)

    strategy.train_step = train_step
    return strategy


parallel.build_strategy = faulty_build
run_training(RunConfig(steps=50, quiet=True), world)
