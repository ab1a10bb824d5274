"""The rules of each section, as small functions that core.validate calls in a fixed order.

Each function checks one section's fields (reading others only where a rule spans two sections, e.g.
--precision mixed-bf16 with --collectives mpi) and raises SimparError with a one-line message. The
order in which validate calls them decides which problem is reported when several are present, so
it is written out there, in one place; the messages are a contract (tests/mpi/test_errors.py, the lessons).
The pipeline's and the experts' rules are pipeline.py and moe.py, the last of the layout's rules.
"""

from __future__ import annotations

import math

from ..errors import require
from .sections import (
    ACTIVATIONS,
    ALLTOALLS,
    ARCHS,
    CLOCKS,
    COLLECTIVES,
    COMPUTE_MODELS,
    CP_ALGOS,
    DATA_SOURCES,
    DATASETS,
    DTYPES,
    KERNELS,
    OPTIMIZERS,
    PRECISIONS,
    RECOMPUTE,
    SCHEDULES,
)


def one_of(value, names, what: str, listed: bool = True) -> None:
    """`value` is one of `names`, or: unknown WHAT 'value' (choose from a, b, c)."""
    hint = f" (choose from {', '.join(names)})" if listed else ""
    require(value in names, f"unknown {what} {value!r}{hint}")


# -- model --------------------------------------------------------------------------------------------


def model_layers(cfg) -> None:
    """--layers; --arch gpt has none, its shape and layouts are model_gpt's."""
    if cfg.arch == "gpt":
        model_gpt(cfg)
        return
    require(len(cfg.layers) >= 2, "--layers needs at least an input and an output width, e.g. 64,128,10")
    require(all(w >= 1 for w in cfg.layers), f"--layers widths must be positive, got {cfg.layers}")
    require(
        cfg.dataset not in ("text", "copy"), f"--dataset {cfg.dataset} is token sequences: add --arch gpt"
    )


def model_gpt(cfg) -> None:
    """--arch gpt: its shape, its data, and the layouts built for it so far (dp, ZeRO 1-3, tp, sp, pp)."""
    for name, value in (
        ("--n-layers", cfg.blocks),
        ("--hidden", cfg.hidden),
        ("--heads", cfg.heads),
        ("--seq-len", cfg.seq_len),
        ("--vocab", cfg.vocab),
    ):
        require(value >= 1, f"{name} must be at least 1, got {value}")
    require(cfg.hidden % cfg.heads == 0, f"--hidden {cfg.hidden} is not divisible by --heads {cfg.heads}")
    require(
        cfg.dataset in ("text", "copy"),
        f"--arch gpt trains on token sequences: --dataset text or copy, not {cfg.dataset}",
    )
    require(
        cfg.dataset != "copy" or (cfg.seq_len >= 2 and cfg.seq_len % 2 == 0 and cfg.vocab >= 2),
        "--dataset copy needs an even --seq-len >= 2 (symbols, separator, copy) and --vocab >= 2",
    )
    later = [
        name
        for name, used in (
            ("--data-source root", cfg.data_source == "root"),
            ("--inject nan", (cfg.inject or "").startswith("nan")),  # its inputs are integer tokens
        )
        if used
    ]
    require(
        not later,
        f"--arch gpt does not take {', '.join(later)} (--inject nan poisons float inputs and gpt's are token "
        "ids; --data-source root scatters the MLP's float batches)",
    )
    # tensor parallelism (parallel/tensor_gpt.py): whole heads and equal vocabulary ranges per rank
    require(
        cfg.heads % cfg.tp == 0,
        f"--heads {cfg.heads} is not divisible by --tp {cfg.tp}: each tp rank holds whole heads",
    )
    require(
        cfg.vocab % cfg.tp == 0,
        f"--vocab {cfg.vocab} is not divisible by --tp {cfg.tp}: each tp rank holds V/tp of the vocabulary",
    )


