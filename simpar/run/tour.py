"""The tour: every layout `train` runs on the world size, on the same model and data, side by side.

    mpiexec -n 4 python -m mpi4py -m simpar            (or: ... -m simpar tour --quick)

Each layout runs on its own sub-communicator with a fresh ledger (the serial reference runs on
rank 0 alone while the others wait), and is checked against the serial run: the largest difference
of any step's loss must stay within the dtype's tolerance (float64 1e-10, float32 1e-4 relative).
Writes simpar-out/<layout>.json for each layout, then the comparison plots.

With --experts E the model is a mixture of experts, and the layouts are the ones `train` runs for it:
serial, dp n (every rank holds all E experts) and dp n x ep m for each m that divides n and E; the
table gains the all-to-all bytes per step and the tokens capacity dropped.
"""

from __future__ import annotations

import copy
import os
import time

from ..config import RunConfig, SimparError, validate
from ..costmodel import hardware
from ..files import write_json, write_trace
from ..report.metrics import alltoall_per_step, bytes_verdict
from ..runtime.comm import Communicator, Ledger
from ..units import fmt_bytes
from .oversubscribed import (
    gap_per_round_s,
    message_round_s,
    oversubscribed,
    oversubscription_note,
    wait_yielding,
)

# Mixed precision: a sharded layout sums the same half gradients in another order (ring chunks vs one
# float32 matmul rounded once), so each step's weights differ by a few units of roundoff u (2**-11 for
# float16, 2**-8 for bfloat16). Training amplifies such differences: after ~100 steps the trajectories
# are as different as two seeds' (150 float16 steps: losses up to 2x apart late in training, when
# they are ~0.02, yet the same accuracy). So the tour holds mixed layouts to the serial run's losses
# over the first MIXED_STEPS steps only (32 u) and to its final accuracy within MIXED_ACCURACY.
MIXED_STEPS, MIXED_ACCURACY = 10, 0.03
TOLERANCE = {"float64": 1e-10, "float32": 1e-4, "mixed-fp16": 32 * 2.0**-11, "mixed-bf16": 32 * 2.0**-8}


