"""What a training run reads or keeps, so that no output file can overwrite it (files.clobber_problem).

--hardware FILE.json (or the calibrated `local` cache)   the profile
--data-dir DIR (mnist) / simpar/digits.npz (digits)      the data
--resume FOLDER                                          the checkpoint it starts from
--checkpoint-dir DIR                                     the checkpoints it writes and prunes
"""

from __future__ import annotations

import os


def run_inputs(cfg) -> dict[str, str | None]:
    """{what: file or folder} for files.output_problem; a value None is skipped."""
    from .costmodel import hardware

    profile = None
    if cfg.hardware == "local":
        profile = hardware.cache_path()
    elif cfg.hardware not in hardware.PRESETS:
        profile = cfg.hardware
    digits = os.path.join(os.path.dirname(os.path.abspath(__file__)), "digits.npz")
    return {
        "the --hardware profile": profile,
        "the --data-dir": cfg.data_dir if cfg.dataset == "mnist" else None,
        "the data file": digits if cfg.dataset == "digits" else None,
        "the --resume checkpoint": cfg.resume if cfg.resume != "auto" else None,
        "the --checkpoint-dir": cfg.checkpoint_dir,
    }
