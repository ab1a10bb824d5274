"""The inputs and messages tests/unit/config/test_messages.py checks, as data: every message of the
config's `validate`, word for word, with a RunConfig's fields and a world size that trigger it
(CASES), and inputs with several problems, where the first rule in validate's order is the one
reported (PRECEDENCE)."""

from __future__ import annotations

import math

USAGE = (
    "--inject KIND@rank=R,step=S with KIND kill, stall (add ,seconds=T), nan or desync, "
    "e.g. stall@rank=1,step=3,seconds=20; got {!r}"
)
ROUTER = "options of a mixture of experts' router; add --experts E"
UNSUPPORTED = "--experts runs serial and --dp/--ep layouts of --arch mlp and gpt; not with "
GPT_MOE = "--arch gpt --experts runs with --dp/--ep, --cp, --tp and --pp, together too; not yet with "

# (RunConfig fields, world size, the message)
CASES = [
    # model
    (dict(layers=[64]), 1, "--layers needs at least an input and an output width, e.g. 64,128,10"),
    (dict(layers=[64, 0, 10]), 1, "--layers widths must be positive, got [64, 0, 10]"),
    (dict(dtype="float16"), 1, "unknown dtype 'float16' (choose from float32, float64)"),
    (dict(precision="fp8"), 1, "unknown precision 'fp8' (choose from fp32, mixed-fp16, mixed-bf16)"),
    (dict(arch="gpt2"), 1, "unknown arch 'gpt2' (choose from mlp, resmlp, gpt)"),
    (
        dict(arch="resmlp", layers=[64, 10]),
        1,
        "--arch resmlp needs equal hidden widths (the residual stream), e.g. 64,128,128,128,10; got [64, 10]",
    ),
    (
        dict(precision="mixed-fp16", dtype="float64"),
        1,
        "--precision mixed-fp16 keeps float32 master weights; drop --dtype",
    ),
    (
        dict(precision="mixed-bf16", collectives="mpi"),
        1,
        "--collectives mpi cannot sum bfloat16 (MPI has no such type); use ring, tree, ...",
    ),
    (dict(precision="mixed-fp16", loss_scale=-3.0), 1, "--loss-scale must be a positive number, got -3.0"),
    (dict(precision="mixed-bf16", loss_scale=math.inf), 1, "--loss-scale must be a positive number, got inf"),
    (
        dict(loss_scale=1.0),
        1,
        "--loss-scale sets mixed precision's loss scaler: add --precision mixed-fp16 or mixed-bf16",
    ),
    (dict(activation="sigmoid"), 1, "unknown activation 'sigmoid'"),
    (dict(seed=-1), 1, "--seed must be a non-negative integer, got -1"),
    # model: --arch gpt (its shape, its data, the layouts built for it so far)
    (dict(dataset="text"), 1, "--dataset text is token sequences: add --arch gpt"),
    (dict(arch="gpt", dataset="text", blocks=0), 1, "--n-layers must be at least 1, got 0"),
    (dict(arch="gpt", dataset="text", hidden=10, heads=4), 1, "--hidden 10 is not divisible by --heads 4"),
    (dict(arch="gpt"), 1, "--arch gpt trains on token sequences: --dataset text or copy, not digits"),
    (
        dict(arch="gpt", dataset="copy", seq_len=5),
        1,
        "--dataset copy needs an even --seq-len >= 2 (symbols, separator, copy) and --vocab >= 2",
    ),
    (
        dict(arch="gpt", dataset="text", pp=2, inject="nan@rank=0,step=1"),
        2,
        "--arch gpt does not take --inject nan (--inject nan poisons float inputs and gpt's are token ids; "
        "--data-source root scatters the MLP's float batches)",
    ),
    (
        dict(arch="gpt", dataset="text", heads=2, tp=4),
        4,
        "--heads 2 is not divisible by --tp 4: each tp rank holds whole heads",
    ),
    (
        dict(arch="gpt", dataset="text", vocab=250, tp=4),
        4,
        "--vocab 250 is not divisible by --tp 4: each tp rank holds V/tp of the vocabulary",
    ),
    (
        dict(arch="gpt", dataset="text", seq_len=30, tp=4, sp=True),
        4,
        "--sp splits every micro-step's tokens evenly over --tp 4: --seq-len 30 must be a multiple of it",
    ),
    # data
    (dict(dataset="cifar"), 1, "unknown dataset 'cifar' (choose from digits, synthetic, mnist, text, copy)"),
    (dict(data_source="nfs"), 1, "unknown data source 'nfs'"),
    (dict(samples=1), 1, "--samples must be at least 2"),
    (dict(dataset="mnist"), 1, "--dataset mnist needs --data-dir DIR with the four IDX files"),
    # optimisation
    (dict(optimizer="lamb"), 1, "unknown optimizer 'lamb' (choose from sgd, adam)"),
    (dict(batch=0), 1, "--batch must be at least 1, got 0"),
    (dict(lr=-1.0), 1, "--lr must be a positive number, got -1.0"),
    (dict(lr=math.nan), 1, "--lr must be a positive number, got nan"),
    (dict(momentum=1.0), 1, "--momentum must be in [0, 1), got 1.0"),
    (dict(grad_accum=0), 1, "--grad-accum must be at least 1"),
    (dict(steps=0), 1, "--steps must be at least 1"),
    (dict(epochs=0), 1, "--epochs must be at least 1"),
    # layout: names and values
    (
        dict(schedule="foo"),
        1,
        "unknown schedule 'foo' (choose from naive, gpipe, 1f1b, interleaved, zb-h1, zb-v)",
    ),
    (dict(recompute="some"), 1, "unknown recompute 'some' (choose from none, full, selective)"),
    (dict(collectives="hd"), 1, "unknown collectives 'hd'"),
    (dict(alltoall="ring"), 1, "unknown alltoall 'ring' (choose from pairwise, bruck)"),
    (
        dict(alltoall="bruck"),
        1,
        "--alltoall bruck picks expert parallelism's all-to-all: add --experts E --ep P (P >= 2)",
    ),
    (dict(kernels="tpu"), 1, "unknown kernels 'tpu' (choose from auto, numpy, numba, cuda)"),
    (dict(zero=4), 1, "--zero must be 0, 1, 2 or 3, got 4"),
    (dict(microbatches=0), 1, "--microbatches must be at least 1"),
    (dict(bucket_mb=0.0), 1, "--bucket-mb must be positive"),
    (dict(tp=0), 1, "--tp and --pp must be at least 1"),
    # layout: context parallelism (--cp, --cp-algo; parallel/context.py)
    (dict(cp_algo="zigzag"), 1, "unknown cp-algo 'zigzag' (choose from ring, ulysses)"),
    (dict(cp=0), 1, "--cp must be at least 1, got 0"),
    (dict(cp_algo="ulysses"), 1, "--cp-algo ulysses picks context parallelism's attention: add --cp C"),
    (dict(cp=2), 2, "--cp splits a token sequence over ranks: use it with --arch gpt"),
    (
        dict(arch="gpt", dataset="text", cp=2, seq_len=6),
        2,
        "--cp 2 cuts every sequence into 2*cp = 4 equal chunks: --seq-len 6 must be a multiple of 4",
    ),
    (
        dict(arch="gpt", dataset="text", cp=2, cp_algo="ulysses", heads=3, hidden=18),
        2,
        "--cp-algo ulysses gives each of the --cp 2 ranks whole heads: --heads 3 must be divisible by 2",
    ),
    (  # --cp with --tp (parallel/context_tensor.py): Ulysses splits a tp rank's heads over cp
        dict(arch="gpt", dataset="text", cp=2, tp=2, cp_algo="ulysses", heads=2),
        4,
        "--cp-algo ulysses with --tp 2 gives each of the --cp 2 ranks whole heads of its tp rank's "
        "heads/tp = 1: that must be divisible by 2",
    ),
    (
        dict(arch="gpt", dataset="text", cp=2, tp=4, sp=True, seq_len=4),
        8,
        "--sp with --cp 2 splits each rank's seq-len/cp = 2 tokens of a sequence evenly over --tp 4: "
        "--seq-len 4 must be a multiple of cp*tp = 8",
    ),
    (  # cp_time.py prices each rank's share; tp's blocking tree lets the clock's ranks drift apart
        dict(arch="gpt", dataset="text", cp=2, tp=2, collectives="tree", clock="sim"),
        4,
        "--clock sim with --cp, --tp does not price tp's blocking --collectives tree all-reduces "
        "exactly yet; use ring, rabenseifner, mpi or auto",
    ),
    (
        dict(arch="gpt", dataset="text", cp=2, tp=2, pp=2, collectives="ps", clock="sim"),
        8,
        "--clock sim with --cp, --tp and --pp does not price tp's blocking --collectives ps "
        "all-reduces exactly yet; use ring, rabenseifner, mpi or auto",
    ),
    (  # cp_pipeline_time.py chains a stage's ps buckets by their critical paths (ps_time.py: without --pp)
        dict(arch="gpt", dataset="text", cp=2, dp=2, pp=2, collectives="ps", clock="sim"),
        8,
        "--clock sim with --cp and --pp does not price --collectives ps over dp*cp = 4 > 2 ranks exactly "
        "yet (its buckets queue at the server); use ring, rabenseifner, tree, mpi or auto",
    ),
    (dict(arch="gpt", dataset="text", cp=3), 2, "world size 2 is not divisible by cp*tp*pp = 3*1*1 = 3"),
    # layout: what the world size, the batch and the widths must allow
    (dict(pp=2), 1, "world size 1 is not divisible by tp*pp = 1*2 = 2"),
    (dict(dp=0), 1, "--dp must be at least 1"),
    (
        dict(dp=4),
        2,
        "world size 2 does not factor into dp*tp*pp = 4*1*1 = 4; launch with mpiexec -n 4 or change the "
        "layout",
    ),
    (dict(batch=1), 2, "--batch 1 is smaller than dp*grad-accum = 2: some rank would get no rows"),
    (dict(tp=2, layers=[64, 128, 31, 10]), 2, "hidden widths [31] are not divisible by --tp 2"),
    (
        dict(sp=True),
        1,
        "--sp splits the rows of the residual stream over the tp group: use it with --arch resmlp or gpt "
        "and --tp > 1",
    ),
    (
        dict(sp=True, arch="resmlp", tp=2, batch=63),
        2,
        "--sp splits every micro-step's rows evenly over --tp 2: --batch 63 must be a multiple of "
        "dp*grad-accum*tp = 2",
    ),
    (
        dict(sp=True, arch="resmlp", tp=2, pp=2, batch=66),
        4,
        "--sp with --pp splits every micro-batch's rows evenly over --tp 2: --batch 66 must be a multiple of "
        "dp*grad-accum*microbatches*tp = 8",
    ),
    # layout: the pipeline (config/pipeline.py)
    (dict(pp=5), 5, "--pp 5 asks for more pipeline stages than the model has layers (4)"),
    (
        dict(pp=2, batch=7),
        4,
        "--batch 7 is too small for 4 micro-batches on 2 data-parallel rank(s) x 1 accumulation step(s): "
        "every micro-batch needs a row (>= 8)",
    ),
    (
        dict(recompute="full"),
        1,
        "--recompute full recomputes pipeline stages' activations: use it with --pp > 1",
    ),
    (dict(virtual_stages=0), 1, "--virtual-stages must be at least 1, got 0"),
    (
        dict(virtual_stages=2),
        1,
        "--virtual-stages 2 needs --schedule interleaved (the other schedules hold one chunk per rank)",
    ),
    (
        dict(pp=2, schedule="interleaved"),
        2,
        "--schedule interleaved needs --virtual-stages V >= 2 model chunks per rank",
    ),
    (
        dict(pp=2, schedule="interleaved", virtual_stages=2, microbatches=3),
        2,
        "--schedule interleaved needs --microbatches divisible by --pp: 3 micro-batches go round 2 stages "
        "in groups of 2 (try 4)",
    ),
    (
        dict(pp=4, schedule="interleaved", virtual_stages=2),
        4,
        "--pp 4 x --virtual-stages 2 = 8 model chunks, but the model has 4 layers",
    ),
    (
        dict(pp=4, schedule="zb-v"),
        4,
        "--schedule zb-v cuts the model into 2 x --pp 4 = 8 chunks (two per rank, in a V), but the model "
        "has 4 layers",
    ),
    (
        dict(pp=2, stage_layers=[0, 4]),
        2,
        "--stage-layers [0, 4] must give 2 positive counts summing to 4",
    ),
    # layout: the experts (config/moe.py)
    (dict(ep=2), 2, "--ep 2 shards experts: add --experts E (E >= 2)"),
    (dict(experts=1), 1, "--experts must be at least 2, got 1"),
    (dict(experts=2, top_k=5), 1, "--top-k must be between 1 and --experts 2, got 5"),
    (dict(experts=2, capacity_factor=-1.0), 1, "--capacity-factor must be a positive number, got -1.0"),
    (dict(experts=2, aux_loss_coef=math.nan), 1, "--aux-loss-coef must be a number >= 0, got nan"),
    (
        dict(experts=2, layers=[64, 128, 10]),
        1,
        "--experts replaces the hidden-to-hidden layers; --layers 64,128,10 has none (give at least two "
        "hidden widths, e.g. 64,128,128,10)",
    ),
    (dict(experts=4, ep=3), 2, "--ep 3 must divide --dp 2 (EP inside DP)"),
    (dict(experts=3, ep=2), 2, "--experts 3 must be divisible by --ep 2"),
    (dict(experts=2, zero=1), 2, UNSUPPORTED + "--zero"),
    (dict(experts=2, tp=2, pp=2), 4, UNSUPPORTED + "--tp, --pp"),
    (
        dict(experts=2, arch="resmlp", precision="mixed-fp16"),
        1,
        UNSUPPORTED + "--arch resmlp, --precision mixed-fp16",
    ),
    (  # pipeline stages' experts are not sharded (expert_zero.py, expert_zero_tp.py: no --pp)
        dict(arch="gpt", dataset="copy", experts=2, dp=2, pp=2, zero=1, clock="sim"),
        4,
        GPT_MOE + "--zero with --pp",
    ),
    (dict(top_k=1), 1, "--top-k: " + ROUTER),
    (
        dict(top_k=1, capacity_factor=2.0, aux_loss_coef=0.0),
        1,
        "--top-k, --capacity-factor, --aux-loss-coef: " + ROUTER,
    ),
    # layout: ZeRO
    (
        dict(arch="gpt", dataset="text", zero=2, pp=2, batch=8),
        2,
        "--zero 2 with --pp: gradient (and parameter) partitioning does not fit the pipeline's accumulation "
        "over micro-batches (DeepSpeed refuses it too); use --zero 1",
    ),
    (
        dict(arch="resmlp", zero=2, tp=2),
        2,
        "--zero 2 with --tp is not built yet for --arch resmlp (built: --arch gpt); use --zero 1",
    ),
    (
        dict(zero=1, collectives="tree"),
        2,
        "--zero uses ring reduce-scatter and all-gather; --collectives tree applies to all-reduce layouts "
        "only",
    ),
    # time, reliability, checkpoints
    (dict(clock="fake"), 1, "unknown clock 'fake' (choose from wall, sim)"),
    (dict(compute="guess"), 1, "unknown compute model 'guess' (choose model or measured)"),
    (dict(watchdog=-1.0), 1, "--watchdog must be a number of seconds >= 0"),
    (dict(watchdog=math.inf), 1, "--watchdog must be a number of seconds >= 0"),
    (dict(inject="kill@rank=1,step=2"), 1, "--inject kill@rank=1,step=2: no such rank"),
    (dict(inject="bogus"), 1, USAGE.format("bogus")),
    (dict(inject="kill@rank=0"), 1, USAGE.format("kill@rank=0")),
    (dict(inject="kill@rank=0,step=1,seconds=3"), 1, USAGE.format("kill@rank=0,step=1,seconds=3")),
    (dict(inject="nan@rank=0,step=x"), 1, USAGE.format("nan@rank=0,step=x")),
    (dict(inject="kill@rank=0,step=0"), 1, USAGE.format("kill@rank=0,step=0")),
    (dict(watchdog=0.5), 1, "--watchdog 0.5: give at least 1 s, or 0 to turn it off"),
    (
        dict(inject="stall@rank=0,step=2,seconds=-5"),
        1,
        "--inject stall@rank=0,step=2,seconds=-5: seconds must be a number >= 0",
    ),
    (
        dict(inject="stall@rank=0,step=2,seconds=nan"),
        1,
        "--inject stall@rank=0,step=2,seconds=nan: seconds must be a number >= 0",
    ),
    (dict(inject="kill@rank=0,step=9", steps=5), 1, "--inject kill@rank=0,step=9: step 9 is past --steps 5"),
    (dict(checkpoint_every=0), 1, "--checkpoint-every must be at least 1"),
    (dict(checkpoint_every=3), 1, "--checkpoint-every needs --checkpoint-dir DIR (where to write them)"),
    (dict(resume="auto"), 1, "--resume auto needs --checkpoint-dir DIR (where to look)"),
]

