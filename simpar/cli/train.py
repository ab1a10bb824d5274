"""`simpar train`: train one layout. Also the run options every training command shares (the tour's too).

python -m simpar train --dtype float64 --steps 20
mpiexec -n 4 python -m mpi4py -m simpar train --dp 2 --tp 2 --metrics-out run.json --trace trace.json
"""

from __future__ import annotations

import argparse

from ..config import (
    ACTIVATIONS,
    ARCHS,
    CLOCKS,
    COLLECTIVES,
    COMPUTE_MODELS,
    DATA_SOURCES,
    DATASETS,
    DTYPES,
    KERNELS,
    OPTIMIZERS,
    PRECISIONS,
    RECOMPUTE,
    SCHEDULES,
    RunConfig,
    SimparError,
)
from .base import int_list

DEFAULT_LAYERS = {"digits": [64, 128, 128, 128, 10], "mnist": [784, 256, 256, 10]}  # synthetic: say --layers


def add_run_arguments(p: argparse.ArgumentParser, tour: bool = False) -> None:
    d = RunConfig()
    g = p.add_argument_group("model")
    g.add_argument(
        "--layers",
        type=int_list,
        default=None,
        help="widths, input first (default 64,128,128,128,10 for digits, 784,256,256,10 for mnist)",
    )
    g.add_argument("--activation", default=d.activation, choices=ACTIVATIONS)
    g.add_argument(
        "--arch",
        default=d.arch,
        choices=ARCHS,
        help="mlp, or resmlp: pre-LayerNorm residual blocks x + W2 act(W1 LN(x)) (dp, --zero, --tp or --pp)",
    )
    g.add_argument("--dtype", default=d.dtype, choices=DTYPES)
    g.add_argument(
        "--experts",
        type=int,
        default=d.experts,
        help="mixture of experts: E experts in every hidden-to-hidden layer (0: the plain MLP)"
        + ("; the tour then shows serial, dp and each dp x ep layout" if tour else ""),
    )
    g.add_argument("--top-k", type=int, default=d.top_k, help="experts per token (gates renormalised)")
    g.add_argument(
        "--capacity-factor",
        type=float,
        default=d.capacity_factor,
        help="token slots per expert = ceil(C * K * rows / E); tokens beyond are dropped (counted)",
    )
    g.add_argument(
        "--aux-loss-coef",
        type=float,
        default=d.aux_loss_coef,
        help="Switch load-balancing loss weight alpha",
    )
    g.add_argument(
        "--precision",
        default=d.precision,
        choices=PRECISIONS,
        help="fp32: all in --dtype; mixed-fp16|mixed-bf16: half weights, activations, gradients and "
        "messages, float32 master weights and optimizer state, dynamic loss scaling (every layout: dp, "
        "--zero, --tp/--sp, --pp; --experts with mixed-bf16)",
    )
    g.add_argument(
        "--loss-scale",
        type=float,
        default=None,
        help="mixed precision: the initial loss scale (default 65536 for fp16, 1 for bf16)",
    )
    g.add_argument("--seed", type=int, default=d.seed)
    g = p.add_argument_group("data")
    g.add_argument("--dataset", default=d.dataset, choices=DATASETS)
    g.add_argument("--samples", type=int, default=d.samples, help="synthetic: number of samples")
    g.add_argument("--data-dir", default=None, help="mnist: folder with the four IDX files")
    g.add_argument(
        "--data-source",
        default=d.data_source,
        choices=DATA_SOURCES,
        help="local: each rank reads its own rows (no traffic); "
        "root: rank 0 scatters every batch (data traffic)",
    )
    g = p.add_argument_group("optimisation")
    g.add_argument("--batch", type=int, default=d.batch, help="global batch size")
    g.add_argument("--steps", type=int, default=None)
    g.add_argument("--epochs", type=int, default=None)
    g.add_argument("--lr", type=float, default=d.lr)
    g.add_argument("--momentum", type=float, default=d.momentum)
    g.add_argument("--optimizer", default=d.optimizer, choices=OPTIMIZERS)
    g.add_argument("--grad-accum", type=int, default=d.grad_accum, help="micro-steps per optimizer step")
    g = p.add_argument_group("layout")
    if not tour:
        g.add_argument("--dp", type=int, default=None, help="data-parallel ranks (default: world / (tp*pp))")
        g.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks")
        g.add_argument(
            "--sp",
            action="store_true",
            help="sequence parallelism (--arch resmlp, --tp > 1): LayerNorm and the residual on a 1/tp "
            "share of the rows; g a reduce-scatter, f an all-gather",
        )
        g.add_argument("--pp", type=int, default=1, help="pipeline stages")
        g.add_argument("--zero", type=int, default=0, help="ZeRO stage 0-3 (with data parallelism)")
        g.add_argument(
            "--ep", type=int, default=1, help="expert-parallel ranks (inside --dp; with --experts)"
        )
        g.add_argument(
            "--stage-layers", type=int_list, default=None, help="layers per pipeline stage, e.g. 2,1,1"
        )
    g.add_argument(
        "--alltoall",
        default=d.alltoall,
        help="expert parallelism's all-to-all: pairwise (P-1 messages) or bruck (log2 P messages, "
        "more bytes)" + ("; the tour's dp x ep layouts use it" if tour else ""),
    )
    g.add_argument("--schedule", default=d.schedule, choices=SCHEDULES, help="pipeline schedule")
    g.add_argument("--microbatches", type=int, default=d.microbatches)
    g.add_argument(
        "--virtual-stages", type=int, default=d.virtual_stages, help="model chunks per rank (interleaved)"
    )
    g.add_argument("--recompute", default=d.recompute, choices=RECOMPUTE, help="activation recomputation")
    g.add_argument("--bucket-mb", type=float, default=d.bucket_mb, help="gradient bucket size in MiB")
    g.add_argument("--no-overlap", action="store_true", help="all-reduce gradients only after backward")
    g.add_argument("--collectives", default=d.collectives, choices=COLLECTIVES, help="all-reduce algorithm")
    g.add_argument("--kernels", default=d.kernels, choices=KERNELS, help="compute kernels")
    g = p.add_argument_group("time")
    g.add_argument(
        "--clock",
        default=d.clock,
        choices=CLOCKS,
        help="wall: this machine's clock; sim: a simulated cluster",
    )
    g.add_argument(
        "--hardware",
        default=d.hardware,
        help="the profile of the cost model's prediction in the metrics and of --clock sim: local | "
        "dgx-h100 | ib-cluster | ethernet-100g | FILE.json",
    )
    g.add_argument(
        "--compute",
        default=d.compute,
        choices=COMPUTE_MODELS,
        help="with --clock sim: model (FLOPs and bytes on the profile) or measured (CPU time, scaled)",
    )
    g = p.add_argument_group("reliability")
    g.add_argument(
        "--watchdog",
        type=float,
        default=d.watchdog,
        help="end the job when one wait lasts longer than this many seconds; 0 turns it off (default 120)",
    )
    g.add_argument(
        "--check-collectives",
        action="store_true",
        help="before each collective, its group compares op, category, bytes and dtype",
    )
    g.add_argument(
        "--inject",
        default=None,
        help="a fault, for teaching: kill|stall|nan|desync@rank=R,step=S (stall: ,seconds=T)",
    )
    g = p.add_argument_group("output")
    g.add_argument("--metrics-out", default=None, help="write the metrics JSON here (rank 0)")
    g.add_argument("--weights-out", default=None, help="write the final full-shape weights (.npz, rank 0)")
    g.add_argument("--trace", default=None, help="write a Chrome trace JSON (open in Perfetto)")
    g.add_argument("--quiet", action="store_true")
    if not tour:
        g = p.add_argument_group("checkpoints")
        g.add_argument(
            "--checkpoint-dir",
            default=None,
            help="write full-shape checkpoints here (rank 0): DIR/step-000040/, the newest 3 kept",
        )
        g.add_argument(
            "--checkpoint-every",
            type=int,
            default=None,
            help="every N steps, and at the end (default: the end)",
        )
        g.add_argument(
            "--resume",
            default=None,
            help="continue from a checkpoint folder, in any layout; auto: the newest complete one in "
            "--checkpoint-dir (none yet: start fresh)",
        )


