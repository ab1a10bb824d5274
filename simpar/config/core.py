"""RunConfig: everything a training run needs, and `validate`, every rule a layout must obey.

RunConfig is the fields of the sections in sections.py (model, data, optimisation, layout, time,
reliability, output, checkpoints) side by side: one flat dataclass, so `cfg.dp`, `RunConfig(dp=2)`,
`dataclasses.replace(cfg, dp=1)` and `cfg.to_dict()` (the metrics' "config") read as before, while
each field is written once, in its section, with its option's help text. `cfg.layout`, `cfg.model`,
... give one section's values as that section's dataclass (a copy, for reading).

`validate` runs on every rank before any MPI traffic, on the same inputs, so every rank reaches the
same verdict: a bad configuration ends the whole job with one clear line instead of a hang. Its rules
are per section (rules.py; the pipeline's in pipeline.py, the experts' in moe.py); validate says in
which order they run, which decides the problem reported when there are several.
SimparError lives in errors.py, so that all of them can raise it; import it from here.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, asdict, field, fields, make_dataclass

from ..errors import SimparError
from ..errors import require as _require
from . import rules
from .moe import moe_rules
from .pipeline import pipeline_rules
from .sections import (  # noqa: F401  (re-exported: the choices every option accepts)
    ACTIVATIONS,
    ALLTOALLS,
    ARCHS,
    CLOCKS,
    COLLECTIVES,
    COMPUTE_MODELS,
    DATA_SOURCES,
    DATASETS,
    DTYPES,
    KERNELS,
    OPTIMIZERS,
    PRECISIONS,
    RECOMPUTE,
    SCHEDULES,
    SECTIONS,
    Model,
    StrategySections,
)


class _RunConfigMethods:
    """What RunConfig adds to its sections' fields: derived values and one view per section."""

    def to_dict(self) -> dict:
        return asdict(self)

    # derived from the model section's fields, written once there
    n_layers = Model.n_layers
    mixed = Model.mixed
    compute_dtype = Model.compute_dtype

    def section(self, name: str):
        """One section's values as its own dataclass, e.g. cfg.section("layout").dp (a copy)."""
        cls = SECTIONS[name]
        return cls(**{f.name: getattr(self, f.name) for f in fields(cls)})


def _section_view(name: str) -> property:
    return property(lambda self: self.section(name), doc=f"the {name} section's values (a copy)")


for _name in SECTIONS:  # cfg.model, cfg.data, cfg.optimisation, cfg.layout, ...
    setattr(_RunConfigMethods, _name, _section_view(_name))


def _same_field(f):
    """A fresh field like `f` (a dataclass field belongs to one class)."""
    if f.default_factory is not MISSING:
        return field(default_factory=f.default_factory, metadata=f.metadata)
    return field(default=f.default, metadata=f.metadata)


RunConfig = make_dataclass(
    "RunConfig",
    [(f.name, f.type, _same_field(f)) for section in SECTIONS.values() for f in fields(section)],
    bases=(_RunConfigMethods,),
)
RunConfig.__module__ = __name__  # so that pickle (gather_object, bcast) finds it here
RunConfig.__doc__ = "Every option of `train`: the fields of the sections in sections.py, flat."


def validate(cfg: RunConfig, world_size: int) -> RunConfig:
    """Check every rule; fill in dp from the world size. Raises SimparError naming the first problem.

    The order below is the precedence of the messages (the first broken rule is reported): names
    and single values first, then what the world size and layout need, pipeline, experts, ZeRO."""
    rules.model_layers(cfg)
    rules.data_dataset(cfg)
    rules.optimisation_optimizer(cfg)
    rules.model_names(cfg)
    rules.layout_names(cfg)
    rules.data_source(cfg)
    rules.time_names(cfg)
    rules.reliability_values(cfg, world_size, parse_inject)
    rules.optimisation_values(cfg)
    rules.model_seed(cfg)
    rules.optimisation_counts(cfg)
    rules.data_samples(cfg)
    rules.layout_values(cfg)
    rules.checkpoints_values(cfg)
    rules.data_files(cfg)
    rules.layout_fit(cfg, world_size)  # fills in cfg.dp
    pipeline_rules(cfg)
    moe_rules(cfg, RunConfig())
    rules.layout_zero(cfg)
    rules.layout_cp(cfg)
    return cfg


INJECTIONS = {
    "kill": ("rank", "step"),
    "stall": ("rank", "step", "seconds"),
    "nan": ("rank", "step"),
    "desync": ("rank", "step"),
}


def parse_inject(text: str) -> dict:
    """'stall@rank=1,step=3,seconds=20' -> {"kind": "stall", "rank": 1, "step": 3, "seconds": 20.0}."""
    kind, _, rest = (text or "").partition("@")
    usage = (
        "--inject KIND@rank=R,step=S with KIND kill, stall (add ,seconds=T), nan or desync, "
        f"e.g. stall@rank=1,step=3,seconds=20; got {text!r}"
    )
    _require(kind in INJECTIONS, usage)
    fields = {}
    for part in filter(None, rest.split(",")):
        key, _, value = part.partition("=")
        _require(key in INJECTIONS[kind] and value, usage)
        try:
            fields[key] = float(value) if key == "seconds" else int(value)
        except ValueError:
            raise SimparError(usage) from None
    _require(set(fields) == set(INJECTIONS[kind]), usage)
    _require(fields["step"] >= 1 and fields["rank"] >= 0, usage)
    seconds = fields.get("seconds", 0.0)
    _require(math.isfinite(seconds) and seconds >= 0, f"--inject {text}: seconds must be a number >= 0")
    return {"kind": kind, **fields}


def layout_name(layout) -> str:
    """dp4, dp2xzero1, tp2, tp2-sp, pp2-1f1b, dp2xtp2, ... ("serial" for one rank). `layout` is anything with
    dp, tp, pp, zero and schedule attributes: a RunConfig or the cost model's Spec."""
    parts = [f"dp{layout.dp}"] if layout.dp and layout.dp > 1 else []
    parts += [f"zero{layout.zero}"] if layout.zero else []
    parts += [f"ep{layout.ep}"] if getattr(layout, "ep", 1) > 1 else []
    cp = getattr(layout, "cp", 1)
    parts += (
        [f"cp{cp}" + ("-ulysses" if getattr(layout, "cp_algo", "ring") == "ulysses" else "")]
        if cp > 1
        else []
    )
    parts += [f"tp{layout.tp}" + ("-sp" if getattr(layout, "sp", False) else "")] if layout.tp > 1 else []
    parts += [f"pp{layout.pp}-{layout.schedule}"] if layout.pp > 1 else []
    return "x".join(parts) or "serial"
