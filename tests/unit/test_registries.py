"""Every registry of names agrees across the command line, the code that runs and the cost model.

Collectives, all-to-alls, pipeline schedules, kernel backends and hardware presets: a name one side
lacks used to train a whole run and then fail in the post-run prediction (issue 21). The sets are
written out here as well, so that dropping a name from every side at once is noticed too.
"""

from __future__ import annotations

import argparse

import pytest

from simpar import registries
from simpar.costmodel import hardware

EXPECTED = {
    "collectives": {"ring", "rabenseifner", "tree", "ps", "mpi", "auto"},
    "all-to-alls": {"pairwise", "bruck"},
    "schedules": {"naive", "gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"},
    "kernels": {"numpy", "numba", "cuda"},
    "hardware": {"local", "dgx-h100", "h200", "dgx-a100", "ib-cluster", "ethernet-100g"},
}


def test_every_side_names_the_same_set():
    table = registries.registries()
    assert set(table) == set(EXPECTED)
    for kind, sides in table.items():
        for side, names in sides.items():
            assert names == EXPECTED[kind], (kind, side)
    assert registries.disagreements() == []
    registries.check()  # what run/setup.py does when it is imported


def test_a_name_one_side_lacks_is_reported_by_kind_and_side():
    table = registries.registries()
    table["collectives"]["cost model"].discard("tree")
    assert registries.disagreements(table) == ["collectives: cost model lacks tree"]


def test_the_hardware_option_offers_every_preset():
    from simpar.cli.train import add_run_arguments

    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    action = next(a for a in parser._actions if "--hardware" in a.option_strings)
    offered = {w.strip() for w in action.help.split(":", 1)[1].split("|")} - {"FILE.json"}
    assert offered == set(hardware.PRESETS) | {"local"} == EXPECTED["hardware"]


@pytest.mark.parametrize("name", sorted(EXPECTED["hardware"]))
def test_every_preset_loads(name):
    assert hardware.load(name).devices_per_node >= 1


def test_the_cost_model_refuses_a_schedule_it_does_not_know():
    from simpar.costmodel.order import stage_order

    with pytest.raises(ValueError):
        stage_order("zb-h3", 2, 4, 0)