def model_names(cfg) -> None:
    """--dtype, --precision, --arch and what they require of each other, --loss-scale, --activation."""
    one_of(cfg.dtype, DTYPES, "dtype")
    one_of(cfg.precision, PRECISIONS, "precision")
    one_of(cfg.arch, ARCHS, "arch")
    if cfg.arch == "resmlp":
        hidden = cfg.layers[1:-1]
        require(
            len(hidden) >= 1 and len(set(hidden)) == 1,
            f"--arch resmlp needs equal hidden widths (the residual stream), e.g. 64,128,128,128,10; got "
            f"{cfg.layers}",
        )
    if cfg.mixed:
        # The master weights and optimizer state are float32 (ZeRO paper sec. 3.1). Ranks holding
        # different gradients (ZeRO shards, pipeline stages, tp shards) vote on skipping a step.
        require(
            cfg.dtype == "float32", f"--precision {cfg.precision} keeps float32 master weights; drop --dtype"
        )
        require(
            not (cfg.precision == "mixed-bf16" and cfg.collectives == "mpi"),
            "--collectives mpi cannot sum bfloat16 (MPI has no such type); use ring, tree, ...",
        )
        require(
            cfg.loss_scale is None or (cfg.loss_scale > 0 and math.isfinite(cfg.loss_scale)),
            f"--loss-scale must be a positive number, got {cfg.loss_scale}",
        )
    require(
        cfg.mixed or cfg.loss_scale is None,
        "--loss-scale sets mixed precision's loss scaler: add --precision mixed-fp16 or mixed-bf16",
    )
    one_of(cfg.activation, ACTIVATIONS, "activation", listed=False)


def model_seed(cfg) -> None:
    require(cfg.seed >= 0, f"--seed must be a non-negative integer, got {cfg.seed}")


# -- data ---------------------------------------------------------------------------------------------


def data_dataset(cfg) -> None:
    one_of(cfg.dataset, DATASETS, "dataset")


def data_source(cfg) -> None:
    one_of(cfg.data_source, DATA_SOURCES, "data source", listed=False)


def data_samples(cfg) -> None:
    require(cfg.samples >= 2, "--samples must be at least 2")


def data_files(cfg) -> None:
    if cfg.dataset == "mnist":
        require(cfg.data_dir is not None, "--dataset mnist needs --data-dir DIR with the four IDX files")


# -- optimisation -------------------------------------------------------------------------------------


def optimisation_optimizer(cfg) -> None:
    one_of(cfg.optimizer, OPTIMIZERS, "optimizer")


def optimisation_values(cfg) -> None:
    require(cfg.batch >= 1, f"--batch must be at least 1, got {cfg.batch}")
    require(cfg.lr > 0 and math.isfinite(cfg.lr), f"--lr must be a positive number, got {cfg.lr}")
    require(0 <= cfg.momentum < 1, f"--momentum must be in [0, 1), got {cfg.momentum}")


def optimisation_counts(cfg) -> None:
    require(cfg.grad_accum >= 1, "--grad-accum must be at least 1")
    require(cfg.steps is None or cfg.steps >= 1, "--steps must be at least 1")
    require(cfg.epochs is None or cfg.epochs >= 1, "--epochs must be at least 1")


# -- layout -------------------------------------------------------------------------------------------


def layout_names(cfg) -> None:
    """The schedule, recomputation, collective algorithms and kernels are names simpar knows."""
    one_of(cfg.schedule, SCHEDULES, "schedule")
    one_of(cfg.recompute, RECOMPUTE, "recompute")
    one_of(cfg.collectives, COLLECTIVES, "collectives", listed=False)
    one_of(cfg.alltoall, ALLTOALLS, "alltoall")
    require(
        cfg.alltoall == "pairwise" or cfg.ep > 1,
        f"--alltoall {cfg.alltoall} picks expert parallelism's all-to-all: add --experts E --ep P (P >= 2)",
    )
    one_of(cfg.kernels, KERNELS, "kernels")
    one_of(cfg.cp_algo, CP_ALGOS, "cp-algo")


def layout_values(cfg) -> None:
    require(cfg.zero in (0, 1, 2, 3), f"--zero must be 0, 1, 2 or 3, got {cfg.zero}")
    require(cfg.microbatches >= 1, "--microbatches must be at least 1")
    require(cfg.bucket_mb > 0, "--bucket-mb must be positive")
    require(cfg.tp >= 1 and cfg.pp >= 1, "--tp and --pp must be at least 1")
    require(cfg.cp >= 1, f"--cp must be at least 1, got {cfg.cp}")


