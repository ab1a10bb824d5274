"""Files written safely, and JSON files the user names read with one clear error.

Files are written to a temporary name in the same folder and renamed into place, so a reader
never sees half a file (rename is atomic on POSIX) and a crash leaves the old file intact.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile

import numpy as np

from .errors import SimparError


def output_problem(outputs: dict[str, str | None], inputs=None) -> str | None:
    """Why the output files {flag: path} could not be written, or None. Checked before training,
    so a bad path costs seconds, not the run: each must be a new or regular file in a folder where
    a file can really be created (tried, so /proc, read-only mounts and full quotas show up), no two
    flags may name the same file (the second write would silently replace the first), and none may
    be, or lie inside, one of the run's `inputs` {what: file or folder} (clobber_problem)."""
    seen = {}
    for flag, path in outputs.items():
        if not path:
            continue
        clobber = clobber_problem(flag, path, inputs or {})
        if clobber:
            return clobber
        problem = _path_problem(path)
        if problem:
            return f"{flag} {path}: not a writable file path ({problem})"
        key = os.path.realpath(path)
        if key in seen:
            return f"{flag} {path}: the same file as {seen[key]}; give each output its own path"
        seen[key] = flag
    return None


def clobber_problem(flag: str, path: str, inputs) -> str | None:
    """An output that is an input (a hardware profile, a metrics file to plot, a data file, a
    checkpoint) would be destroyed by the run that reads it. `inputs`: {what: path} or [(what, path)].
    Real paths, so links and ../ count."""
    out = os.path.realpath(path)
    for what, source in inputs.items() if isinstance(inputs, dict) else inputs:
        if not source:
            continue
        src = os.path.realpath(source)
        if out == src or out.startswith(src.rstrip(os.sep) + os.sep):
            inside = "" if out == src else "inside "
            return f"{flag} {path} is {inside}{what} {source}, which this run reads or keeps; write elsewhere"
    return None


_locks: dict[str, int] = {}  # folder -> the open, locked file descriptor (held until the process ends)


def lock_folder(folder: str, flag: str) -> None:
    """Take an exclusive lock on `folder` for this process (flock on folder/.lock; the kernel drops
    it when the process dies, so a crash leaves no stale lock). Another job holding it: SimparError."""
    import fcntl

    key = os.path.realpath(folder)
    if key in _locks:
        return
    fd = os.open(os.path.join(folder, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise SimparError(
            f"{flag} {folder} is in use by another simpar job (process {holder}); "
            "wait for it to finish, or choose another folder"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    _locks[key] = fd


def _path_problem(path: str) -> str | None:
    if path.endswith(("/", os.sep)) or os.path.isdir(path):
        return "it names a folder"
    if os.path.exists(path) and not os.path.isfile(path):
        mode = os.stat(path).st_mode
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        return f"it is {kind}, not a regular file"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"folder {folder} does not exist"
    try:  # the only honest test: create a file there, as atomic_write will
        fd, tmp = tempfile.mkstemp(prefix=".simpar-check.", dir=folder)
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        return f"cannot create a file in {folder}: {exc.strerror or exc}"
    return None


def atomic_write(path: str, write_fn, binary: bool = False) -> None:
    """Write via a temporary file renamed into place; an OSError (disk full, quota, file size
    limit) becomes one SimparError and leaves neither the temporary file nor a partial `path`."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path) or path.endswith(("/", os.sep)):
        raise SimparError(f"cannot write {path}: it names a folder")
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
    except OSError as exc:
        _remove(tmp)
        raise SimparError(f"cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        _remove(tmp)
        raise


def _remove(tmp: str) -> None:
    try:
        os.unlink(tmp)
    except OSError:
        pass


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
