"""Datasets and the DistributedSampler; with `--data-source root`, the batch scatter (data traffic).

Datasets (all return float inputs in [0, 1]-ish range and integer labels):
  digits     the UCI handwritten digits shipped with simpar (1797 8x8 images, CC BY 4.0):
             1500 rows for training, 297 held out, by a fixed permutation.
  synthetic  teacher-student classification of any size/width: inputs ~ N(0, 1), labels from a
             fixed random two-layer "teacher" network -- for scaling studies with big widths.
  mnist      local IDX files (train-images-idx3-ubyte etc., optionally .gz); nothing is downloaded.
  text, copy token sequences for --arch gpt (textdata.py): shipped byte-level text; a copy task.

How a global batch reaches the ranks: every step draws the same global row indices on every rank
(a per-epoch permutation of (seed, epoch)). Gradient accumulation cuts them into K micro-steps,
and the DistributedSampler gives data-parallel rank r the r-th of dp nearly equal parts of each
(np.array_split: uneven batches are fine). Tensor-parallel ranks of one group take the same rows;
only the first pipeline stage needs inputs and only the last needs labels.
  --data-source local  every rank reads its own rows from its own copy: no traffic at all.
  --data-source root   rank 0 alone holds the data and sends every rank its rows each step:
                       that is the `data` traffic of the ledger.
"""

from __future__ import annotations

import gzip
import os
import zlib
from dataclasses import dataclass
from importlib import resources

import numpy as np

from ..config import RunConfig, SimparError
from ..config.pipeline import loss_stage
from ..model.precision import as_wire
from .textdata import load_tokens


@dataclass
class Dataset:
    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    n_classes: int
    val_mask: np.ndarray | None = None  # sequences (textdata.py): the positions accuracy counts

    @property
    def width(self) -> int:
        return self.x_train.shape[1]


def load_digits(dtype) -> Dataset:
    with resources.files("simpar").joinpath("digits.npz").open("rb") as f, np.load(f) as z:
        images, labels = z["images"], z["labels"]
    x = (images.reshape(len(images), -1) / 16.0).astype(dtype)
    y = labels.astype(np.int64)
    order = np.random.default_rng(20_17).permutation(len(x))  # fixed split, independent of --seed
    train, val = order[:1500], order[1500:]
    return Dataset(x[train], y[train], x[val], y[val], 10)


