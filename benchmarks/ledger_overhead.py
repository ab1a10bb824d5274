"""What the traffic ledger costs: its bookkeeping time as a fraction of a training step.

    python benchmarks/ledger_overhead.py [--ranks 2] [--layers 784,1024,1024,10] [--batch 512]

Every message simpar sends is booked twice (sender and receiver side) in Python dictionaries.
This script times one booking (median of many), runs a real data-parallel training job to get the
messages per step and the median step time, and prints

    overhead = bookings per step x time per booking / step time

for the busiest rank. The target is < 3% of the step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from simpar.run.launch import run  # noqa: E402
from simpar.runtime.comm import Ledger  # noqa: E402


def booking_cost(n: int = 20000, repeats: int = 7) -> float:
    """Seconds for one book_send + one book_recv (what one message costs the two ranks together)."""
    ledger = Ledger()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for i in range(n):
            ledger.book_send("model", "grad-allreduce", i & 3, 4096)
            ledger.book_recv("model", "grad-allreduce", i & 3, 4096)
        times.append((time.perf_counter() - t) / n)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--layers", default="784,1024,1024,10")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--bucket-mb", default="1")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    per_message = booking_cost()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "m.json")
        res = run(
            args.ranks,
            [
                "train",
                "--dataset",
                "synthetic",
                "--samples",
                str(4 * args.batch + 100),
                "--layers",
                args.layers,
                "--batch",
                str(args.batch),
                "--steps",
                str(args.steps),
                "--bucket-mb",
                args.bucket_mb,
                "--quiet",
                "--metrics-out",
                out,
            ],
        )
        if res.returncode:
            raise SystemExit(res.stderr)
        with open(out) as f:
            m = json.load(f)
    step = m["time"]["step_s_median"]
    messages = max(sum(r["messages"].values()) for r in m["comm"]["ranks"]) / m["steps"]
    # per message it sends, a rank books one send and (about) one receive: one `per_message`
    overhead = messages * per_message / step
    result = {
        "booking_us": per_message * 1e6 / 2,
        "messages_per_step": messages,
        "step_ms": step * 1e3,
        "overhead_fraction": overhead,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"one ledger booking: {per_message * 1e6 / 2:.2f} us; busiest rank sends {messages:.0f} messages "
            f"per step (and books as many receives); median step {step * 1e3:.2f} ms "
            f"-> ledger overhead {overhead:.3%} of the step (target < 3%)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
