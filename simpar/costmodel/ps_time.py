"""The parameter server's gradient buckets in time, rank by rank: where one bucket queues behind the last.

collectives.ps_allreduce prices ONE all-reduce on its critical path -- every worker's push through the
server's one incoming port, the server's p-1 sums, its p-1 replies through its one outgoing port:
2 alpha + 2 (p-1) W + (p-1) n gamma (W = one message's bytes on the wire, n its bytes). The last
worker gets its reply then; the others earlier (worker w after w replies), and the server is done
alpha before the last reply lands. So when several buckets follow one another, the next bucket's
pushes leave early workers -- and the server starts summing them -- before the last worker is done:
summing each bucket's critical path (gpt_time.py's rule for the other algorithms) overstates the step.

Here the simulated clock's rules (runtime/simclock.py: one outgoing and one incoming port per rank and
group, each collective on the rank's stream after the previous one; collectives/ps.py's rounds) are
written down again, nothing imported from them. Rank w of p (0 the server) may start bucket k at
s_w = max(its start time, its last bucket's end):
    worker w   pushes at s_w; its bytes arrive at the server one message after another, in the order
               they left:  D = fold over sorted s_w of max(s_w + W, D + W);  all in at D + alpha
    server     t = max(s_0, D + alpha) + (p-1) n gamma; reply i leaves at t + (i-1) W
    ends       server t + (p-1) W;  worker w max(s_w + W, t + w W + alpha)
With p = 2 this is the critical path again: the one worker is the last.
"""

from __future__ import annotations


def ps_bucket_ends(starts: list[list[float]], bucket_bytes: list[float], link, gamma: float) -> list[float]:
    """Each rank's end of its last bucket. `starts[w][k]`: when rank w of the group (0: the server)
    may start bucket k; `bucket_bytes[k]`: the bucket's bytes; `link`: the group's (alpha, bw);
    `gamma`: seconds per byte a sum costs inside a collective (0 on GPUs)."""
    p = len(starts)
    ends = [0.0] * p
    for k, nbytes in enumerate(bucket_bytes):
        wire = nbytes / link.bw
        s = [max(starts[w][k], ends[w]) for w in range(p)]
        data_end = float("-inf")
        for sent in sorted(s[1:]):  # the pushes share the server's incoming port
            data_end = max(sent + wire, data_end + wire)
        t = max(s[0], data_end + link.alpha) + (p - 1) * nbytes * gamma
        ends = [t + (p - 1) * wire] + [max(s[w] + wire, t + w * wire + link.alpha) for w in range(1, p)]
    return ends
