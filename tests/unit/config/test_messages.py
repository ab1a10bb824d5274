"""Every message of `validate`, word for word, for an input that triggers it -- and every rule of the
config package is triggered by one of message_cases.py's inputs (a rule added without a case fails the test).

The messages are a contract (the README, the lessons, tests/mpi/test_errors.py end to end on real ranks);
here they are checked in-process, on RunConfig directly, so that the names the parser would already
refuse (an unknown --dataset, ...) are checked too: code builds RunConfigs without the parser.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from simpar.cli import build_parser
from simpar.cli.options import config_from_args
from simpar.config import RunConfig, SimparError, validate
from tests.paths import ROOT
from tests.unit.config.message_cases import CASES, PRECEDENCE

CONFIG = ROOT / "simpar" / "config"


def message(fields: dict, world: int) -> str:
    with pytest.raises(SimparError) as caught:
        validate(RunConfig(**fields), world)
    return str(caught.value)


@pytest.mark.parametrize("fields, world, expected", CASES)
def test_every_message_word_for_word(fields, world, expected):
    assert message(fields, world) == expected


@pytest.mark.parametrize("fields, world, start", PRECEDENCE)
def test_the_first_rule_in_validates_order_wins(fields, world, start):
    assert message(fields, world).startswith(start)


def rule_sites() -> set[tuple[str, int, int]]:
    """Every place in simpar/config that can refuse a configuration: require(...), one_of(...) and
    raise SimparError(...), as (file, first line, last line); one_of's own require is its callers'."""
    sites = set()
    for path in CONFIG.glob("*.py"):
        tree = ast.parse(path.read_text())
        inside_one_of = {
            id(n)
            for f in ast.walk(tree)
            if isinstance(f, ast.FunctionDef) and f.name == "one_of"
            for n in ast.walk(f)
        }
        for node in ast.walk(tree):
            call = isinstance(node, ast.Call) and getattr(node.func, "id", None) in (
                "require",
                "_require",
                "one_of",
            )
            if (call or isinstance(node, ast.Raise)) and id(node) not in inside_one_of:
                sites.add((path.name, node.lineno, node.end_lineno))
    return sites


def site_of(error: SimparError) -> tuple[str, int]:
    """The line of simpar/config that refused: the innermost frame there, one_of's caller for one_of."""
    frames = []
    tb = error.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if Path(frame.f_code.co_filename).parent == CONFIG and frame.f_code.co_name != "one_of":
            frames.append((Path(frame.f_code.co_filename).name, tb.tb_lineno))
        tb = tb.tb_next
    return frames[-1]


def uncovered(cases) -> list[tuple[str, int, int]]:
    """The rule sites that none of `cases` triggers."""
    hit = set()
    for fields, world, _ in cases:
        try:
            validate(RunConfig(**fields), world)
        except SimparError as exc:
            hit.add(site_of(exc))
    sites = rule_sites()
    return sorted(s for s in sites if not any(f == s[0] and s[1] <= line <= s[2] for f, line in hit))


def test_every_rule_of_the_config_has_a_case():
    # schedule_problem's messages are returned to pipeline_rules' one require; they have cases above.
    missing = uncovered(CASES)
    assert missing == [], f"rules without a case in CASES (file, first line, last line): {missing}"


def test_the_checker_sees_a_rule_without_a_case():
    """The completeness check itself can fail: leave out the --zero 4 case and it names that rule."""
    missing = uncovered([case for case in CASES if case[0] != dict(zero=4)])
    assert len(missing) == 1
    name, first, _ = missing[0]
    assert "--zero must be 0, 1, 2 or 3" in (CONFIG / name).read_text().splitlines()[first - 1]


def test_the_parser_messages_of_train():
    """What the command line refuses before validate: argparse's own words, and --layers for synthetic."""
    cases = {
        (
            "--dataset",
            "synthetic",
        ): "--dataset synthetic needs --layers (input width first, number of classes last)",
        ("--layers", "64,,10"): "argument --layers: expected comma-separated integers, got '64,,10'",
        (
            "--dtype",
            "float16",
        ): "argument --dtype: invalid choice: 'float16' (choose from 'float32', 'float64')",
        ("--batch", "x"): "argument --batch: invalid int value: 'x'",
        ("--lr", "fast"): "argument --lr: invalid float value: 'fast'",
    }
    for argv, expected in cases.items():
        with pytest.raises(SimparError) as caught:
            config_from_args(build_parser().parse_args(["train", *argv]))
        assert str(caught.value) == expected
