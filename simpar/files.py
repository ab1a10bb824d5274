"""Files written safely, and JSON files the user names read with one clear error.

Files are written to a temporary name in the same folder and renamed into place, so a reader
never sees half a file (rename is atomic on POSIX) and a crash leaves the old file intact.
"""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np

from .config import SimparError


def writable(path: str) -> bool:
    """Can a file be written (by rename) at `path`? Its folder must exist and be writable, and
    `path` itself must not be a folder."""
    folder = os.path.dirname(os.path.abspath(path))
    return os.path.isdir(folder) and os.access(folder, os.W_OK) and not os.path.isdir(path)


def atomic_write(path: str, write_fn, binary: bool = False) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise SimparError(f"cannot write {path}: it is a folder")
    try:
        fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise SimparError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write_fn(f)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a results file should be readable
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_json(path, what: str):
    """A JSON file the user named (metrics, hardware profile, trace), or one clear SimparError."""
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as exc:
        raise SimparError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise SimparError(f"{what} {path} is not valid JSON: {exc}") from None


def write_json(path: str, obj) -> None:
    atomic_write(path, lambda f: json.dump(obj, f, indent=1, default=_jsonable))


def _jsonable(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value)}")


def write_weights(path: str, weights) -> None:
    arrays = {}
    for i, (W, b) in enumerate(weights):
        arrays[f"W{i}"], arrays[f"b{i}"] = W, b
    atomic_write(path, lambda f: np.savez(f, **arrays), binary=True)


def write_trace(path: str, per_rank_events) -> None:
    """Chrome trace JSON (open in Perfetto / chrome://tracing): one pid per rank."""
    events = [e for rank_events in per_rank_events if rank_events for e in rank_events]
    atomic_write(path, lambda f: json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f))
