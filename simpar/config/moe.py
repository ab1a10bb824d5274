"""The mixture-of-experts option rules: --experts, --top-k, --capacity-factor, --aux-loss-coef, --ep.

config.validate calls moe_rules once the data-parallel size is known. A model with experts must have
hidden-to-hidden layers to replace, top-k and capacity that make sense, and --ep inside --dp; the
router options on a dense model are refused rather than silently ignored. The layers themselves are
simpar/moe.py, expert parallelism parallel/expert.py.
"""

from __future__ import annotations

import math

from ..errors import require


def moe_rules(cfg, defaults) -> None:
    """The rules of a RunConfig's experts (cfg.dp already filled in); `defaults` is RunConfig(), whose
    router options a dense model must keep."""
    if cfg.experts or cfg.ep > 1:
        expert_rules(cfg)
    else:  # routing options on a dense model would be silently ignored: a forgotten --experts, most likely
        changed = [
            flag
            for flag, field in (
                ("--top-k", "top_k"),
                ("--capacity-factor", "capacity_factor"),
                ("--aux-loss-coef", "aux_loss_coef"),
            )
            if getattr(cfg, field) != getattr(defaults, field)
        ]
        require(
            not changed, f"{', '.join(changed)}: options of a mixture of experts' router; add --experts E"
        )


def expert_rules(cfg) -> None:
    """--experts/--ep: what the MoE layers and expert parallelism need, and what they do not support."""
    require(cfg.experts >= 2 or cfg.ep == 1, f"--ep {cfg.ep} shards experts: add --experts E (E >= 2)")
    require(cfg.experts >= 2, f"--experts must be at least 2, got {cfg.experts}")
    require(
        1 <= cfg.top_k <= cfg.experts,
        f"--top-k must be between 1 and --experts {cfg.experts}, got {cfg.top_k}",
    )
    require(
        cfg.capacity_factor > 0 and math.isfinite(cfg.capacity_factor),
        f"--capacity-factor must be a positive number, got {cfg.capacity_factor}",
    )
    require(
        cfg.aux_loss_coef >= 0 and math.isfinite(cfg.aux_loss_coef),
        f"--aux-loss-coef must be a number >= 0, got {cfg.aux_loss_coef}",
    )
    require(
        cfg.n_layers >= 3,
        f"--experts replaces the hidden-to-hidden layers; --layers {','.join(map(str, cfg.layers))} has none "
        "(give at least two hidden widths, e.g. 64,128,128,10)",
    )
    require(cfg.ep >= 1 and cfg.dp % cfg.ep == 0, f"--ep {cfg.ep} must divide --dp {cfg.dp} (EP inside DP)")
    require(cfg.experts % cfg.ep == 0, f"--experts {cfg.experts} must be divisible by --ep {cfg.ep}")
    unsupported = [
        name
        for name, on in (
            ("--tp", cfg.tp > 1 and cfg.arch != "gpt"),
            ("--pp", cfg.pp > 1 and cfg.arch != "gpt"),
            ("--zero", cfg.zero > 0 and cfg.arch != "gpt"),
            ("--arch resmlp", cfg.arch == "resmlp"),
            ("--precision mixed-fp16", cfg.precision == "mixed-fp16" and cfg.arch != "gpt"),
        )
        if on
    ]
    require(
        not unsupported,
        "--experts runs serial and --dp/--ep layouts of --arch mlp and gpt; not with "
        + ", ".join(unsupported),
    )
    if cfg.arch == "gpt":  # parallel/expert_gpt.py: what the MoE transformer has not been built with yet
        # (every mesh of dp/ep, cp, tp and pp is: pipeline/context_expert_stage.py runs all of them at once).
        # --clock sim: costmodel/gpt_moe_time.py prices every mesh and --collectives algorithm (each
        # all-reduce followed rank by rank: allreduce_ends.py, tp's moe_tp_rounds.py), with its pipeline
        # and ZeRO extensions (cp's row shards on pipeline stages too: tests/mpi/runtime/test_moe_simclock.py)
        later = [
            name
            for name, on in (
                # expert_zero.py shards over dp (x cp) and edp (x cp), expert_zero_tp.py with --tp (x cp)
                ("--zero with --pp", cfg.zero > 0 and cfg.pp > 1),
            )
            if on
        ]
        require(
            not later,
            f"--arch gpt --experts runs with --dp/--ep, --cp, --tp and --pp, together too; not yet with "
            f"{', '.join(later)}",
        )