def layout_fit(cfg, world_size: int) -> None:
    """dp from the world size (when not given), then what dp, tp and --sp need of the batch and widths."""
    model_ranks = cfg.cp * cfg.tp * cfg.pp
    cp_ = "cp*" if cfg.cp > 1 else ""  # name cp in the messages only when it is used
    cpv = f"{cfg.cp}*" if cfg.cp > 1 else ""
    if cfg.dp is None:
        require(
            world_size % model_ranks == 0,
            f"world size {world_size} is not divisible by {cp_}tp*pp = {cpv}{cfg.tp}*{cfg.pp} = "
            f"{model_ranks}",
        )
        cfg.dp = world_size // model_ranks
    require(cfg.dp >= 1, "--dp must be at least 1")
    require(
        cfg.dp * model_ranks == world_size,
        f"world size {world_size} does not factor into dp*{cp_}tp*pp = {cfg.dp}*{cpv}{cfg.tp}*{cfg.pp} = "
        f"{cfg.dp * model_ranks}; launch with mpiexec -n {cfg.dp * model_ranks} or change the layout",
    )
    require(
        cfg.batch >= cfg.dp * cfg.grad_accum,
        f"--batch {cfg.batch} is smaller than dp*grad-accum = {cfg.dp * cfg.grad_accum}: "
        "some rank would get no rows",
    )
    if cfg.tp > 1:
        hidden = cfg.layers[1:-1]
        bad = [w for w in hidden if w % cfg.tp]
        require(not bad, f"hidden widths {bad} are not divisible by --tp {cfg.tp}")
    if cfg.sp:
        require(
            cfg.arch in ("resmlp", "gpt") and cfg.tp > 1,
            "--sp splits the rows of the residual stream over the tp group: use it with "
            "--arch resmlp or gpt and --tp > 1",
        )
        if cfg.arch == "gpt":  # the tokens of every micro-step: b s rows, cut in tp contiguous shards
            require(
                cfg.seq_len % cfg.tp == 0,
                f"--sp splits every micro-step's tokens evenly over --tp {cfg.tp}: --seq-len {cfg.seq_len} "
                "must be a multiple of it",
            )
            return
        rows = cfg.dp * cfg.grad_accum * cfg.tp
        require(
            cfg.batch % rows == 0,
            f"--sp splits every micro-step's rows evenly over --tp {cfg.tp}: --batch {cfg.batch} must be a "
            f"multiple of dp*grad-accum*tp = {rows}",
        )
        # Under --pp the row shards are cut per micro-batch (np.array_split parts differ by at most
        # one row, so they all divide by tp >= 2 only when they are all equal).
        rows *= cfg.microbatches
        require(
            cfg.pp == 1 or cfg.batch % rows == 0,
            f"--sp with --pp splits every micro-batch's rows evenly over --tp {cfg.tp}: --batch {cfg.batch} "
            f"must be a multiple of dp*grad-accum*microbatches*tp = {rows}",
        )


