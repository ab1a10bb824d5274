"""Validation accuracy of a model's full weights: the loop's epoch lines and the final "accuracy"."""

from __future__ import annotations

import numpy as np

from ..config import RunConfig
from ..model.mlp import predict
from .data import Dataset


def evaluate(weights, data: Dataset, activation: str, cfg: RunConfig | None = None) -> float:
    """Validation accuracy of full weights; `cfg` says the architecture (default: the MLP)."""
    x = data.x_val
    if cfg is not None and cfg.arch == "gpt":  # token accuracy (copy: on the copied half only)
        from ..model.gpt import gpt_logits, token_accuracy
        from ..model.gpt_build import gpt_units

        logits = gpt_logits(gpt_units(cfg.model), weights, x)
        return token_accuracy(logits, data.y_val, data.val_mask)
    if x.dtype.itemsize < 4:  # half precision: NumPy's half matmul is slow; float32 holds it exactly
        x = x.astype(np.float32)
        weights = [(W.astype(np.float32), b.astype(np.float32)) for W, b in weights]
    if cfg is not None and cfg.experts:
        from ..model.moe import predict_logits

        logits = predict_logits(cfg, weights, x)
    elif cfg is not None and cfg.arch == "resmlp":
        from ..model.resmlp import build_units, predict_logits

        logits = predict_logits(build_units(cfg), weights, x)
    else:
        logits = predict(weights, x, activation)
    return float(np.mean(np.argmax(logits, axis=1) == data.y_val))
