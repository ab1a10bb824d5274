"""A run's configuration: RunConfig (every option of `train`), the rules `validate` holds it to, and
the choices each option accepts. core.py holds the dataclass and the general rules; pipeline.py and
moe.py the rules of the pipeline and the mixture of experts, which validate calls in turn."""

from ..errors import SimparError, require
from .core import (
    ACTIVATIONS,
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
    RunConfig,
    StrategySections,
    layout_name,
    parse_inject,
    validate,
)

__all__ = [
    "ACTIVATIONS",
    "ARCHS",
    "CLOCKS",
    "COLLECTIVES",
    "COMPUTE_MODELS",
    "DATA_SOURCES",
    "DATASETS",
    "DTYPES",
    "KERNELS",
    "OPTIMIZERS",
    "PRECISIONS",
    "RECOMPUTE",
    "SCHEDULES",
    "RunConfig",
    "StrategySections",
    "SimparError",
    "layout_name",
    "parse_inject",
    "require",
    "validate",
]