# Several problems at once: the first rule in validate's order is the one reported.
PRECEDENCE = [
    (dict(layers=[64], dataset="cifar"), 1, "--layers needs at least"),
    (dict(dataset="cifar", optimizer="lamb"), 1, "unknown dataset"),
    (dict(optimizer="lamb", dtype="float16"), 1, "unknown optimizer"),
    (dict(activation="sigmoid", schedule="foo"), 1, "unknown activation"),
    (dict(kernels="tpu", data_source="nfs"), 1, "unknown kernels"),
    (dict(data_source="nfs", clock="fake"), 1, "unknown data source"),
    (dict(compute="guess", watchdog=-1.0), 1, "unknown compute model"),
    (dict(inject="bogus", batch=0), 1, "--inject KIND@"),
    (dict(momentum=1.0, seed=-1), 1, "--momentum"),
    (dict(seed=-1, grad_accum=0), 1, "--seed"),
    (dict(epochs=0, samples=1), 1, "--epochs"),
    (dict(samples=1, zero=4), 1, "--samples"),
    (dict(tp=0, checkpoint_every=0), 1, "--tp and --pp"),
    (dict(resume="auto", dataset="mnist"), 1, "--resume auto"),
    (dict(dataset="mnist", pp=2), 1, "--dataset mnist"),
    (dict(sp=True, pp=5), 5, "--sp splits the rows"),
    (dict(pp=2, recompute="full", virtual_stages=0, experts=1), 2, "--virtual-stages must"),
    (dict(stage_layers=[9], experts=1), 1, "--stage-layers"),
    (dict(experts=2, zero=1, collectives="tree"), 2, UNSUPPORTED),
]
