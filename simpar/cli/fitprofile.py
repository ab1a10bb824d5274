"""`simpar bench --fit-profile LOG... -o my.json`: a profile's links fitted to nccl-tests logs.

The fit itself: bench/fitprofile.py.

python -m simpar bench --fit-profile ag-1node.log ag-2nodes.log --hardware dgx-h100 -o my.json
python -m simpar validate --data ag-1node.log --hardware my.json      # and check it
"""

from __future__ import annotations

import os

from ..bench.fitprofile import fit_profile
from ..config import SimparError
from ..files import output_problem, write_json
from ..report import nccltests, validation
from .base import Parser


def fit_profile_main(argv: list[str]) -> int:
    p = Parser(prog="simpar bench --fit-profile", description="Fit a hardware profile to nccl-tests logs.")
    p.add_argument("--fit-profile", dest="logs", nargs="+", required=True, help="nccl-tests output files")
    p.add_argument("-o", "--out", required=True, help="the profile to write (load it with --hardware FILE)")
    p.add_argument("--hardware", default="dgx-h100", help="the profile to start from (its compute, memory)")
    p.add_argument("--op", default=None, choices=validation.COLLECTIVES, help="the logs' collective")
    p.add_argument("--gpus", type=int, default=None, help="GPUs in the logs (default: their Rank lines)")
    p.add_argument("--nodes", type=int, default=None, help="nodes in the logs (default: their host names)")
    if "-h" in argv or "--help" in argv:  # before --fit-profile's required LOG... is checked
        p.print_help()
        return 0
    args = p.parse_args(argv)
    problem = output_problem({"-o": args.out})
    if problem:
        raise SimparError(problem)
    points = []
    for path in args.logs:
        text = validation.read_text(path, "nccl-tests log")
        points += nccltests.parse(text, path, args.op, args.gpus, args.nodes, profile=args.hardware)
    name = os.path.splitext(os.path.basename(args.out))[0]
    profile = fit_profile(points, args.hardware, name, args.logs)
    write_json(args.out, profile)
    print(f"wrote {args.out}: {profile['description']}")
    return 0
