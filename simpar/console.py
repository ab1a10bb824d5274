"""The terminal: the one progress bar, the one error line, and the one line a Ctrl-C leaves.

Every line that ends a run goes through `say`, which first clears rank 0's progress bar: tqdm draws
it with carriage returns and no newline, so a line printed after it would start in the middle of
the bar (`...6/20 [..loss=1.8475]simpar: error: ...`). One place, so no error path can forget.
"""

from __future__ import annotations

import signal
import sys
import time

_bar = None  # rank 0's tqdm bar while one is drawn


def show_bar(bar) -> None:
    global _bar
    _bar = bar


def clear_bar() -> None:
    """Erase the bar (tqdm's close with leave=False clears its line); safe to call twice."""
    global _bar
    bar, _bar = _bar, None
    if bar is not None:
        try:
            bar.close()
        except Exception:  # noqa: BLE001  a bar half torn down by an interrupt: nothing to erase
            pass


def say(line: str, bar_elsewhere: bool = False) -> None:
    """Print one final line on stderr, on a line of its own. `bar_elsewhere`: another rank (rank 0)
    may have its bar on the shared terminal, which this process cannot erase: start a new line."""
    start = "\n" if bar_elsewhere and _bar is None else ""
    clear_bar()
    print(f"{start}{line}", file=sys.stderr, flush=True)


def safe_streams() -> None:
    """A path or name the terminal cannot encode (PYTHONIOENCODING=ascii, a C locale) is written with
    backslash escapes instead of ending the run with UnicodeEncodeError."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


def interrupted(step: int | None, checkpoint: str | None, bar_elsewhere: bool = False) -> int:
    """Ctrl-C (SIGINT, which mpiexec forwards to every rank): one line from one rank, exit 130 on all.

    The ranks may be anywhere -- inside a collective, or between two -- so they cannot finish MPI
    together: the first to claim the report says where the run stood, then every rank leaves at once
    (MPI_Abort with 130, the shell's code for SIGINT), its own output silenced as in flight.fatal."""
    from . import job

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not interrupt the goodbye
    if job.claim_report():
        where = f" at step {step}" if step is not None else ""
        say(f"simpar: interrupted{where} (last checkpoint: {checkpoint or 'none'})", bar_elsewhere)
    else:  # the reporter's line must reach mpiexec before anyone's abort makes it kill the ranks
        clear_bar()
        time.sleep(0.5)
    job.leave(130)
