"""`simpar validate`: the cost model against published measurements (validation/), or your own.

    python -m simpar validate                       # every point of validation/*.csv, a table
    python -m simpar validate --json -o docs/img/validation.png
    python -m simpar validate --data my-points.csv  # your measurements, in the same columns
    python -m simpar validate --data all_reduce.log --hardware my.json   # an nccl-tests log

Exit status 0 when every point is within its tolerance, 1 (with a summary line) when one is not, 2 on
bad input. What each point is and how it is predicted: report/validation.py; the data: validation/README.md.
"""

from __future__ import annotations

import json
import sys

from ..config import SimparError
from ..files import output_problem
from ..report import nccltests, validation
from .base import Parser


def load_data(paths: list[str], args) -> list[dict]:
    """Validation points from CSV files or nccl-tests logs (told apart by their content)."""
    points = []
    for path in paths:
        text = validation.read_text(path, "validation data")
        if nccltests.looks_like_nccl_tests(text) and not text.lstrip().startswith("id,"):
            points += nccltests.parse(text, path, args.op, args.gpus, args.nodes, profile=args.hardware or "")
        else:
            points += validation.read_points(path)
    for p in points:
        if not p.get("profile") and not args.hardware:
            raise SimparError(f"point {p['id']}: no profile; pass --hardware (a preset or FILE.json)")
    return points


def validate_main(argv: list[str]) -> int:
    p = Parser(prog="simpar validate", description="Hold the cost model to published measurements.")
    p.add_argument(
        "--data",
        nargs="+",
        default=None,
        help="CSV files in validation/'s columns, or nccl-tests "
        "logs (all_reduce_perf ... output); default: validation/*.csv",
    )
    p.add_argument("--hardware", default=None, help="price every point on this profile (preset or FILE.json)")
    p.add_argument(
        "--op", default=None, choices=validation.COLLECTIVES, help="an nccl-tests log's collective"
    )
    p.add_argument(
        "--gpus", type=int, default=None, help="an nccl-tests log's GPU count (default: its Rank lines)"
    )
    p.add_argument(
        "--nodes", type=int, default=None, help="an nccl-tests log's node count (default: its hosts)"
    )
    p.add_argument("--json", action="store_true", help="print the rows and the summary as JSON")
    p.add_argument("-o", "--out", default=None, help="also draw published vs predicted (log-log) to this PNG")
    args = p.parse_args(argv)
    if args.out:
        problem = output_problem({"-o": args.out})
        if problem:
            raise SimparError(problem)
    files = args.data or validation.default_files()
    if not files:
        raise SimparError("no validation data: validation/*.csv not found; pass --data FILE")
    rows = validation.evaluate(load_data(files, args), args.hardware)
    summary = validation.summary(rows)
    if args.json:
        print(json.dumps({"rows": rows, "summary": summary}, indent=1, default=str))
    else:
        print(validation.table(rows))
    if args.out:
        from ..report.validation_plot import draw

        draw(rows, args.out)
        print(f"wrote {args.out}", file=sys.stderr if args.json else sys.stdout)
    if summary["failed"]:
        print(
            f"simpar validate: {len(summary['failed'])} of {len(rows)} points out of tolerance: "
            f"{', '.join(summary['failed'][:8])}",
            file=sys.stderr,
        )
        return 1
    return 0
