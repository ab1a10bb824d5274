"""The lessons' exercise check (simpar/report/predict.py): no prediction, no answer."""

from __future__ import annotations

import io
from contextlib import redirect_stdout

import pytest

from simpar.report.predict import ASK, reveal


def said(*args, **kwargs) -> tuple[bool, str]:
    out = io.StringIO()
    with redirect_stdout(out):
        shown = reveal(*args, **kwargs)
    return shown, out.getvalue()


def test_no_prediction_asks_for_one_and_shows_nothing_measured():
    shown, text = said(None, 16_640, unit="B per step")
    assert shown is False
    assert text.strip() == ASK and "16" not in text


@pytest.mark.parametrize(
    "prediction, measured, rel, verdict",
    [
        (16_000, 16_640, 0.05, "right"),  # 3.8 % off
        (15_000, 16_640, 0.05, "not quite"),  # 9.9 % off
        (27, 27, 0, "right"),
        (26, 27, 0, "not quite"),
        ({"dp=3", "pp=3"}, {"pp=3", "dp=3"}, 0.05, "right"),
        (False, True, 0.05, "not quite"),  # a bool is compared as a bool, not as the number 0 or 1
        ("larger", "smaller", 0.05, "not quite"),
    ],
)
def test_a_prediction_is_compared_and_the_answer_may_follow(prediction, measured, rel, verdict):
    shown, text = said(prediction, measured, rel=rel)
    assert shown is True
    assert verdict in text and ASK not in text
