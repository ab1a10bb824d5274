"""What `simpar plan --experts` prints: the mixture-of-experts model's parameters in all and per rank,
the expert capacity, the all-to-all and gradient traffic of the busiest rank, memory and step time.

The numbers come from the cost model (simpar/costmodel/moe.py); this module only lays them out, as
plan.py does for the dense layouts. The command line is simpar/cli/plan.py.
"""

from __future__ import annotations

from ..units import fmt_si as fmt_bytes
from ..units import fmt_time
from .plan import hardware_note


def params_in_words(n: int) -> str:
    return f"{n / 1e9:,.2f} B" if n >= 1e9 else f"{n / 1e6:,.3g} M" if n >= 1e6 else f"{n:,}"


def moe_params_line(spec, par: dict, from_params: bool = False) -> str:
    """How many parameters the MoE model has in all and on one rank. With --experts every hidden layer
    is E experts (Shazeer et al. 2017), so the model is about E times the dense model --params sized
    (`from_params`: say so, with that dense model's size)."""
    dense = sum(a * b + b for a, b in zip(spec.widths[:-1], spec.widths[1:]))
    total = par["non_expert"] + par["experts_total"]
    per_rank = par["non_expert"] + par["experts_per_rank"]
    return (
        f"parameters: {params_in_words(total)} in all = {params_in_words(par['non_expert'])} non-expert "
        f"(first and last layer, routers) + {spec.experts} experts x "
        f"{params_in_words(par['experts_total'] // spec.experts)} (one Linear in each of the "
        f"{spec.n_layers - 2} MoE layers); per rank "
        f"{params_in_words(per_rank)} (non-expert + {spec.experts // spec.ep} experts)"
        + (
            f"; --params sized the dense MLP ({params_in_words(dense)}) before its hidden layers "
            f"became {spec.experts} experts each"
            if from_params
            else ""
        )
    )


def format_moe_plan(spec, pred: dict, hw, from_params: bool = False) -> str:
    """What `plan --experts` prints: the parameters in all and per rank, capacity, the all-to-all per
    rank (formula and numbers), the gradient all-reduces, memory and the step time of the busiest rank."""
    D, P, E, K, B = spec.dp, spec.ep, spec.experts, spec.top_k, spec.batch
    N = B // spec.grad_accum + (1 if B % spec.grad_accum else 0)  # the first (largest) micro-step
    busiest = max(pred["comm"]["ranks"], key=lambda r: r["sent"]["activation"])
    par, link = pred["params"], pred["link"]
    shown = spec.widths if len(spec.widths) <= 8 else spec.widths[:3] + ["..."] + spec.widths[-2:]
    lines = [
        f"simpar plan (mixture of experts): MLP {'-'.join(map(str, shown))}, {spec.n_layers - 2} MoE "
        f"layer(s) of {E} experts, top-{K}, global batch {B}, dp {D} x ep {P}, {spec.precision} "
        f"{spec.optimizer}, hardware {hw.name}",
        *hardware_note(hw),
        moe_params_line(spec, par, from_params),
        f"capacity per expert: ceil(C*K*B/E) = ceil({spec.capacity_factor:g}*{K}*{B}/{E}) = "
        f"{pred['capacity']} tokens"
        if spec.grad_accum == 1
        else f"capacity per expert and micro-step (--grad-accum {spec.grad_accum}: N = {N} of the {B} rows "
        f"routed together): ceil(C*K*N/E) = ceil({spec.capacity_factor:g}*{K}*{N}/{E}) = "
        f"{pred['capacity']} tokens",
        f"routing: {pred['routing']} (an imbalance u above C is capped at C: the expert drops the rest)",
        "all-to-all per MoE layer per rank, balanced: 4 x (P-1)/P x (B/D) x K x width x bytes "
        f"(dispatch, combine and their gradients); the busiest rank (rank {busiest['rank']}) per step:"
        if spec.alltoall == "pairwise"
        else f"all-to-all by Bruck's algorithm: ceil(log2 P) = {(P - 1).bit_length()} messages each, a "
        "piece forwarded once per set bit of its relative destination (balanced, P a power of two: "
        "(P/2) log2 P pieces of (B/D) x K/P rows, against P-1 pairwise); the busiest rank "
        f"(rank {busiest['rank']}) per step:",
    ]
    for op in ("ep-dispatch", "ep-combine", "ep-combine-grad", "ep-dispatch-grad"):
        entry = busiest["by_op"].get(f"activation/{op}")
        if entry:
            lines.append(f"  {op:<22} {fmt_bytes(entry['sent']):>10} in {entry['messages']} messages")
    for op, what in (
        ("grad-allreduce", f"{par['non_expert']:,} non-expert parameters over {D} ranks"),
        ("expert-grad-allreduce", f"{par['experts_per_rank']:,} expert parameters over {D // P} ranks"),
    ):
        entry = busiest["by_op"].get(f"model/{op}")
        if entry:
            lines.append(f"  {op:<22} {fmt_bytes(entry['sent']):>10} ({what})")
    mem = pred["memory"]["ranks"][0]
    lines.append(
        f"memory per rank: params {fmt_bytes(mem['params'])}, grads {fmt_bytes(mem['grads'])}, optimizer "
        f"{fmt_bytes(mem['optimizer'])}; its experts {fmt_bytes(par['experts_per_rank'] * spec.prec.param)}"
        f" = 1/{P} of {fmt_bytes(par['experts_total'] * spec.prec.param)}; activations kept for "
        f"backward {fmt_bytes(mem['activations_peak'])}"
    )
    t = pred["time"]
    where = f" on {link['name']}" if link else ""
    lines.append(
        f"step time: {fmt_time(t['step_s'])} = compute {fmt_time(t['compute_s'])} + communication "
        f"{fmt_time(t['comm_s'])}{where} (blocking, nothing overlapped)"
    )
    return "\n".join(lines)
