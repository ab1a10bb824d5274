"""The `train` and `tour` parsers are generated from the config's sections: every field of every
section is an option (with its help text, choices and type), there is no option without a field, and
every option reaches its own field of RunConfig."""

from __future__ import annotations

import dataclasses

import pytest

from simpar.cli import build_parser
from simpar.cli.options import DEFAULT_LAYERS, config_from_args, flag_of
from simpar.config import RunConfig
from simpar.config.sections import SECTIONS

# What `tour` adds of its own (not run options), and what argparse adds.
TOUR_OWN = {"--quick", "--out", "--no-plots"}
HELP = {"-h", "--help"}


def subparser(name: str):
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices[name]


def options_by_group(parser) -> dict[str, list[str]]:
    """{group title: [long flags, in order]} of an argparse parser."""
    return {
        g.title: [a.option_strings[-1] for a in g._group_actions if not set(a.option_strings) & HELP]
        for g in parser._action_groups
        if g._group_actions
    }


def section_fields():
    return [(name, f) for name, cls in SECTIONS.items() for f in dataclasses.fields(cls)]


def test_run_config_is_the_sections_fields_in_order():
    assert [f.name for f in dataclasses.fields(RunConfig)] == [f.name for _, f in section_fields()]


@pytest.mark.parametrize("command", ["train", "tour"])
def test_every_field_is_an_option_in_its_sections_group_and_no_option_lacks_a_field(command):
    expected: dict[str, list[str]] = {}
    for name, f in section_fields():
        if f.metadata.get("option", True) and not (command == "tour" and f.metadata.get("train_only")):
            expected.setdefault(name, []).append(flag_of(f))
    groups = options_by_group(subparser(command))
    own = [flag for title, flags in groups.items() if title not in SECTIONS for flag in flags]
    assert {t: f for t, f in groups.items() if t in SECTIONS} == expected
    assert set(own) == (TOUR_OWN if command == "tour" else set())


def test_every_field_says_what_it_is_for():
    for _, f in section_fields():
        text = f.metadata.get("help") or f.metadata.get("note")
        assert text and len(text) > 10, f"{f.name}: give it help= (shown in --help) or note="


def test_only_eval_every_epoch_is_not_an_option():
    assert [f.name for _, f in section_fields() if not f.metadata.get("option", True)] == ["eval_every_epoch"]


def test_choices_and_help_come_from_the_field():
    actions = {a.dest: a for a in subparser("train")._actions}
    for _, f in section_fields():
        if not f.metadata.get("option", True):
            continue
        action = actions[f.name]
        assert action.help == f.metadata.get("help"), f.name
        if "choices" in f.metadata and f.metadata.get("check") != "validate":
            assert tuple(action.choices) == f.metadata["choices"], f.name
        else:
            assert action.choices is None, f.name


def test_tour_help_adds_the_tours_words():
    tour = {a.dest: a.help for a in subparser("tour")._actions}
    train = {a.dest: a.help for a in subparser("train")._actions}
    assert tour["experts"] == train["experts"] + "; the tour then shows serial, dp and each dp x ep layout"
    assert tour["alltoall"] == train["alltoall"] + "; the tour's dp x ep layouts use it"


def test_no_options_give_the_default_config():
    assert config_from_args(build_parser().parse_args(["train"])) == RunConfig()
    assert DEFAULT_LAYERS["digits"] == RunConfig().layers


def other_value(f, default):
    """A valid value of the field's type that is not its default, and how to write it on the command line."""
    kind = f.type.removesuffix(" | None")
    if kind == "bool":
        return (not default), []
    if "choices" in f.metadata:
        value = [c for c in f.metadata["choices"] if c != default][-1]
        value = "mnist" if f.name == "dataset" else value  # mnist has default layers
    elif kind == "int":
        value = (default or 0) + 3
    elif kind == "float":
        value = (default or 1.0) * 0.5 + 0.125
    elif kind == "list[int]":
        value = [7, 5, 3]
    else:
        value = "some-" + f.name
    text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
    return value, [text]


def test_every_option_reaches_its_own_field():
    """Change one option at a time: exactly that field of RunConfig changes, to the value given."""
    base = RunConfig()
    for _, f in section_fields():
        if not f.metadata.get("option", True):
            continue
        value, words = other_value(f, getattr(base, f.name))
        cfg = config_from_args(build_parser().parse_args(["train", flag_of(f), *words]))
        changed = {g.name for g in dataclasses.fields(cfg) if getattr(cfg, g.name) != getattr(base, g.name)}
        if f.name == "dataset":  # the dataset also picks the default --layers
            changed.discard("layers")
        if f.name == "arch" and value == "gpt":  # no --layers, and its default data is the text
            changed -= {"layers", "dataset"}
        assert changed == {f.name}, f.name
        assert getattr(cfg, f.name) == value, f.name


def test_tour_options_keep_the_defaults_of_what_it_does_not_offer():
    args = build_parser().parse_args(["tour"])
    cfg = config_from_args(args)
    for _, f in section_fields():
        if f.metadata.get("train_only"):
            assert getattr(cfg, f.name) == getattr(RunConfig(), f.name), f.name


def test_a_section_view_holds_the_configs_values():
    cfg = RunConfig(dp=2, tp=2, experts=4, lr=0.5)
    assert cfg.layout.dp == 2 and cfg.layout.tp == 2 and cfg.model.experts == 4
    assert cfg.optimisation.lr == 0.5
    assert dataclasses.asdict(cfg.layout) == {
        f.name: getattr(cfg, f.name) for f in dataclasses.fields(SECTIONS["layout"])
    }
