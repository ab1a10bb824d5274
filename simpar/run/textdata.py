"""Token data for --arch gpt: byte-level text shipped with simpar, and a copy task that needs attention.

Both give the arrays of a Dataset (data.py wraps them) whose rows are SEQUENCES: x (n, s) int64
tokens, y (n, s) the next token at every position (x shifted by one), so the samplers, the
DistributedSampler and grad-accum cut them exactly as they cut the MLP's rows.

  text   simpar/ledger_tales.txt (about 8 KB of English written for simpar, public domain: CC0 1.0),
         read as bytes: token = byte value, vocabulary 256 (every byte value here is < 128, so
         --vocab 128 works too). Windows of s + 1 bytes start every STRIDE bytes; the last tenth of
         the file is held out (its windows never overlap the training windows).
  copy   [x_1 .. x_n, SEP, x_1 .. x_n] with n = s/2 random symbols 1..k (k = min(V-1, 16)), SEP = 0:
         after the separator every next token is the one n + 1 positions back, which only attention
         can fetch. The first half is random, so its loss stays near log k whatever the model does;
         `val_mask` marks the copied half, where token accuracy is measured (an untrained model: 1/k,
         a model that learned to attend: 1).
"""

from __future__ import annotations

from importlib import resources

import numpy as np

from ..errors import SimparError

TEXT_FILE = "ledger_tales.txt"
STRIDE = 4  # bytes between the starts of two training windows
COPY_SEPARATOR = 0


def text_bytes() -> np.ndarray:
    with resources.files("simpar").joinpath(TEXT_FILE).open("rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8).astype(np.int64)


def windows(tokens: np.ndarray, seq: int, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """(x, y): windows of seq + 1 tokens starting every `stride`; y is x shifted by one."""
    starts = np.arange(0, len(tokens) - seq, stride)
    w = tokens[starts[:, None] + np.arange(seq + 1)]
    return np.ascontiguousarray(w[:, :-1]), np.ascontiguousarray(w[:, 1:])


def load_text(seq: int, vocab: int) -> dict:
    tokens = text_bytes()
    if tokens.max() >= vocab:
        raise SimparError(f"--dataset text holds byte values up to {tokens.max()}: --vocab must be > that")
    cut = len(tokens) * 9 // 10
    if cut <= seq + 1 or len(tokens) - cut <= seq + 1:
        raise SimparError(f"--seq-len {seq} is too long for the text ({len(tokens)} bytes): use <= 256")
    x, y = windows(tokens[:cut], seq, STRIDE)
    xv, yv = windows(tokens[cut:], seq, seq)
    return dict(x_train=x, y_train=y, x_val=xv, y_val=yv, n_classes=vocab)


def make_copy(samples: int, seq: int, vocab: int, seed: int = 11) -> dict:
    """`samples` copy sequences (a fifth held out), drawn from a fixed seed (not --seed: the data is
    the same for every run, as the digits are)."""
    n = seq // 2
    k = min(vocab - 1, 16)
    rng = np.random.default_rng([seed, samples, seq, vocab])
    symbols = rng.integers(1, k + 1, (samples, n))
    full = np.concatenate((symbols, np.full((samples, 1), COPY_SEPARATOR), symbols), axis=1)  # s + 1
    x, y = np.ascontiguousarray(full[:, :-1]), np.ascontiguousarray(full[:, 1:])
    mask = np.zeros(seq, dtype=bool)
    mask[n:] = True  # from the separator on, the next token is a copy
    n_val = max(1, samples // 5)
    return dict(
        x_train=x[n_val:],
        y_train=y[n_val:],
        x_val=x[:n_val],
        y_val=y[:n_val],
        n_classes=vocab,
        val_mask=np.tile(mask, (n_val, 1)),
    )


def load_tokens(cfg) -> dict:
    """The Dataset fields of --dataset text or copy."""
    if cfg.dataset == "text":
        return load_text(cfg.seq_len, cfg.vocab)
    return make_copy(cfg.samples, cfg.seq_len, cfg.vocab)
