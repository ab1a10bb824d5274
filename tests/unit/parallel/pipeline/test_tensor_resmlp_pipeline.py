"""--arch resmlp with tp inside pp in the cost model: `plan --compare` offers the layouts.

The tests that launch real MPI jobs: tests/mpi/parallel/pipeline/test_tensor_resmlp_pipeline.py.
"""

from __future__ import annotations

from simpar import costmodel as cm
from tests.unit.parallel.pipeline.test_resmlp_pipeline import BATCH, LAYERS


def test_plan_compare_offers_tp_inside_pp_for_resmlp():
    """The cost model (and `plan --compare`) now counts tp x pp layouts of resmlp as valid."""
    from simpar.costmodel import hardware
    from simpar.costmodel.compare import rank_layouts

    spec = cm.Spec(widths=LAYERS, batch=BATCH, arch="resmlp")
    ranked, _ = rank_layouts(spec, hardware.load("dgx-h100"), 4, None)
    assert "tp2xpp2-1f1b" in {p["layout"] for p in ranked}