def layouts_for(world_size: int, cfg: RunConfig) -> list[tuple[str, dict]]:
    """(name, overrides) of every layout to show on this many ranks, the serial reference first.

    The candidates are the layouts of the README's tour (and, for --arch resmlp and gpt, each tensor-parallel
    one again with --sp; for --experts, dp n x ep m for every m > 1 dividing n); a candidate stays
    when config.validate accepts it on its ranks, so the tour offers exactly the layouts `train` would
    run with the same options (--arch, --precision, --layers, --experts, --batch, ...), and one rule
    set decides both: a dense model refuses --ep; a mixture of experts leaves out --zero (its own test:
    tests/mpi/parallel/test_gpt_moe_zero.py) and --pp (its micro-batches are capacity's routing
    groups: parallel/pipeline/expert_stage.py)."""
    n = world_size
    candidates = [("serial", dict(dp=1))]
    if n > 1:
        candidates.append((f"dp{n}", dict(dp=n)))
        candidates += [(f"dp{n}xep{m}", dict(dp=n, ep=m)) for m in range(2, n + 1) if n % m == 0]
        candidates += [(f"dp{n}-zero{stage}", dict(dp=n, zero=stage)) for stage in (1, 2, 3)]
        candidates += with_sp(f"tp{n}", dict(dp=1, tp=n), cfg)
        candidates.append((f"pp{n}-gpipe", dict(dp=1, pp=n, schedule="gpipe")))
        candidates.append((f"pp{n}-1f1b", dict(dp=1, pp=n, schedule="1f1b")))
        if n % 2 == 0 and n > 2:
            candidates += with_sp(f"dp{n // 2}xtp2", dict(dp=n // 2, tp=2), cfg)
            candidates.append((f"dp{n // 2}xpp2", dict(dp=n // 2, pp=2)))
            candidates.append((f"dp{n // 2}xep2xtp2", dict(dp=n // 2, ep=2, tp=2)))  # --experts only
            if n == 4:
                candidates += with_sp("tp2xpp2", dict(dp=1, tp=2, pp=2), cfg)
        candidates += context_layouts(n)
    if cfg.alltoall != "pairwise":  # --alltoall picks the ep layouts' algorithm; the others have none
        candidates = [
            (name, over if over.get("ep", 1) > 1 else dict(over, alltoall="pairwise"))
            for name, over in candidates
        ]
    if cfg.experts:  # a pipeline of MoE blocks equals serial --grad-accum M, not this tour's reference;
        # --zero with experts (parallel/expert_zero.py) has its own test, and the tour keeps its length
        candidates = [
            (name, over) for name, over in candidates if over.get("pp", 1) == 1 and not over.get("zero")
        ]
    # serial always runs: it is the reference, and a problem with the options shows there as one line
    return candidates[:1] + [(name, over) for name, over in candidates[1:] if trains(cfg, over)]


def context_layouts(n: int) -> list[tuple[str, dict]]:
    """--arch gpt's context-parallel layouts (validate refuses them elsewhere): cp2 (on 2 of the
    ranks), cp n, dp2 x cp2, dp2 x cp2 with ZeRO-1 over the 4 (context_zero.py), with --experts dp2 x
    cp2 x ep2 (context_expert.py), cp2 x tp2 (with --experts: context_expert_tensor.py) and cp2 x pp2
    on 4, and cp n with the all-to-all attention."""
    sizes = sorted({2, n}) if n % 2 == 0 else [n]
    out = [(f"cp{c}", dict(dp=1, cp=c, cp_algo="ring")) for c in sizes]
    if n == 4:
        out.append(("dp2xcp2", dict(dp=2, cp=2, cp_algo="ring")))
        out.append(("dp2xcp2-zero1", dict(dp=2, cp=2, cp_algo="ring", zero=1)))
        out.append(("dp2xcp2xep2", dict(dp=2, cp=2, ep=2, cp_algo="ring")))  # --experts: context_expert.py
        out.append(("cp2xtp2", dict(dp=1, cp=2, tp=2, cp_algo="ring")))  # context_tensor.py
        out.append(("cp2xpp2", dict(dp=1, cp=2, pp=2, schedule="1f1b", cp_algo="ring")))  # context_stage.py
    return out + [(f"cp{n}-ulysses", dict(dp=1, cp=n, cp_algo="ulysses"))]


def with_sp(name: str, overrides: dict, cfg: RunConfig) -> list[tuple[str, dict]]:
    """A tensor-parallel layout, and for --arch resmlp and gpt the same with its rows split too (--sp:
    the residual stream's rows sharded over the tp group, Korthikanti et al. 2022 sec. 4.2.2)."""
    plain = [(name, overrides)]
    return plain + [(f"{name}-sp", dict(overrides, sp=True))] if cfg.arch in ("resmlp", "gpt") else plain


def trains(base: RunConfig, overrides: dict) -> bool:
    """Whether `train` accepts this layout: config.validate on a copy, on the layout's own ranks."""
    cfg = copy.deepcopy(base)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    try:
        validate(cfg, cfg.dp * cfg.cp * cfg.tp * cfg.pp)
    except SimparError:
        return False
    return True


def tour_main(base: RunConfig, quick: bool = False, out_dir: str = "simpar-out", plots: bool = True) -> int:
    from mpi4py import MPI

    from .loop import run_training

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    if base.steps is None and base.epochs is None:
        base.steps = 20 if quick else 150
    problem = None
    if rank == 0:
        try:
            os.makedirs(out_dir, exist_ok=True)
        except OSError as exc:
            problem = f"--out {out_dir}: {exc.strerror}"
    problem = world.bcast(problem, root=0)
    if problem:
        raise SimparError(problem)

    results = []
    for name, overrides in layouts_for(size, base):
        cfg = copy.deepcopy(base)
        for key, value in overrides.items():
            setattr(cfg, key, value)
        cfg.quiet = True
        cfg.metrics_out = cfg.weights_out = None
        # One pipeline run is traced, for the timeline picture (report/plots.py draws trace.json).
        cfg.trace = os.path.join(out_dir, "trace.json") if name.endswith("1f1b") and cfg.pp > 1 else None
        need = (cfg.dp or 1) * cfg.cp * cfg.tp * cfg.pp
        sub = world.Split(0 if rank < need else MPI.UNDEFINED, rank)
        result, problem = None, None
        if sub != MPI.COMM_NULL:
            started = time.perf_counter()
            try:
                result = run_training(cfg, Communicator(sub, Ledger(), name))
            except SimparError as exc:  # raised on every rank of `sub`, rank 0 among them
                problem = f"{name}: {exc}"
            sub.Free()
            if result is not None:
                metrics = result.metrics
                if cfg.trace:
                    write_trace(cfg.trace, result.trace)
                metrics["tour_wall_s"] = time.perf_counter() - started
                write_json(os.path.join(out_dir, f"{name}.json"), metrics)
                results.append((name, metrics))
                print(f"  {name:<14} done in {metrics['tour_wall_s']:.1f} s", flush=True)
        # Ranks outside `sub` wait without spinning (they would take cores from the layout's ranks
        # when ranks outnumber cores), then hear about a failure too, or they would wait forever.
        wait_yielding(world)
        problem = world.bcast(problem, root=0)
        if problem:
            raise SimparError(problem)

    cores = hardware.load(base.hardware).cores if base.clock != "sim" else 0
    round_s = message_round_s(world) if oversubscribed(size, cores) else None  # every rank takes part
    if rank == 0:
        ok = print_tour_table(results, base.precision if base.mixed else base.dtype)
        print_time_table(results, base, cores)
        if round_s is not None:
            alpha = hardware.load(base.hardware).intra_alpha
            print(oversubscription_note(size, cores, round_s, gap_per_round_s(results), alpha))
        if plots:
            _plots(results, out_dir)
        print(f"\nmetrics {'and plots ' if plots else ''}in {out_dir}/")
        if size == 1:
            print(
                "one rank shows only the serial reference: run `mpiexec -n 4 python -m mpi4py -m simpar` "
                "for data, tensor, pipeline, ZeRO and hybrid layouts"
            )
        if not ok:
            raise SimparError("a layout did not match the serial run or the cost model (see the table above)")
    return 0


def print_tour_table(results, dtype: str) -> bool:
    """`dtype`: float64 | float32, or the mixed precision's name (mixed-fp16 | mixed-bf16)."""
    serial = results[0][1]["losses"]
    tol = TOLERANCE[dtype]
    print(f"\nsimpar tour: {len(results)} layouts, same model and data, {len(serial)} steps, {dtype}")
    moe = any(m.get("moe") for _, m in results)  # --experts: the all-to-all and the drops get columns
    head = (
        f"{'layout':<14} {'ranks':>5} {'final loss':>10} {'max|dloss|':>10} {'acc':>6} "
        f"{'data/step':>10} {'model/step':>10} {'act/step':>10} "
        + (f"{'a2a/step':>10} {'dropped':>7} " if moe else "")
        + f"{'mem/rank':>10} {'bytes=pred':>10}"
    )
    print(head)
    print("-" * len(head))
    all_ok = True
    mixed = dtype.startswith("mixed")
    for name, m in results:
        pairs = list(zip(m["losses"], serial))[: MIXED_STEPS if mixed else None]
        diff = max(abs(a - b) / max(abs(b), 1e-30) for a, b in pairs)
        ok = diff <= tol
        if mixed and m.get("accuracy") is not None:
            ok &= abs(m["accuracy"] - results[0][1]["accuracy"]) <= MIXED_ACCURACY
        all_ok &= ok
        per = m["comm"]["per_step"]
        mem = max(
            sum(r[k] for k in ("params", "grads", "optimizer", "activations_peak"))
            for r in m["memory"]["ranks"]
        )
        acc = m.get("accuracy")
        print(
            f"{name:<14} {m['world_size']:>5} {m['final_loss']:>10.4f} {diff:>10.1e}{'' if ok else '!'} "
            f"{(acc if acc is not None else float('nan')):>6.3f} {fmt_bytes(per['data']):>10} "
            f"{fmt_bytes(per['model']):>10} {fmt_bytes(per['activation']):>10} "
            + (f"{fmt_bytes(alltoall_per_step(m)):>10} {dropped(m):>7} " if moe else "")
            + f"{fmt_bytes(mem):>10} {bytes_verdict(m):>10}"
        )
        all_ok &= not m["prediction_mismatches"]
    if moe:
        algorithm = next(
            (m["config"].get("alltoall") for _, m in results if m["config"].get("ep", 1) > 1), None
        )
        print(moe_note(mixed, algorithm))
    which = f"of the first {MIXED_STEPS} steps' losses" if mixed else "of any step's loss"
    also = f"; acc within {MIXED_ACCURACY} of serial's (mixed precision: see tour.py)" if mixed else ""
    print(
        f"(bytes: sent by all ranks together per step; max|dloss|: largest relative difference {which} "
        f"from serial, tolerance {tol:g}{also}; "
        f"bytes=pred: every rank's bytes per category and shard memory equal the cost model's"
        + (
            "; 'modeled': MPI's own collectives hid the messages and the ledger booked the formula's "
            "volume instead, so the bytes agree by construction)"
            if any(bytes_verdict(m) == "modeled" for _, m in results)
            else ")"
        )
    )
    return all_ok


# Why an MoE layout may be held to the serial run's losses at all: capacity is global (ceil(C*K*B/E)
# slots per expert, filled in global row order), so every dp/ep layout keeps and drops exactly the
# assignments the serial run does (parallel/expert.py), and the same tokens reach the same experts.
# Under mixed precision the layouts' weights differ by roundoff from step 1 on (see MIXED_STEPS), so
# a router may pick another expert for a row near a tie and the drops differ a little: only the losses
# and the accuracy are held to serial's then.
def moe_note(mixed: bool, algorithm: str | None = None) -> str:
    same = (
        "close to serial's, not equal: under mixed precision each layout's weights differ by roundoff, "
        "so a row near a tie may pick another expert"
        if mixed
        else "the same in every layout because capacity is global and filled in global token order, so dp, "
        "dp x ep and cp compute the serial model"
    )
    return (
        "(a2a/step: the all-to-alls of expert parallelism -- ep-dispatch, ep-combine and their -grad -- "
        + (
            "by Bruck's algorithm (pieces forwarded: more bytes, fewer messages), "
            if algorithm == "bruck"
            else ""
        )
        + f"part of act/step; dropped: top-k assignments over capacity in the whole run, {same})"
    )


def dropped(m: dict) -> int:
    """Top-k assignments an expert's capacity turned away, over every step and MoE layer of the run."""
    return sum(sum(layers) for layers in m["moe"]["dropped"])


def step_seconds(m: dict) -> float:
    """A layout's step: simulated under --clock sim, else the measured median."""
    sim = m["time"].get("sim")
    return sim["step_s"] if sim else m["time"]["step_s_median"]


def print_time_table(results, base: RunConfig, cores: int = 0) -> None:
    """Where the time goes, and whether parallelism pays: speedup = serial step / layout step on the
    same clock. Under --clock sim each step splits into compute, exposed and overlapped
    communication and idle (averaged over ranks); the cost model's prediction stands beside it.
    A layout with more ranks than the machine's cores (wall clock) gets no pred err: the model prices
    a core share, not waiting for a core, so the number would mislead (run/oversubscribed.py; the
    line under the table gives the measured reason)."""
    sim = base.clock == "sim"
    serial = step_seconds(results[0][1])
    where = f"simulated on {base.hardware}" if sim else "measured on this machine (wall clock)"
    print(f"\ntime per step, {where}")
    head = f"{'layout':<14} {'step ms':>9} {'speedup':>8} {'pred ms':>9} {'pred err':>8}"
    if sim:
        head += f" {'compute':>8} {'exposed':>8} {'overlap':>8} {'idle':>8}"
    mfu = sim and base.arch == "gpt"
    if mfu:
        head += f" {'MFU':>7}"
    print(head)
    print("-" * len(head))
    for name, m in results:
        step, pred = step_seconds(m), m["predicted"]["time"]["step_s"]
        line = f"{name:<14} {1000 * step:>9.3f} {serial / step:>7.2f}x {1000 * pred:>9.3f}"
        if oversubscribed(m["world_size"], cores):
            line += f" {'n/a*':>8}"
        else:
            line += f" {pred / step - 1:>+8.1%}"
        if sim:
            s = m["time"]["sim"]
            line += "".join(
                f" {s[k] / step:>8.0%}"
                for k in ("compute_s", "comm_exposed_s", "comm_overlapped_s", "idle_s")
            )
        if mfu:
            line += f" {model_flops_utilisation(base, m['world_size'], step):>7.2%}"
        print(line)
    note = (
        "compute + exposed + idle = the step (idle: waiting for a peer -- the pipeline bubble); overlap: "
        "communication hidden behind compute; all as fractions of the step, averaged over ranks"
        if sim
        else "on 2 cores 4 ranks share the cores and every message costs microseconds of Python and MPI: "
        "parallelism cannot pay here; try --clock sim --hardware dgx-h100"
    )
    print(f"(speedup: serial step / this layout's step; pred: the cost model on the same hardware; {note})")
    if mfu:
        moe = ", its MLP's 48 B s L h^2 counted K times and the router's 6 B s L h E" if base.experts else ""
        print(
            "(MFU: model FLOPs per step, 72 B s L h^2 (1 + s/12h + V/12Lh) (Narayanan et al. 2021 sec. 5.1 "
            f"with the causal half of the scores, as Megatron-LM counts them){moe}, "
            f"over step x ranks x {base.hardware}'s dense peak (Chowdhery et al. 2022 app. B); a model this "
            "small is all latency and launches, a real one is not: `plan --arch gpt --model gpt3-175b`)"
        )


def model_flops_utilisation(cfg: RunConfig, ranks: int, step_s: float) -> float:
    """MFU of a --arch gpt step as PaLM defines it (Chowdhery et al. 2022, appendix B): the model's
    FLOPs per step (costmodel/gpt.py's model_flops_per_step: Narayanan et al. 2021's count with the
    causal half of the scores; recomputation and masked scores are not useful work) over the step's
    time x the ranks x the profile's dense peak per device."""
    from ..costmodel.gpt import model_flops_per_step
    from ..costmodel.spec import precision_of

    flops = model_flops_per_step(cfg.batch, cfg.seq_len, cfg.blocks, cfg.hidden, cfg.vocab)
    if cfg.experts:  # a token's K experts (the MLP K times) and the router: costmodel/gpt_moe.py's count
        tokens = cfg.batch * cfg.seq_len
        flops += (cfg.top_k - 1) * 48 * tokens * cfg.blocks * cfg.hidden**2
        flops += 6 * tokens * cfg.blocks * cfg.hidden * cfg.experts
    return flops / (step_s * ranks * hardware.load(cfg.hardware).peak_rate(precision_of(cfg)))


def _plots(results, out_dir):
    from ..report import plots

    plots.tour_plots(results, out_dir)
