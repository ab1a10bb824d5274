"""`simpar plot`: compare metrics files, or draw a pipeline timeline from a trace.

python -m simpar plot run1.json run2.json -o compare.png [--scaling scaling.png]
python -m simpar plot --timeline trace.json -o timeline.png [--schedule 1f1b --stages 4 --microbatches 8]
"""

from __future__ import annotations

import os

from ..config import SimparError
from ..files import output_problem
from ..report.plots import _save, compare_figure, load_metrics
from ..report.scaling import comm_scaling
from ..report.timeline import plot_timeline
from .base import Parser


def plot_main(argv: list[str]) -> int:
    """`simpar plot A.json B.json ... -o compare.png` | `simpar plot --timeline trace.json -o t.png`."""
    if "--timeline" in argv:
        return timeline_main(argv)
    p = Parser(
        prog="simpar plot",
        description="Compare metrics files: traffic and memory per layout.",
        epilog="Pipeline timeline instead: simpar plot --timeline trace.json -o timeline.png "
        "(trace.json from `simpar train --trace`).",
    )
    p.add_argument("metrics", nargs="+", help="metrics JSON files (simpar train --metrics-out)")
    p.add_argument("-o", "--out", default="compare.png")
    p.add_argument("--scaling", default=None, help="also write the scaling plot here")
    args = p.parse_args(argv)
    results = []
    for path in args.metrics:
        m = load_metrics(path)
        name = m.get("layout") or os.path.splitext(os.path.basename(path))[0]
        results.append((name if name not in [n for n, _ in results] else f"{name} ({path})", m))
    inputs = [("the metrics file", path) for path in args.metrics]
    _check_outputs({"-o": args.out, "--scaling": args.scaling}, inputs)
    _save(compare_figure(results), args.out)
    print(f"wrote {args.out}")
    if args.scaling:
        comm_scaling(args.scaling, results)
        print(f"wrote {args.scaling}")
    return 0


def timeline_main(argv: list[str]) -> int:
    """`simpar plot --timeline trace.json -o timeline.png [--schedule 1f1b --stages 4 --microbatches 8]`."""
    p = Parser(prog="simpar plot --timeline", description="Draw a --trace file as a pipeline timeline.")
    p.add_argument("trace", nargs="?", help="the Chrome trace JSON written by `simpar train --trace`")
    p.add_argument("--timeline", dest="trace_opt", help="same as the positional trace path")
    p.add_argument("-o", "--out", default="timeline.png")
    p.add_argument("--schedule", default=None, help="naive | gpipe | 1f1b (default: from the trace)")
    p.add_argument("--stages", type=int, default=None)
    p.add_argument("--microbatches", type=int, default=None)
    p.add_argument("--step", type=int, default=None, help="which step to draw (default: the last)")
    args = p.parse_args(argv)
    path = args.trace_opt or args.trace
    if not path:
        p.error("give the trace file: simpar plot --timeline trace.json -o timeline.png")
    _check_outputs({"-o": args.out}, [("the trace", path)])
    result = plot_timeline(path, args.out, args.schedule, args.stages, args.microbatches, args.step)
    ideal = f", ideal {result['ideal_bubble']:.1%}" if result["ideal_bubble"] is not None else ""
    print(f"wrote {args.out}: measured bubble {result['measured_bubble']:.1%}{ideal}")
    return 0


def _check_outputs(outputs: dict, inputs=()) -> None:
    """Before drawing anything: a bad -o path (or one naming an input) is one line, not a traceback."""
    problem = output_problem(outputs, inputs)
    if problem:
        raise SimparError(problem)
