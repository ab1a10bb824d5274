"""Datasets and the DistributedSampler."""

import gzip

import numpy as np
import pytest

from simpar.config import RunConfig, SimparError
from simpar.run.data import distributed_sampler, global_batches, load_dataset, read_idx


def write_idx(path, array):
    array = np.asarray(array, dtype=np.uint8)
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    data = header + array.tobytes()
    if str(path).endswith(".gz"):
        data = gzip.compress(data)
    path.write_bytes(data)


def write_idx_set(folder, n_train, n_test, gz=False):
    rng = np.random.default_rng(0)
    sfx = ".gz" if gz else ""
    write_idx(folder / f"train-images-idx3-ubyte{sfx}", rng.integers(0, 256, (n_train, 28, 28)))
    write_idx(folder / f"train-labels-idx1-ubyte{sfx}", rng.integers(0, 10, n_train))
    write_idx(folder / f"t10k-images-idx3-ubyte{sfx}", rng.integers(0, 256, (n_test, 28, 28)))
    write_idx(folder / f"t10k-labels-idx1-ubyte{sfx}", rng.integers(0, 10, n_test))


def test_digits_split_and_normalisation():
    d = load_dataset(RunConfig())
    assert d.x_train.shape == (1500, 64) and d.x_val.shape == (297, 64)
    assert d.x_train.dtype == np.float32 and 0 <= d.x_train.min() and d.x_train.max() <= 1
    assert set(np.unique(d.y_train)) == set(range(10))


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_idx_loader(tmp_path, gz):
    write_idx_set(tmp_path, 30, 7, gz=gz)
    d = load_dataset(RunConfig(dataset="mnist", data_dir=str(tmp_path), layers=[784, 16, 10], batch=8))
    assert d.x_train.shape == (30, 784) and d.x_val.shape == (7, 784) and d.y_train.dtype == np.int64
    assert d.x_train.max() <= 1.0


def test_truncated_idx_is_reported(tmp_path):
    write_idx(tmp_path / "x", np.zeros((3, 4)))
    raw = (tmp_path / "x").read_bytes()
    (tmp_path / "x").write_bytes(raw[:-2])
    with pytest.raises(SimparError, match="truncated"):
        read_idx(str(tmp_path / "x"))


def test_synthetic_any_size_and_width():
    d = load_dataset(RunConfig(dataset="synthetic", samples=500, layers=[300, 64, 7], batch=32))
    assert d.x_train.shape == (400, 300) and d.x_val.shape == (100, 300)
    assert d.y_train.max() < 7 and len(np.unique(d.y_train)) > 2


def test_sampler_partitions_every_batch():
    for epoch, rows in global_batches(100, 30, seed=1, steps=6):
        parts = [distributed_sampler(rows, 4, r) for r in range(4)]
        assert np.array_equal(np.concatenate(parts), rows)
        assert max(map(len, parts)) - min(map(len, parts)) <= 1
    epochs = [e for e, _ in global_batches(100, 30, 1, 6)]
    assert epochs == [0, 0, 0, 1, 1, 1]
