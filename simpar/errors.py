"""SimparError, the one kind of error a user can fix, and `require`, how every option check raises it.

Its own module so that the rule modules (config.py and the groups it calls: config_pipeline.py,
config_moe.py) can all raise it without importing each other in a circle. Everyone else imports
SimparError from config.py, as before.
"""

from __future__ import annotations


class SimparError(Exception):
    """A problem the user can fix; reported as one line `simpar: error: ...`, exit status 2."""


def require(ok: bool, message: str) -> None:
    """Raise SimparError(message) unless ok: one line per rule, the message naming the option."""
    if not ok:
        raise SimparError(message)
