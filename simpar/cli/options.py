"""The options of `train` and `tour`, generated from the config's sections (config/sections.py).

Each field of each section becomes one option in the argparse group named after its section: the flag
is --field-name (or the field's `flag`), the type comes from the field's annotation (int, float, str,
a comma-separated list of ints, a bool switch), the default, help text and choices from the field.
`config_from_args` reads them back into a RunConfig by the same field names, so an option is written
once, in its section.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, fields

from ..config import RunConfig, SimparError
from ..config.sections import SECTIONS
from .base import int_list

DEFAULT_LAYERS = {"digits": [64, 128, 128, 128, 10], "mnist": [784, 256, 256, 10]}  # synthetic: say --layers

# A field's annotation (a string: the sections use `from __future__ import annotations`) -> its parser.
PARSERS = {"int": int, "float": float, "str": None, "list[int]": int_list}


def is_option(f) -> bool:
    return f.metadata.get("option", True)


def flag_of(f) -> str:
    return f.metadata.get("flag", "--" + f.name.replace("_", "-"))


def run_options(tour: bool = False):
    """(section name, field) of every option, in --help order; the tour leaves out the train_only ones."""
    for name, section in SECTIONS.items():
        for f in fields(section):
            if is_option(f) and not (tour and f.metadata.get("train_only")):
                yield name, f


def add_run_arguments(p: argparse.ArgumentParser, tour: bool = False) -> None:
    """One argument group per section, one option per field."""
    groups = {}
    for name, f in run_options(tour):
        if name not in groups:
            groups[name] = p.add_argument_group(name)
        meta = f.metadata
        text = meta.get("help")
        if text is not None and tour:
            text += meta.get("tour_help", "")
        kwargs = {"help": text} if text is not None else {}
        if f.type == "bool":  # a switch: --sp turns it on, a `flag` such as --no-overlap turns it off
            action = "store_true" if f.default is False else "store_false"
            groups[name].add_argument(flag_of(f), dest=f.name, action=action, **kwargs)
            continue
        kind = PARSERS[f.type.removesuffix(" | None")]
        if kind is not None:
            kwargs["type"] = kind
        if "choices" in meta and meta.get("check") != "validate":
            kwargs["choices"] = meta["choices"]
        default = f.default if f.default_factory is MISSING else f.default_factory()
        default = meta.get("parse_default", default)
        groups[name].add_argument(flag_of(f), dest=f.name, default=default, **kwargs)


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The RunConfig of parsed options (those a command does not offer keep RunConfig's defaults)."""
    given = {f.name: getattr(args, f.name) for _, f in run_options() if hasattr(args, f.name)}
    gpt = given.get("arch") == "gpt"
    if gpt and given.get("dataset") == "digits":  # the default dataset: gpt's is the shipped text
        given["dataset"] = "text"
    if given.get("layers") is None:
        given["layers"] = [] if gpt else DEFAULT_LAYERS.get(args.dataset) or []
    cfg = RunConfig(**given)
    if not cfg.layers and not gpt:
        raise SimparError(
            f"--dataset {args.dataset} needs --layers (input width first, number of classes last)"
        )
    return cfg