def config_from_args(args: argparse.Namespace) -> RunConfig:
    layers = args.layers
    if layers is None:
        layers = DEFAULT_LAYERS.get(args.dataset)
    cfg = RunConfig(
        layers=layers or [],
        activation=args.activation,
        arch=args.arch,
        dtype=args.dtype,
        precision=args.precision,
        loss_scale=args.loss_scale,
        seed=args.seed,
        experts=args.experts,
        top_k=args.top_k,
        capacity_factor=args.capacity_factor,
        aux_loss_coef=args.aux_loss_coef,
        ep=getattr(args, "ep", 1),
        alltoall=getattr(args, "alltoall", "pairwise"),
        dataset=args.dataset,
        samples=args.samples,
        data_dir=args.data_dir,
        data_source=args.data_source,
        batch=args.batch,
        steps=args.steps,
        epochs=args.epochs,
        lr=args.lr,
        momentum=args.momentum,
        optimizer=args.optimizer,
        grad_accum=args.grad_accum,
        dp=getattr(args, "dp", None),
        tp=getattr(args, "tp", 1),
        sp=getattr(args, "sp", False),
        pp=getattr(args, "pp", 1),
        zero=getattr(args, "zero", 0),
        stage_layers=getattr(args, "stage_layers", None),
        schedule=args.schedule,
        microbatches=args.microbatches,
        virtual_stages=args.virtual_stages,
        recompute=args.recompute,
        bucket_mb=args.bucket_mb,
        overlap=not args.no_overlap,
        collectives=args.collectives,
        kernels=args.kernels,
        clock=args.clock,
        hardware=args.hardware,
        compute=args.compute,
        watchdog=args.watchdog,
        check_collectives=args.check_collectives,
        inject=args.inject,
        metrics_out=args.metrics_out,
        weights_out=args.weights_out,
        trace=args.trace,
        quiet=args.quiet,
        checkpoint_dir=getattr(args, "checkpoint_dir", None),
        checkpoint_every=getattr(args, "checkpoint_every", None),
        resume=getattr(args, "resume", None),
    )
    if not cfg.layers:
        raise SimparError(
            f"--dataset {args.dataset} needs --layers (input width first, number of classes last)"
        )
    return cfg


def train_command(args: argparse.Namespace) -> int:
    from ..run.loop import train_main

    return train_main(config_from_args(args))
