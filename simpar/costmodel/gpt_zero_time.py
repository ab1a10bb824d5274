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

Chunks are np.array_split's (collectives.chunk): with every unit divisible by dp the ranks are
symmetric and every ring runs as its closed form says; the step ends with the slowest rank. When dp
does not divide a unit, chunks differ by one element, the real rings' rounds wait on their neighbours'
larger chunks and the ranks drift apart: this form is then off by ~1e-4 (dp 3, ZeRO-2, h 16), not exact.
"""

from __future__ import annotations

from .chunktime import collective_gamma, seconds
from .collectives import chunk, ring_allgather, ring_reduce_scatter, to_bytes
from .gpt_time import clock_rates, optimizer_seconds, unit_seconds
from .spec import split


def zero_step_seconds(cfg, p: int, sizes: list[int], hw, precision: str, bpe: int) -> dict:
    """{step_s, compute_s, comm_s} of one --zero step on p data-parallel ranks (module docstring);
    bpe: bytes of the parameters, gradients and activations alike (2 under mixed precision)."""
    from .hardware import group_link

    stage, P = cfg.zero, sum(sizes)
    rate, stream, overhead = clock_rates(hw, precision, min(p, hw.devices_per_node))
    link, gamma, nvls = group_link(hw, "dp", p, 1, 1), collective_gamma(hw), cfg.collectives == "auto"

    def ring(cost) -> float:  # ZeRO's collectives are always the ring (zero.py)
        return seconds(to_bytes(cost, bpe), link, gamma, True, nvls) if cost.messages else 0.0

    ends, computes, comms = [], [], []
    for d in range(p):
        gather = [ring(ring_allgather(n, p, d)) for n in sizes]
        scatter = [ring(ring_reduce_scatter(n, p, d)) for n in sizes]
        compute = comm = 0.0
        micro = split(cfg.batch, cfg.grad_accum)
        for k, k_rows in enumerate(micro):
            fwd, bwd, loss = unit_seconds(
                cfg, chunk(k_rows, p, d) * cfg.seq_len, sizes, bpe, rate, stream, overhead
            )
            compute += sum(fwd) + loss + sum(bwd)
            if stage == 3:  # gathered for forward, again for backward, reduce-scattered after it
                comm += 2 * sum(gather) + sum(scatter)
            elif stage == 2 and k == len(micro) - 1:  # each unit's gradient as its backward ends
                comm += sum(scatter)
        if stage == 1:
            comm += ring(ring_reduce_scatter(P, p, d)) + ring(ring_allgather(P, p, d))
            compute += optimizer_seconds(cfg, chunk(P, p, d), bpe, stream)
        else:
            compute += optimizer_seconds(cfg, sum(chunk(n, p, d) for n in sizes), bpe, stream)
            comm += sum(gather) if stage == 2 else 0.0
        ends.append(compute + comm)
        computes.append(compute)
        comms.append(comm)
    return {"step_s": max(ends), "compute_s": max(computes), "comm_s": max(comms)}
