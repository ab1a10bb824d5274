"""Checkpoints inside a run: save the full-shape state every N steps, resume it under any layout.

The file format lives in checkpoint.py; these are the collective parts. Gathering the state is
collective (every rank hands its shard to rank 0); rank 0 writes, or reads and verifies, and
broadcasts the outcome (control traffic), so every rank fails or carries on together.
"""

from __future__ import annotations

import math

from .. import job
from ..config import RunConfig, SimparError, layout_name
from ..model.gpt_build import gpt_units
from ..runtime import flight
from ..runtime.comm import Communicator
from . import checkpoint
from .data import sampler_position


def resume_collectively(cfg: RunConfig, world: Communicator, n_train: int, steps: int):
    """--resume: (path, FullState, step) on every rank, or None to start fresh; FullState None when
    `--resume auto` finds the run's final step already saved (the job is done).

    Rank 0 finds, reads and verifies the checkpoint and checks it fits this run; the outcome -- an
    error, nothing to resume, or the full-shape state -- is broadcast (control traffic), so every
    rank fails or starts together.
    """
    if not cfg.resume:
        return None
    outcome = None
    if world.rank == 0:
        try:
            path = checkpoint.resolve(cfg.resume, cfg.checkpoint_dir)
            if path is None:
                print(f"simpar: no checkpoint in {cfg.checkpoint_dir} yet: starting from step 0", flush=True)
            else:
                manifest, state = checkpoint.load(path)
                # --resume auto is "rerun the same command": finding the final step saved means the job
                # already finished (it may have died after its last checkpoint), so there is nothing to do.
                done = cfg.resume == "auto" and manifest["step"] >= steps
                checkpoint.check_compatible(path, manifest, cfg, n_train, math.inf if done else steps)
                outcome = (path, None if done else state, manifest["step"])
                job.note_checkpoint(path)
                print(
                    f"simpar: {path} is at the final step {steps}: this job already finished; nothing to "
                    "train, nothing written"
                    if done
                    else f"simpar: resuming from {path} (saved by {manifest.get('layout')}) at step "
                    f"{manifest['step']} of {steps}",
                    flush=True,
                )
        except SimparError as exc:
            outcome = str(exc)
    outcome = world.bcast_object(outcome, root=0) if world.size > 1 else outcome
    if isinstance(outcome, str):
        raise SimparError(outcome)
    return outcome


def save_checkpoint(cfg: RunConfig, world: Communicator, strategy, step: int, n_train: int) -> str:
    """Gather the full-shape state to rank 0 (collective), write it there; a write error (disk full)
    is broadcast so every rank stops together. Returns the checkpoint's folder."""
    with flight.io_section(world.runtime.recorder):  # rank 0 writes while the others wait: slow, not hung
        path = _save(cfg, world, strategy, step, n_train)
    job.note_checkpoint(path)
    return path


def _save(cfg: RunConfig, world: Communicator, strategy, step: int, n_train: int) -> str:
    state = strategy.full_state()
    outcome = None
    if world.rank == 0:
        info = {
            "layout": layout_name(cfg),
            "world_size": world.size,
            "model": {
                "layers": cfg.layers,
                "activation": cfg.activation,
                "dtype": cfg.dtype,
                "arch": cfg.arch,
                "experts": cfg.experts,  # an MoE layer's W_i is moe.pack_flat (checkpoint.py)
                **({"units": [u.size for u in gpt_units(cfg.model)]} if cfg.arch == "gpt" else {}),
            },
            "optimizer": cfg.optimizer,
            "sampler": sampler_position(step, n_train, cfg.batch, cfg.seed),
            "rng": None,  # no random numbers are drawn after start (checkpoint.py)
            "config": cfg.to_dict(),
        }
        try:
            outcome = checkpoint.save(cfg.checkpoint_dir, step, state, info)
        except SimparError as exc:
            outcome = SimparError(str(exc))
    outcome = world.bcast_object(outcome, root=0) if world.size > 1 else outcome
    if isinstance(outcome, SimparError):
        raise outcome
    return outcome
