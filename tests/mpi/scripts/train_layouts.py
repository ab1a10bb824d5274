"""Several `simpar train` runs in ONE mpiexec launch, as the tour runs its layouts (run/tour.py): a test
gives cases and saves a launch (and CI time) per case.

    mpiexec -n N python tests/mpi/scripts/train_layouts.py OUT_DIR CASES_JSON

CASES_JSON: [[name, ranks, [train options...]], ...]. Each case trains on the first `ranks` world ranks
(the others wait), then rank 0 writes OUT_DIR/name.json (the metrics) and OUT_DIR/name.npz (the final
full-shape weights, as --weights-out). A case that fails ends the launch with its message on stderr.
"""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from mpi4py import MPI  # noqa: E402

from simpar.cli import build_parser  # noqa: E402
from simpar.cli.options import config_from_args  # noqa: E402
from simpar.files import write_json, write_weights  # noqa: E402
from simpar.run.loop import run_training  # noqa: E402
from simpar.runtime.comm import Communicator, Ledger  # noqa: E402

out_dir, cases = sys.argv[1], json.loads(sys.argv[2])
world = MPI.COMM_WORLD
for name, ranks, args in cases:
    cfg = config_from_args(build_parser().parse_args(["train", *args, "--quiet"]))
    sub = world.Split(0 if world.rank < ranks else MPI.UNDEFINED, world.rank)
    if sub != MPI.COMM_NULL:
        result = run_training(cfg, Communicator(sub, Ledger(), name))
        sub.Free()
        if result is not None:
            write_json(os.path.join(out_dir, f"{name}.json"), result.metrics)
            write_weights(os.path.join(out_dir, f"{name}.npz"), result.weights)
    world.Barrier()
