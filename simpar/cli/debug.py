"""`simpar debug DIR`: what the flight recorders say (report/debug.py does the reading).

python -m simpar debug simpar-flight/
"""

from __future__ import annotations

from ..report.debug import analyze
from .base import Parser


def debug_main(argv: list[str]) -> int:
    p = Parser(prog="simpar debug", description="Analyse the watchdog's flight-recorder dumps.")
    p.add_argument(
        "folder", nargs="?", default="simpar-flight", help="the dumps' folder (default simpar-flight)"
    )
    args = p.parse_args(argv)
    print(analyze(args.folder))
    return 0
