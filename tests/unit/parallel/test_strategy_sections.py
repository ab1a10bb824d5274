"""A strategy receives the sections it needs (config.StrategySections: model, layout, optimisation), not
the whole RunConfig: it cannot read the clock, the output paths, the checkpoints or the reliability options.

In-process, no MPI: build_strategy is run with each strategy class replaced by a recorder, and the source
of every module under parallel/ (but build_strategy's __init__.py, which takes the RunConfig to cut it) and
of model/gpt.py (gpt_units: the model section) is read.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
from pathlib import Path

import pytest

import simpar.parallel as parallel
from simpar.config import RunConfig, StrategySections
from simpar.config.sections import Layout, Model, Optimisation

PARALLEL = Path(parallel.__file__).parent
# Every module of parallel/ but __init__.py (build_strategy cuts the RunConfig into sections there), and
# gpt.py, whose gpt_units the gpt strategies call: none names `cfg` (the whole config), in code or signatures.
MODULES = sorted(str(p.relative_to(PARALLEL)) for p in PARALLEL.rglob("*.py") if p.name != "__init__.py")
MODULES.append("../model/gpt.py")
# (module, class, the RunConfig that build_strategy hands to it)
BUILT = [
    ("data", "DataParallel", dict(dp=1)),
    ("zero", "ZeroDataParallel", dict(dp=4, zero=2)),
    ("pipeline.engine", "PipelineParallel", dict(dp=1, pp=2)),
    ("tensor", "TensorParallel", dict(dp=1, tp=2)),
    ("tensor", "TensorParallel", dict(dp=1, tp=2, arch="resmlp")),
    ("expert", "ExpertParallel", dict(dp=4, ep=2, experts=4)),
    ("expert_zero", "ExpertZero", dict(dp=4, ep=2, experts=4, zero=3, arch="gpt", dataset="copy")),
    ("context_expert_zero", "ContextExpertZero", dict(dp=2, cp=2, ep=2, experts=4, zero=1, arch="gpt")),
    ("expert_zero_tp", "ExpertZeroTensor", dict(dp=2, ep=2, tp=2, experts=4, zero=2, arch="gpt")),
    ("expert_zero_tp", "ContextExpertZeroTensor", dict(cp=2, tp=2, experts=4, zero=3, arch="gpt")),
    ("zero", "ZeroDataParallel", dict(dp=2, zero=3, arch="gpt")),  # gpt through the converted strategies
    ("pipeline.engine", "PipelineParallel", dict(dp=1, pp=2, tp=2, arch="gpt")),
    ("tensor_gpt", "GptTensorParallel", dict(dp=1, tp=2, arch="gpt")),
    ("tensor_gpt", "GptTensorParallel", dict(dp=2, tp=2, sp=True, arch="gpt")),
    ("context", "ContextParallel", dict(dp=2, cp=2, arch="gpt")),
    ("context_tensor", "ContextTensorParallel", dict(dp=1, cp=2, tp=2, arch="gpt", cp_algo="ulysses")),
    ("zero_mesh", "ZeroGptTensorParallel", dict(dp=2, tp=2, zero=1, arch="gpt")),
    ("zero_mesh", "ZeroContextTensorPipelineParallel", dict(dp=1, cp=2, tp=2, pp=2, zero=1, arch="gpt")),
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


def test_every_strategy_module_and_base_is_checked():
    gpt = {"tensor_gpt.py", "vocab_parallel.py", "context.py", "context_tensor.py", "../model/gpt.py"}
    assert gpt | {"base.py", "pipeline/engine.py", "data.py", "zero.py", "expert.py"} <= set(MODULES)


@pytest.mark.parametrize("path", MODULES)
def test_strategy_modules_never_name_the_whole_config(path):
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
    # Every Strategy that any module of parallel/ defines (the replicas inside the gpt ones too), and
    # Strategy itself: built from (sections, mesh, ...).
    strategies = {Strategy}
    for path in MODULES[:-1]:
        module = importlib.import_module("simpar.parallel." + path[: -len(".py")].replace("/", "."))
        strategies |= {c for c in vars(module).values() if isinstance(c, type) and issubclass(c, Strategy)}
    gpt = {"GptTensorParallel", "VocabParallelReplicas", "ContextParallel", "ContextTensorParallel"}
    assert gpt | {"ContextVocabReplicas", "PipelineParallel"} <= {c.__name__ for c in strategies}
    for cls in strategies:
        params = list(inspect.signature(cls.__init__).parameters)
        assert params[1:3] == ["sections", "mesh"], (cls.__name__, params)
    assert not hasattr(Strategy, "cfg")
