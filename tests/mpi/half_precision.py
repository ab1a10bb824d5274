"""Half-precision equivalence: a layout trains the serial model when it moved the weights as far, and
the same way, as the serial run did.

Comparing final weights w_T is too weak at half precision: 16 units of roundoff of the largest weight
(the old tolerance) is more than the whole of a short run's update, so a layout that never updated, or
one that stepped with 0.75 x the learning rate, passed. What training did is the update w_T - w_0;
the check holds the layout's update to serial's, relative to the size of serial's:

    ||(w_T - w_0) - (w_T^serial - w_0)|| / ||w_T^serial - w_0||  <=  DRIFT        (L2 over every weight)

Measured on tests/mpi/model/test_mixed.py's 6-step runs (64-128-128-128-10, batch 64, SGD lr 0.05):
correct layouts 0.000-0.042 (float16 dp4 0.014, bfloat16 tp2 x pp2 0.041, MoE dp4 x ep2 0.042, the
worst); the same layout with --lr 0.0375 (0.75 x) 0.24 for both formats; a run that never updated 1.0
by definition. DRIFT = 0.1 sits between them with a margin of about 2.4 on each side. (Adam is looser:
an element whose gradient is near 0 may step +lr or -lr under another summation order; test_mixed.py's
Adam layout measured 0.096 and is held to 0.15.) The differences of correct layouts
come from summing the same half gradients in another order (test_mixed.py's docstring), and from the
half copy of the weights rounding a slightly different float32 master to a neighbouring half value.

w_0 is computed in this process, not trained: the serial strategy is built on MPI.COMM_SELF (a real
communicator of one rank) and asked for its full weights, as `--weights-out` would write them at step 0.
"""

from __future__ import annotations

import argparse
from functools import lru_cache

import numpy as np

DRIFT = 0.1  # of serial's update; see the module docstring for the measured values it separates


@lru_cache(maxsize=None)
def _initial(args: tuple[str, ...]) -> tuple:
    from mpi4py import MPI

    from simpar.cli.train import add_run_arguments, config_from_args
    from simpar.config import validate
    from simpar.parallel import build_strategy
    from simpar.runtime.comm import Communicator, Ledger
    from simpar.run.setup import build_mesh

    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    cfg = config_from_args(parser.parse_args(list(args)))
    validate(cfg, 1)
    world = Communicator(MPI.COMM_SELF, Ledger(), "world")
    strategy = build_strategy(cfg, build_mesh(cfg, world, None))  # the run's mesh, on one process
    # float32, as the run writes them: it holds every half value exactly (train.py, --weights-out)
    return tuple((W.astype(np.float32), b.astype(np.float32)) for W, b in strategy.full_weights())


def initial_weights(args) -> list:
    """Full-shape [(W, b)] before the first step of `simpar train ARGS` (the serial run's options)."""
    return list(_initial(tuple(args)))


def flat(weights) -> np.ndarray:
    return np.concatenate([np.concatenate((W.ravel(), b.ravel())) for W, b in weights])


def update_drift(weights, ref_weights, w0) -> float:
    """||(w - w0) - (w_ref - w0)|| / ||w_ref - w0||: how far the update strays from the reference's."""
    start = flat(w0)
    mine, theirs = flat(weights) - start, flat(ref_weights) - start
    size = np.linalg.norm(theirs)
    assert size > 0, "the reference run did not move its weights: nothing to compare"
    return float(np.linalg.norm(mine - theirs) / size)


def assert_same_update(weights, ref_weights, w0, drift: float = DRIFT) -> None:
    got = update_drift(weights, ref_weights, w0)
    assert got <= drift, f"the update differs from the reference's by {got:.3g} of its size (allowed {drift})"
