"""`simpar train`: train one layout. Its options (the tour's too) are generated from the config's
sections by options.py.

python -m simpar train --dtype float64 --steps 20
mpiexec -n 4 python -m mpi4py -m simpar train --dp 2 --tp 2 --metrics-out run.json --trace trace.json
"""

from __future__ import annotations

import argparse

from .options import DEFAULT_LAYERS, add_run_arguments, config_from_args  # noqa: F401  (tour, lessons)


def train_command(args: argparse.Namespace) -> int:
    from ..run.loop import train_main

    return train_main(config_from_args(args))
