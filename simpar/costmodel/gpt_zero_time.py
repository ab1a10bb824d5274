"""The step time of `simpar train --arch gpt --zero 1|2|3` in closed form, as the simulated clock charges
it: gpt_time.py's units, loss and optimizer, with ZeRO's collectives where parallel/zero.py runs them
(written again here; nothing imported from parallel/).

ZeRO's collectives are blocking ring collectives on the dp group (Rajbhandari et al. 2020, sec. 7:
reduce-scatter the gradients, all-gather the parameters), so each one simply adds its seconds to the
rank's clock where it runs:

  stage 1  the micro-steps compute as plain data parallelism without traffic; then one reduce-scatter
           of the whole flat gradient (P elements), the optimizer on this rank's chunk of P, one
           all-gather of the whole flat parameter vector
  stage 2  each unit's backward in the LAST micro-step is followed by the reduce-scatter of that
           unit's gradient; the optimizer on this rank's chunks of every unit (S_r elements); then
           one all-gather per unit, in unit order
  stage 3  every micro-step gathers each unit before its forward and again before its backward, and
           reduce-scatters its gradient right after the backward; the optimizer on S_r, no gather back

Chunks are np.array_split's (collectives.chunk): when dp does not divide a unit, the first ranks' chunks
are one element longer and the ranks' clocks drift apart, so the p ranks are followed together through
every ring round (ring_time.ring_ends, shared with zero_time.py). The step ends with the slowest rank.
"""

from __future__ import annotations

from .chunktime import collective_gamma
from .collectives import chunk
from .gpt_time import clock_rates, optimizer_seconds, unit_seconds
from .ring_time import ring_ends
from .spec import split


def zero_step_seconds(cfg, p: int, sizes: list[int], hw, precision: str, bpe: int) -> dict:
    """{step_s, compute_s, comm_s} of one --zero step on p data-parallel ranks (module docstring);
    bpe: bytes of the parameters, gradients and activations alike (2 under mixed precision)."""
    from .hardware import group_link

    stage, P = cfg.zero, sum(sizes)
    rate, stream, overhead = clock_rates(hw, precision, min(p, hw.devices_per_node))
    link, gamma = group_link(hw, "dp", p, 1, 1), collective_gamma(hw)
    clock, link_free, compute = [0.0] * p, [0.0] * p, [0.0] * p

    def work(seconds: list[float]) -> None:  # each rank's own compute
        for r in range(p):
            clock[r] += seconds[r]
            compute[r] += seconds[r]

    def ring(kind: str, n: int) -> None:  # ZeRO's collectives are always the ring (zero.py), blocking
        if p > 1:
            clock[:] = ring_ends(kind, n, bpe, clock, link_free, link, gamma)

    micro = split(cfg.batch, cfg.grad_accum)
    for k, k_rows in enumerate(micro):
        units = [
            unit_seconds(cfg, chunk(k_rows, p, d) * cfg.seq_len, sizes, bpe, rate, stream, overhead)
            for d in range(p)
        ]
        for i, n in enumerate(sizes):
            if stage == 3:  # gathered before its forward
                ring("all-gather", n)
            work([fwd[i] for fwd, _, _ in units])
        work([loss for _, _, loss in units])
        for i in reversed(range(len(sizes))):
            if stage == 3:  # gathered again for its backward
                ring("all-gather", sizes[i])
            work([bwd[i] for _, bwd, _ in units])
            if stage == 3 or (stage == 2 and k == len(micro) - 1):  # its gradient, as backward ends
                ring("reduce-scatter", sizes[i])
    if stage == 1:
        ring("reduce-scatter", P)
        work([optimizer_seconds(cfg, chunk(P, p, d), bpe, stream) for d in range(p)])
        ring("all-gather", P)
    else:
        work([optimizer_seconds(cfg, sum(chunk(n, p, d) for n in sizes), bpe, stream) for d in range(p)])
        for n in sizes if stage == 2 else ():
            ring("all-gather", n)
    return {
        "step_s": max(clock),
        "compute_s": max(compute),
        "comm_s": max(c - w for c, w in zip(clock, compute)),
    }
