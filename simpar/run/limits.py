"""What a run may ask of the machine, and when a finite loss counts as diverged.

Memory: NumPy asked for 160 GB raises MemoryError (or the kernel's OOM killer ends one rank and
the job with it) in the middle of building the model, on one rank, with a traceback. So before
anything is allocated, each rank estimates what it will hold and compares it with the memory this
machine has free, shared among the ranks on it. The estimate is deliberately rough and on the
generous side of the truth; it only has to tell "fits" from "hopeless".

Divergence: a NaN/inf loss stops a run (train.py), but a float64 run can blow up to 1e207 and stay
finite. DIVERGENCE_FACTOR names the rule for that.
"""

from __future__ import annotations

import os

from ..config import RunConfig, SimparError
from ..units import fmt_bytes

DIVERGENCE_FACTOR = 1e6  # a loss above 1e6 x max(first step's loss, 1) has diverged


def diverged(loss: float, first: float) -> bool:
    """The rule: loss > DIVERGENCE_FACTOR x max(first step's loss, 1). Cross-entropy starts near
    ln(classes) and a healthy run only goes down; even a noisy --lr 0.5 run stays within 100x."""
    return loss > DIVERGENCE_FACTOR * max(first, 1.0)


def divergence_message(loss: float, step: int, first: float, lr: float) -> str:
    return (
        f"loss diverged to {loss:.3g} at step {step}: above {DIVERGENCE_FACTOR:g} x max(first step's "
        f"loss {first:.4g}, 1); try a smaller --lr (now {lr})"
    )


def available_bytes() -> int | None:
    """Memory this machine (or this container's cgroup) can still give, or None if unknown."""
    candidates = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    candidates.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError):
        pass
    try:  # cgroup v2: a container may have far less than the machine
        with open("/sys/fs/cgroup/memory.max") as f, open("/sys/fs/cgroup/memory.current") as g:
            limit = f.read().strip()
            if limit != "max":
                candidates.append(int(limit) - int(g.read()))
    except (OSError, ValueError):
        pass
    return min(candidates) if candidates else None


def ranks_on_this_machine(world_size: int) -> int:
    """From the launcher (MPICH's hydra, Open MPI); else assume every rank is here."""
    for var in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        if os.environ.get(var, "").isdigit():
            return max(1, int(os.environ[var]))
    return world_size


def model_bytes(cfg: RunConfig) -> int:
    """Per rank: its share of parameters, gradients and optimizer state; the full-shape float64
    draw of the largest layer (every layout initialises the full shape, then slices); activations."""
    item = 4 if cfg.dtype == "float32" else 8
    if cfg.arch == "gpt":  # parameters as gpt.py builds them; activations ~ (34 + 5 a s / h) s b h bytes
        h, s, V = cfg.hidden, cfg.seq_len, cfg.vocab
        params = (cfg.blocks * (12 * h * h + 13 * h) + (2 * V + s + 2) * h) / cfg.tp  # --tp: shards
        rows = cfg.batch / ((cfg.dp or 1) * cfg.grad_accum)
        acts = cfg.blocks * rows * s * h * (17 + cfg.heads * s / h) + rows * s * V / cfg.tp
        return int(params * item * (2 + (2 if cfg.optimizer == "adam" else 1)) + acts * item)
    widths = cfg.layers
    params = sum((a + 1) * b for a, b in zip(widths[:-1], widths[1:]))
    states = 2 if cfg.optimizer == "adam" else 1
    share = params / (cfg.tp * cfg.pp)
    largest = max(a * b for a, b in zip(widths[:-1], widths[1:]))
    rows = cfg.batch / ((cfg.dp or 1) * cfg.grad_accum)
    activations = 3 * rows * (widths[0] + sum(widths[1:]) / cfg.tp) * item
    return int(share * item * (2 + states) + largest * (8 + item) + activations)


def data_bytes(cfg: RunConfig) -> int:
    """Per loading rank: synthetic data is drawn in float64, pushed through the teacher, then cast."""
    if cfg.dataset != "synthetic":
        return 0  # digits is tiny; MNIST files are as big as they are
    item = 4 if cfg.dtype == "float32" else 8
    hidden = max(16, min(256, cfg.layers[0]))
    return int(cfg.samples * (cfg.layers[0] * (8 + item) + 2 * hidden * 8 + 16))


def check_memory(cfg: RunConfig, world_size: int) -> None:
    """Raise SimparError if the model or the synthetic data cannot fit on this machine."""
    free = available_bytes()
    if free is None:
        return
    here = ranks_on_this_machine(world_size)
    loaders = here if cfg.data_source == "local" else 1
    need_model, need_data = model_bytes(cfg), data_bytes(cfg)
    model, advice = f"--layers {','.join(map(str, cfg.layers))}", "smaller widths or more --tp/--pp ranks"
    if cfg.arch == "gpt":  # the estimate is the whole model, --tp or --pp or not
        model = f"--arch gpt --n-layers {cfg.blocks} --hidden {cfg.hidden} --seq-len {cfg.seq_len}"
        advice = "a smaller model, batch or --seq-len, or more --tp or --pp ranks"
    if need_model * here > free:
        raise SimparError(
            f"{model} needs about {fmt_bytes(need_model)} per rank ({cfg.dtype} parameters, "
            f"gradients and {cfg.optimizer} state; tp*pp = {cfg.tp * cfg.pp}), x {here} rank(s) here, "
            f"but this machine has {fmt_bytes(free)} free; use {advice}"
        )
    if need_data * loaders + need_model * here > free:
        raise SimparError(
            f"--samples {cfg.samples} needs about {fmt_bytes(need_data)} per loading rank to build the "
            f"synthetic data, x {loaders} here, but this machine has {fmt_bytes(free)} free "
            "(after the model); use fewer --samples"
        )