def make_synthetic(samples: int, width: int, classes: int, dtype) -> Dataset:
    """Teacher-student data: labels are the argmax of a fixed random tanh network's outputs."""
    rng = np.random.default_rng([7, samples, width, classes])
    x = rng.standard_normal((samples, width))
    hidden = max(16, min(256, width))
    W1 = rng.standard_normal((width, hidden)) / np.sqrt(width)
    W2 = rng.standard_normal((hidden, classes)) / np.sqrt(hidden)
    y = np.argmax(np.tanh(x @ W1) @ W2, axis=1).astype(np.int64)
    n_val = max(1, samples // 5)
    return Dataset(x[n_val:].astype(dtype), y[n_val:], x[:n_val].astype(dtype), y[:n_val], classes)


def read_idx(path: str) -> np.ndarray:
    """An IDX file (the MNIST format): magic 0x00000803 images or 0x00000801 labels, big-endian dims."""
    try:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as f:
            raw = f.read()
    except OSError as exc:  # gzip.BadGzipFile is an OSError too
        raise SimparError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (EOFError, zlib.error) as exc:  # a .gz cut short, or its compressed stream damaged
        raise SimparError(f"{path} is truncated or corrupt: {exc}") from None
    if len(raw) < 8 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08 or raw[3] not in (1, 3):
        raise SimparError(f"{path} is not an IDX file of unsigned bytes (bad magic number)")
    ndim = raw[3]
    if len(raw) < 4 + 4 * ndim:
        raise SimparError(f"{path} is truncated or corrupt: the header is cut short")
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    offset = 4 + 4 * ndim
    if len(raw) - offset != int(np.prod(dims)):
        raise SimparError(
            f"{path} is truncated or corrupt: header says {dims}, found {len(raw) - offset} bytes of data"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=offset).reshape(dims)


def _find(data_dir: str, stem: str) -> str:
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx")):
        path = os.path.join(data_dir, name)
        if os.path.exists(path):
            return path
    raise SimparError(f"--data-dir {data_dir} has no {stem} (or {stem}.gz)")


def load_mnist(data_dir: str, dtype) -> Dataset:
    parts = [
        read_idx(_find(data_dir, stem))
        for stem in (
            "train-images-idx3-ubyte",
            "train-labels-idx1-ubyte",
            "t10k-images-idx3-ubyte",
            "t10k-labels-idx1-ubyte",
        )
    ]
    (xi, yi, xv, yv) = parts
    if len(xi) != len(yi) or len(xv) != len(yv):
        raise SimparError(f"{data_dir}: image and label counts differ")
    if xi.ndim < 2 or xv.ndim < 2 or yi.ndim != 1 or yv.ndim != 1:
        raise SimparError(f"{data_dir}: images must be 3-D and labels 1-D IDX files")
    if not len(xi) or not len(xv):
        raise SimparError(f"{data_dir}: the {'training' if not len(xi) else 't10k'} IDX files hold 0 rows")
    top = max(int(yi.max()), int(yv.max()))
    if top >= 10:  # the loss would index past the 10 outputs (an IndexError deep in a rank)
        raise SimparError(f"{data_dir}: a label is {top}; MNIST labels must be 0..9")
    flat = lambda a: (a.reshape(len(a), -1) / 255.0).astype(dtype)
    return Dataset(flat(xi), yi.astype(np.int64), flat(xv), yv.astype(np.int64), 10)


def load_dataset(cfg: RunConfig) -> Dataset:
    dtype = cfg.compute_dtype()  # half under --precision mixed-*: the model's input is half too
    if cfg.arch == "gpt":  # token sequences (textdata.py): integer inputs, no --layers
        data = Dataset(**load_tokens(cfg))
        if len(data.x_train) < cfg.batch:
            raise SimparError(
                f"--batch {cfg.batch} is larger than the {len(data.x_train)} training sequences"
            )
        return data
    if cfg.dataset == "digits":
        data = load_digits(dtype)
    elif cfg.dataset == "synthetic":
        data = make_synthetic(cfg.samples, cfg.layers[0], cfg.layers[-1], dtype)
    else:
        data = load_mnist(cfg.data_dir, dtype)
    if data.width != cfg.layers[0]:
        raise SimparError(
            f"--layers starts with {cfg.layers[0]} but {cfg.dataset} inputs have {data.width} features"
        )
    if cfg.layers[-1] < data.n_classes:
        raise SimparError(
            f"--layers ends with {cfg.layers[-1]} outputs but {cfg.dataset} has {data.n_classes} classes"
        )
    if len(data.x_train) < cfg.batch:
        raise SimparError(f"--batch {cfg.batch} is larger than the {len(data.x_train)} training rows")
    return data


# -- which rows each rank gets ------------------------------------------------------------------


def steps_per_epoch(n_train: int, batch: int) -> int:
    return n_train // batch  # the last, incomplete batch is dropped: every step has B rows


def total_steps(cfg: RunConfig, n_train: int) -> int:
    if cfg.steps is not None:
        return cfg.steps
    return (cfg.epochs or 10) * steps_per_epoch(n_train, cfg.batch)


def global_batches(n_train: int, batch: int, seed: int, steps: int, start: int = 0):
    """Yield (epoch, row indices) of every step's global batch from step `start` on; the same on
    every rank. An epoch's order is a function of (seed, epoch) alone, so a run resumed at `start`
    continues the very same sequence: the step number is the sampler's whole state."""
    per_epoch = steps_per_epoch(n_train, batch)
    order = None
    for step in range(start, steps):
        epoch, i = divmod(step, per_epoch)
        if i == 0 or order is None:
            order = np.random.default_rng([seed, epoch]).permutation(n_train)
        yield epoch, order[i * batch : (i + 1) * batch]


def sampler_position(step: int, n_train: int, batch: int, seed: int) -> dict:
    """Where global_batches stands after `step` steps (a checkpoint's manifest): the next step, its
    epoch and batch within the epoch, and the inputs that fix the order."""
    epoch, i = divmod(step, steps_per_epoch(n_train, batch))
    return {
        "next_step": step,
        "epoch": epoch,
        "batch_in_epoch": i,
        "n_train": n_train,
        "batch": batch,
        "seed": seed,
    }


def distributed_sampler(rows: np.ndarray, dp: int, dp_index: int) -> np.ndarray:
    """This data-parallel rank's share of a batch: the dp_index-th of dp nearly equal parts."""
    return np.array_split(rows, dp)[dp_index]


def micro_steps(rows: np.ndarray, grad_accum: int) -> list[np.ndarray]:
    return np.array_split(rows, grad_accum)


def feeder_splits(cfg) -> int:
    """Micro-steps a step is cut into before the dp split: --grad-accum G; G x M for a pipeline of MoE
    blocks, whose micro-batches are the serial run's micro-steps, each routed over the whole dp group
    (parallel/pipeline/expert_stage.py)."""
    moe_pipeline = getattr(cfg, "experts", 0) and cfg.pp > 1
    return cfg.grad_accum * (cfg.microbatches if moe_pipeline else 1)


class BatchFeeder:
    """Hands each rank the (inputs, labels) it needs for a step; moves them from rank 0 if asked."""

    def __init__(self, data: Dataset | None, cfg: RunConfig, mesh, dtype):
        self.data, self.cfg, self.mesh, self.dtype = data, cfg, mesh, np.dtype(dtype)
        self.width = cfg.layers[0] if cfg.layers else None  # gpt: token ids (no --data-source root yet)

    def _needs(self, world_rank: int) -> tuple[int, bool, bool]:
        c = self.mesh.coords_of(world_rank)
        d, p = c["dp"], c["pp"]
        return d, p == 0, p == loss_stage(self.cfg.schedule, self.mesh.pp)

    def rows_of(self, world_rank: int, rows: np.ndarray) -> list[np.ndarray]:
        d, _, _ = self._needs(world_rank)
        return [distributed_sampler(m, self.mesh.dp, d) for m in micro_steps(rows, feeder_splits(self.cfg))]

    def get(self, rows: np.ndarray) -> list[tuple[np.ndarray | None, np.ndarray | None]]:
        """This rank's (x, y) for each micro-step of the step whose global batch is `rows`."""
        world = self.mesh.world
        _, need_x, need_y = self._needs(world.rank)
        if self.cfg.data_source == "local":
            return [
                (self.data.x_train[r] if need_x else None, self.data.y_train[r] if need_y else None)
                for r in self.rows_of(world.rank, rows)
            ]
        return self._scatter_from_root(rows, need_x, need_y)

    def _scatter_from_root(self, rows, need_x, need_y):
        world = self.mesh.world
        if world.rank == 0:
            for dest in range(1, world.size):
                _, dx, dy = self._needs(dest)
                for r in self.rows_of(dest, rows):
                    if dx:  # bfloat16 rows travel as their uint16 bits (precision.as_wire)
                        x = np.ascontiguousarray(self.data.x_train[r])
                        world.send(as_wire(x), dest, "data", "scatter-batch")
                    if dy:
                        world.send(np.ascontiguousarray(self.data.y_train[r]), dest, "data", "scatter-batch")
            return [
                (self.data.x_train[r] if need_x else None, self.data.y_train[r] if need_y else None)
                for r in self.rows_of(0, rows)
            ]
        out = []
        for r in self.rows_of(world.rank, rows):
            x = np.empty((len(r), self.width), self.dtype) if need_x else None
            if need_x:
                world.recv(as_wire(x), 0, "data", "scatter-batch")
            y = world.recv(np.empty(len(r), np.int64), 0, "data", "scatter-batch") if need_y else None
            out.append((x, y))
        return out
