"""A strategy receives the sections it needs (config.StrategySections: model, layout, optimisation), not
the whole RunConfig: it cannot read the clock, the output paths, the checkpoints or the reliability options.

In-process, no MPI: build_strategy is run with each converted strategy class replaced by a recorder, and
the converted modules' source is read. The gpt strategies (tensor_gpt.py, vocab_parallel.py, context.py,
context_tensor.py) still take the whole config and are not checked here yet; the pipeline engine hands
their stacks joined(model, layout) (base.JoinedSections), never the whole config.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest

import simpar.parallel as parallel
from simpar.config import RunConfig, StrategySections
from simpar.config.sections import Layout, Model, Optimisation

PARALLEL = Path(parallel.__file__).parent
# The converted modules: none of them names `cfg` any more (the whole config), in code or signatures.
# (base.py still keeps `self.cfg = sections` for the gpt strategies, which read the whole config there.)
CONVERTED = [
    "data.py", "zero.py", "tensor.py", "tensor_resmlp.py", "resmlp_stack.py", "expert.py",
    "pipeline/engine.py", "pipeline/comms.py", "pipeline/partition.py", "pipeline/recompute.py",
    "pipeline/schedules.py", "pipeline/check.py",
]  # fmt: skip
# (module, class, the RunConfig that build_strategy hands to it)
BUILT = [
    ("data", "DataParallel", dict(dp=1)),
    ("zero", "ZeroDataParallel", dict(dp=4, zero=2)),
    ("pipeline.engine", "PipelineParallel", dict(dp=1, pp=2)),
    ("tensor", "TensorParallel", dict(dp=1, tp=2)),
    ("tensor", "TensorParallel", dict(dp=1, tp=2, arch="resmlp")),
    ("expert", "ExpertParallel", dict(dp=4, ep=2, experts=4)),
    ("zero", "ZeroDataParallel", dict(dp=2, zero=3, arch="gpt")),  # gpt through the converted strategies
    ("pipeline.engine", "PipelineParallel", dict(dp=1, pp=2, tp=2, arch="gpt")),
]


def test_the_sections_are_exactly_model_layout_and_optimisation():
    names = [f.name for f in dataclasses.fields(StrategySections)]
    assert names == ["model", "layout", "optimisation"]
    s = StrategySections.of(RunConfig(dp=2, lr=0.1, clock="sim", checkpoint_dir="x"))
    assert (
        isinstance(s.model, Model)
        and isinstance(s.layout, Layout)
        and isinstance(s.optimisation, Optimisation)
    )
    assert s.layout.dp == 2 and s.optimisation.lr == 0.1
    for whole_config_only in ("clock", "checkpoint_dir", "metrics_out", "inject", "dataset", "lr", "dp"):
        assert not hasattr(s, whole_config_only)  # only through its section, and only these three


@pytest.mark.parametrize("module, name, options", BUILT, ids=[f"{m}-{o}" for m, _, o in BUILT])
def test_build_strategy_hands_each_strategy_its_sections_not_the_config(monkeypatch, module, name, options):
    received = []

    class Recorder:
        def __init__(self, *args, **kwargs):
            received.append((args, kwargs))

    mod = __import__(f"simpar.parallel.{module}", fromlist=[name])
    monkeypatch.setattr(mod, name, Recorder)
    if name == "TensorParallel":  # its stack is built first: record that too
        monkeypatch.setattr(mod, "TensorParallelStack", Recorder, raising=False)
        res = __import__("simpar.parallel.tensor_resmlp", fromlist=["ResTensorStack"])
        monkeypatch.setattr(res, "ResTensorStack", Recorder)
    mesh = object()
    parallel.build_strategy(RunConfig(**options), mesh)
    assert received
    for args, kwargs in received:
        values = list(args) + list(kwargs.values())
        assert not any(isinstance(v, RunConfig) for v in values), (name, values)
        assert any(isinstance(v, (StrategySections, Model, Layout)) for v in values), (name, values)


@pytest.mark.parametrize("path", CONVERTED)
def test_converted_modules_never_name_the_whole_config(path):
    tree = ast.parse((PARALLEL / path).read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments) for a in n.args + n.kwonlyargs}
    names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert "cfg" not in names and "RunConfig" not in names, path


def test_strategy_constructors_take_sections():
    from simpar.parallel.base import Strategy

    for module, name, _ in BUILT:
        cls = getattr(__import__(f"simpar.parallel.{module}", fromlist=[name]), name)
        assert issubclass(cls, Strategy)
        params = list(inspect.signature(cls.__init__).parameters)
        assert params[1:3] == ["sections", "mesh"], (name, params)


def test_joined_sections_answer_their_fields_only():
    from simpar.parallel.base import joined

    cfg = RunConfig(layers=[8, 16, 4], tp=2, sp=True, clock="sim")
    view = joined(cfg.model, cfg.layout)
    assert view.layers == [8, 16, 4] and view.sp and view.n_layers == 2
    assert view.compute_dtype() == cfg.compute_dtype()
    with pytest.raises(AttributeError):
        view.clock  # the time section is not joined