def layout_cp(cfg) -> None:
    """--cp C: --arch gpt, 2C equal sequence chunks, the dp x cp gradient all-reduce (parallel/context.py)."""
    if cfg.cp == 1:
        require(
            cfg.cp_algo == "ring",
            f"--cp-algo {cfg.cp_algo} picks context parallelism's attention: add --cp C",
        )
        return
    require(cfg.arch == "gpt", "--cp splits a token sequence over ranks: use it with --arch gpt")
    require(
        cfg.seq_len % (2 * cfg.cp) == 0,
        f"--cp {cfg.cp} cuts every sequence into 2*cp = {2 * cfg.cp} equal chunks: --seq-len {cfg.seq_len} "
        f"must be a multiple of {2 * cfg.cp}",
    )
    require(
        cfg.cp_algo != "ulysses" or cfg.heads % cfg.cp == 0,
        f"--cp-algo ulysses gives each of the --cp {cfg.cp} ranks whole heads: --heads {cfg.heads} must be "
        f"divisible by {cfg.cp}",
    )
    require(
        cfg.cp_algo != "ulysses" or (cfg.heads // cfg.tp) % cfg.cp == 0,
        f"--cp-algo ulysses with --tp {cfg.tp} gives each of the --cp {cfg.cp} ranks whole heads of its tp "
        f"rank's heads/tp = {cfg.heads // cfg.tp}: that must be divisible by {cfg.cp}",
    )
    n = cfg.seq_len // cfg.cp  # a cp rank's tokens of each sequence: --sp cuts its b n rows over tp
    require(
        not cfg.sp or n % cfg.tp == 0,
        f"--sp with --cp {cfg.cp} splits each rank's seq-len/cp = {n} tokens of a sequence evenly over "
        f"--tp {cfg.tp}: --seq-len {cfg.seq_len} must be a multiple of cp*tp = {cfg.cp * cfg.tp}",
    )
    # --pp: cp inside the stages runs every schedule and --recompute, with or without --tp [--sp]
    # (parallel/pipeline/context_stage.py, context_tensor_stage.py; costmodel/cp_pipeline.py and
    # cp_tp_pipeline.py predict them)
    # --collectives: the dp x cp gradient all-reduce runs the chosen algorithm (parallel/data.GradientBuckets
    # over the dpcp group; with --experts, context_expert.py's dense and expert groups; costmodel/cp_time.py
    # and gpt_moe_time.py price them)
    # --clock sim: cp_time.py prices each rank's own share of a collective, as gpt_time.py does for dp and
    # tp; where the clock's ranks wait on each other inside one (tp's blocking tree or parameter-server
    # all-reduces, ps buckets queueing at the server) that share is not the step's time: ~1-6% off, as
    # without --cp; rabenseifner and mpi leave tp's ranks together, under --pp too (cp x tp x pp:
    # tests/mpi/parallel/pipeline/test_cp_tp_pipeline.py)
    sim, c, pp = cfg.clock == "sim", cfg.collectives, cfg.pp > 1
    require(
        not (sim and cfg.tp > 1 and c in ("tree", "ps")),
        f"--clock sim with --cp, --tp{' and --pp' if pp else ''} does not price tp's blocking --collectives "
        f"{c} all-reduces exactly yet; use ring, rabenseifner, mpi or auto",
    )
    require(  # without --pp, ps_time.py follows each bucket through the server
        not (sim and c == "ps" and pp and cfg.dp * cfg.cp > 2),
        f"--clock sim with --cp and --pp does not price --collectives ps over dp*cp = {cfg.dp * cfg.cp} > 2 "
        "ranks exactly yet (its buckets queue at the server); use ring, rabenseifner, tree, mpi or auto",
    )


def layout_zero(cfg) -> None:
    """--zero 1-3 over dp (x cp); --zero 1 also inside --tp/--pp shards, any arch (parallel/zero_mesh.py);
    --zero 2|3 inside --tp shards on --arch gpt, with --cp too (parallel/zero_tp.py)."""
    if cfg.zero and (cfg.tp > 1 or cfg.pp > 1):
        require(  # DeepSpeed's PipelineEngine asserts the same (deepspeed/runtime/pipe/engine.py,
            # https://github.com/deepspeedai/DeepSpeed/issues/4164): docs/strategies.md says why
            cfg.pp == 1 or cfg.zero == 1,
            f"--zero {cfg.zero} with --pp: gradient (and parameter) partitioning does not fit the "
            "pipeline's accumulation over micro-batches (DeepSpeed refuses it too); use --zero 1",
        )
        require(  # stages 2/3 shard each tp share's gradients (and parameters): parallel/zero_tp.py
            cfg.zero == 1 or cfg.arch == "gpt",
            f"--zero {cfg.zero} with --tp is not built yet for --arch {cfg.arch} (built: --arch gpt); "
            "use --zero 1",
        )
    if cfg.zero:
        require(
            cfg.collectives == "ring",
            f"--zero uses ring reduce-scatter and all-gather; --collectives {cfg.collectives} applies to "
            "all-reduce layouts only",
        )


# -- time, reliability, checkpoints -------------------------------------------------------------------


def time_names(cfg) -> None:
    one_of(cfg.clock, CLOCKS, "clock")
    require(
        cfg.compute in COMPUTE_MODELS, f"unknown compute model {cfg.compute!r} (choose model or measured)"
    )


MIN_WATCHDOG_S = 1.0  # a smaller --watchdog fires on healthy steps (or the first Numba call)


def reliability_values(cfg, world_size: int, parse_inject) -> None:
    require(cfg.watchdog >= 0 and math.isfinite(cfg.watchdog), "--watchdog must be a number of seconds >= 0")
    require(  # a tinier limit fires on a healthy step: an error on a run that was fine
        cfg.watchdog == 0 or cfg.watchdog >= MIN_WATCHDOG_S,
        f"--watchdog {cfg.watchdog:g}: give at least {MIN_WATCHDOG_S:g} s, or 0 to turn it off",
    )
    if cfg.inject:
        require(parse_inject(cfg.inject)["rank"] < world_size, f"--inject {cfg.inject}: no such rank")
        require(  # a fault that never happens would teach nothing, silently
            cfg.steps is None or parse_inject(cfg.inject)["step"] <= cfg.steps,
            f"--inject {cfg.inject}: step {parse_inject(cfg.inject)['step']} is past --steps {cfg.steps}",
        )


def checkpoints_values(cfg) -> None:
    require(
        cfg.checkpoint_every is None or cfg.checkpoint_every >= 1, "--checkpoint-every must be at least 1"
    )
    require(
        cfg.checkpoint_every is None or cfg.checkpoint_dir,
        "--checkpoint-every needs --checkpoint-dir DIR (where to write them)",
    )
    require(
        cfg.resume != "auto" or cfg.checkpoint_dir, "--resume auto needs --checkpoint-dir DIR (where to look)"
    )
