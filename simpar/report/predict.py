"""Predict, then look: the check cell of every lesson exercise.

A learner writes a prediction in a cell above the check (``my_prediction = None`` until they do); the check
cell measures and calls :func:`reveal`. With no prediction yet (what "Run All" gives), it prints only a
request for one, so the answer is not shown before the learner has committed to a guess; with one, it
compares prediction and measurement and the cell goes on to print the worked answer.
"""

from __future__ import annotations

from numbers import Real

ASK = "write your prediction above (my_prediction = ...), then run this cell again"


def _agrees(prediction, measured, rel: float) -> bool:
    if isinstance(prediction, Real) and isinstance(measured, Real) and not isinstance(prediction, bool):
        return abs(prediction - measured) <= rel * max(abs(measured), 1e-300)
    return prediction == measured


def reveal(prediction, measured, *, unit: str = "", rel: float = 0.05) -> bool:
    """Print how the prediction compares with the measurement; False (and a request) when there is none.

    Numbers agree within ``rel`` (relative); anything else (a set, a string, a bool) must be equal."""
    if prediction is None:
        print(ASK)
        return False
    number = isinstance(measured, Real) and not isinstance(measured, bool)
    shown = f"{measured:,.4g}" if number else repr(measured)
    verdict = "right" if _agrees(prediction, measured, rel) else "not quite: read the answer below"
    print(f"your prediction {prediction!r}, measured {shown} {unit}".rstrip() + f": {verdict}")
    return True
