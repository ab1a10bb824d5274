"""Checkpoints on disk: full-shape training state in plain files, never visible half-written.

    D/step-000040/
        params.npz      W0, b0, W1, b1, ...                              full shape (--arch resmlp:
                        a residual block's Wi is its flat vector, bi empty; resmlp.BlockUnit;
                        --experts E: an MoE layer's Wi is moe.pack_flat -- the router, then all E
                        experts' W, b -- and bi empty, as in --weights-out)
        optimizer.npz   velocity.W0, velocity.b0, ... (SGD with momentum)  full shape, like params
                        m.W0, v.W0, ... (Adam)
        manifest.json   format, step, sampler position, optimizer name and scalars (Adam's t),
                        the model, the config, and the size and sha256 of each .npz

Why full shape: every layout's shard (a dp replica, a ZeRO chunk, a tp column or row block, a
pipeline stage) is a slice of the full tensors, and every optimizer in optim.py is elementwise, so
its state slices the same way. One format therefore serves every layout: save on dp4, resume on
dp2xtp2, pp2, ZeRO-3 or serial. The gathering and slicing are the strategies' (Strategy.full_state,
Strategy.load_full_state); this module only writes, finds and verifies the files.

RNG: after initialisation training draws no random numbers -- weights come from (seed, layer), each
epoch's order from (seed, epoch) (data.global_batches) -- so the sampler position (the step) is the
whole state; the manifest's "rng" is null and resuming checks seed, batch and training rows instead.

Writing (world rank 0 only): everything is serialised in memory first, then written into
D/.tmp-step-N-PID/, each file and the folder fsynced, renamed to D/step-N (atomic on POSIX), and D
fsynced. A step-* folder holding a manifest.json is therefore complete. Older ones are pruned BEFORE
a new one is written (renamed to .trash-* first, so no step-* folder is ever half deleted), which
leaves no file work after a checkpoint appears. When one rank dies MPICH's mpiexec SIGKILLs the
others at once (no handler runs), so a rank 0 killed mid-write can leave a .tmp-* or .trash-*
folder; the next run with this --checkpoint-dir removes them before anything else (`prepare`).
One job per --checkpoint-dir. Arrays are .npz read with allow_pickle=False, metadata JSON: no pickle.

(Over 300 lines: writing, verifying and reading one format belong together -- every check on
load answers a step of the save.)
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
from dataclasses import dataclass, field

import numpy as np

from ..config import SimparError
from ..files import lock_folder

FORMAT, VERSION = "simpar-checkpoint", 1
KEEP = 3  # complete checkpoints kept in a --checkpoint-dir
MANIFEST = "manifest.json"
STEP_DIR = re.compile(r"^step-(\d+)$")
STALE = (".tmp-step-", ".trash-step-")  # what a killed writer can leave behind

# Fields of the run that must match the checkpoint's: the shapes and meaning of the state (model,
# optimizer) and the sampler (seed, batch). Learning rate, momentum, layout, grad-accum may change
# (and --ep, --top-k, --capacity-factor, --aux-loss-coef: routing, not the shapes of the state).
# Fields added after format version 1 was written: what a manifest without them meant.
ADDED_LATER = {"experts": 0, "blocks": 2, "hidden": 64, "heads": 4, "seq_len": 32, "vocab": 256}
MUST_MATCH = (
    ("layers", "--layers"),
    ("blocks", "--n-layers"),  # --arch gpt's shape (gpt.py)
    ("hidden", "--hidden"),
    ("heads", "--heads"),
    ("seq_len", "--seq-len"),
    ("vocab", "--vocab"),
    ("experts", "--experts"),
    ("activation", "--activation"),
    ("arch", "--arch"),
    ("dtype", "--dtype"),
    ("precision", "--precision"),
    ("optimizer", "--optimizer"),
    ("dataset", "--dataset"),
    ("batch", "--batch"),
    ("seed", "--seed"),
)


@dataclass
class FullState:
    """Training state in full shape, independent of the layout that held it.

    params  [(W_i, b_i)] for every layer
    slots   optimizer state per kind ("velocity"; or "m", "v"), each [(W_i, b_i)] shaped like params
    scalars optimizer scalars, e.g. {"t": 40} (Adam's step count)
    """

    params: list
    slots: dict = field(default_factory=dict)
    scalars: dict = field(default_factory=dict)


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"step-{step:06d}")


# -- the folder ------------------------------------------------------------------------------------


def prepare(root: str) -> None:
    """Create --checkpoint-dir if needed, lock it for this job (a second job is refused: its pruning
    and cleaning would delete the first's files), and remove what a killed writer left."""
    try:
        os.makedirs(root, exist_ok=True)
        lock_folder(root, "--checkpoint-dir")
        for name in os.listdir(root):
            if name.startswith(STALE):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    except OSError as exc:
        raise SimparError(f"--checkpoint-dir {root}: {exc.strerror or exc}") from None
    if not os.access(root, os.W_OK | os.X_OK):
        raise SimparError(f"--checkpoint-dir {root}: not a writable folder")


def complete(root: str) -> list[tuple[int, str]]:
    """[(step, path)] of the complete checkpoints in `root` (a manifest.json is written last), oldest
    first. Temporary and trash folders start with a dot and never match."""
    try:
        names = os.listdir(root)
    except OSError:
        return []
    out = []
    for name in names:
        m = STEP_DIR.match(name)
        path = os.path.join(root, name)
        if m and os.path.isfile(os.path.join(path, MANIFEST)):
            out.append((int(m.group(1)), path))
    return sorted(out)


def resolve(resume: str, root: str | None) -> str | None:
    """The checkpoint folder `--resume` names: `auto` -> the newest complete one in --checkpoint-dir
    (None if there is none: start fresh); a folder with a manifest -> itself; a --checkpoint-dir ->
    its newest complete one."""
    if resume == "auto":
        found = complete(root)
        return found[-1][1] if found else None
    if not os.path.exists(resume):
        raise SimparError(f"--resume {resume}: no such checkpoint")
    if os.path.isdir(resume) and not os.path.exists(os.path.join(resume, MANIFEST)):
        found = complete(resume)
        if found:
            return found[-1][1]
        if STEP_DIR.match(os.path.basename(os.path.normpath(resume))):
            raise SimparError(f"checkpoint {resume} is not complete (no {MANIFEST})")
        raise SimparError(f"--resume {resume}: holds no checkpoint (no {MANIFEST}, no step-* folders)")
    return resume


# -- writing ---------------------------------------------------------------------------------------


def _npz_bytes(arrays: dict) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path: str) -> None:
    """Delete a checkpoint folder without ever leaving a half-deleted step-* behind: rename first."""
    trash = os.path.join(os.path.dirname(path), f".trash-{os.path.basename(path)}-{os.getpid()}")
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def serialise(step: int, state: FullState, info: dict) -> dict[str, bytes]:
    """The files of one checkpoint, as bytes: params.npz, optimizer.npz, manifest.json.

    `info` is the rest of the manifest (train.py: sampler, optimizer name, model, config, layout).
    """
    params = {}
    for i, (W, b) in enumerate(state.params):
        params[f"W{i}"], params[f"b{i}"] = W, b
    slots = {}
    for name, layers in state.slots.items():
        for i, (W, b) in enumerate(layers):
            slots[f"{name}.W{i}"], slots[f"{name}.b{i}"] = W, b
    files = {"params.npz": _npz_bytes(params), "optimizer.npz": _npz_bytes(slots)}
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "step": step,
        **info,
        "slots": sorted(state.slots),
        "scalars": state.scalars,
        "files": {
            name: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            for name, data in files.items()
        },
    }
    files[MANIFEST] = json.dumps(manifest, indent=1).encode()
    return files


def save(root: str, step: int, state: FullState, info: dict, keep: int = KEEP) -> str:
    """Write D/step-N (rank 0): prune, write a temporary folder, fsync, rename into place."""
    files = serialise(step, state, info)  # in memory first: the folder exists only while written
    final = step_dir(root, step)
    tmp = os.path.join(root, f".tmp-{os.path.basename(final)}-{os.getpid()}")
    try:
        # Prune first, so nothing is left to do once the new checkpoint appears. Checkpoints at or
        # after this step belong to an abandoned run (we resumed from an older one): they go too.
        older = [path for s, path in complete(root) if s < step]
        doomed = older[: max(0, len(older) - (keep - 1))]
        doomed += [path for s, path in complete(root) if s >= step]
        if os.path.isdir(final) and final not in doomed:
            doomed.append(final)  # an incomplete step-N (power loss mid-write): replace it
        for path in doomed:
            _remove(path)
        os.mkdir(tmp)
        for name in sorted(files, key=lambda n: n == MANIFEST):  # the manifest last
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(files[name])
                f.flush()
                os.fsync(f.fileno())
        _fsync_dir(tmp)
        os.replace(tmp, final)
        _fsync_dir(root)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)  # e.g. the disk filled up: leave no temporary folder
        raise SimparError(f"cannot write checkpoint {final}: {exc.strerror or exc}") from None
    except BaseException:  # Ctrl-C mid-write: no temporary folder either
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


# -- reading ---------------------------------------------------------------------------------------


def load(path: str) -> tuple[dict, FullState]:
    """Read and verify a checkpoint folder: the manifest, each file's size and sha256, and every
    array's presence, shape and dtype against the manifest's model. Raises one clear SimparError."""
    manifest_path = os.path.join(path, MANIFEST)
    if not os.path.isdir(path):
        raise SimparError(f"--resume {path}: no such checkpoint")
    try:
        with open(manifest_path, "rb") as f:
            manifest = json.loads(f.read())
    except FileNotFoundError:
        raise SimparError(f"checkpoint {path} is not complete (no {MANIFEST})") from None
    except OSError as exc:
        raise SimparError(f"cannot read {manifest_path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise SimparError(f"checkpoint {manifest_path} is corrupt: not valid JSON ({exc})") from None
    _check_manifest(manifest, manifest_path)
    arrays = {}
    for name, meta in manifest["files"].items():
        arrays[name] = _read_npz(os.path.join(path, name), meta)
    layers, dtype = manifest["model"]["layers"], np.dtype(manifest["model"]["dtype"])
    units = manifest["model"].get("units")  # --arch gpt: each unit one flat vector, b empty
    n = len(units) if units else len(layers) - 1
    blocks = manifest["model"].get("arch") == "resmlp"
    experts = manifest["model"].get("experts", 0)

    def shapes(i: int) -> tuple[tuple, tuple]:
        """W_i and b_i; a resmlp block is one flat vector (2d^2 + 4d) with an empty b (resmlp.py); so
        is an MoE layer (moe.pack_flat: d_in E router weights, then E experts of d_in d_out + d_out)."""
        if units:
            return (units[i],), (0,)
        if blocks and 0 < i < n - 1:
            return (2 * layers[i] ** 2 + 4 * layers[i],), (0,)
        if experts and 0 < i < n - 1:
            return (layers[i] * experts + experts * (layers[i] * layers[i + 1] + layers[i + 1]),), (0,)
        return (layers[i], layers[i + 1]), (layers[i + 1],)

    def pair(source: dict, prefix: str, i: int, where: str):
        out = []
        for key, shape in zip((f"{prefix}W{i}", f"{prefix}b{i}"), shapes(i)):
            a = source.get(key)
            if a is None or a.shape != shape or a.dtype != dtype:
                got = "missing" if a is None else f"{a.dtype}{list(a.shape)}"
                raise SimparError(
                    f"checkpoint {where} is corrupt: {key} is {got}, the manifest says {dtype}{list(shape)}"
                )
            out.append(a)
        return tuple(out)

    where_p, where_o = os.path.join(path, "params.npz"), os.path.join(path, "optimizer.npz")
    params = [pair(arrays["params.npz"], "", i, where_p) for i in range(n)]
    slots = {
        s: [pair(arrays["optimizer.npz"], f"{s}.", i, where_o) for i in range(n)] for s in manifest["slots"]
    }
    return manifest, FullState(params, slots, dict(manifest["scalars"]))


def _check_manifest(m, where: str) -> None:
    ok = (
        isinstance(m, dict)
        and m.get("format") == FORMAT
        and isinstance(m.get("step"), int)
        and isinstance(m.get("files"), dict)
        and set(m["files"]) == {"params.npz", "optimizer.npz"}
        and isinstance(m.get("model"), dict)
        and isinstance(m["model"].get("layers"), list)
        and (len(m["model"]["layers"]) >= 2 or isinstance(m["model"].get("units"), list))
        and m["model"].get("dtype") in ("float32", "float64")
        and isinstance(m.get("slots"), list)
        and isinstance(m.get("scalars"), dict)
        and isinstance(m.get("sampler"), dict)
        and isinstance(m.get("config"), dict)
    )
    if not ok:
        raise SimparError(f"checkpoint {where} is corrupt: not a {FORMAT} manifest")
    if m.get("version") != VERSION:
        raise SimparError(
            f"checkpoint {where} is format version {m.get('version')}; this simpar reads {VERSION}"
        )


def _read_npz(path: str, meta: dict) -> dict:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise SimparError(f"checkpoint file {path} is missing") from None
    except OSError as exc:
        raise SimparError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) != meta.get("bytes"):
        raise SimparError(
            f"checkpoint file {path} is truncated or corrupt: "
            f"{len(data)} bytes, the manifest says {meta.get('bytes')}"
        )
    if hashlib.sha256(data).hexdigest() != meta.get("sha256"):
        raise SimparError(f"checkpoint file {path} is corrupt: its sha256 differs from the manifest's")
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except (ValueError, OSError, EOFError) as exc:
        raise SimparError(f"checkpoint file {path} is corrupt: {exc}") from None


def check_compatible(path: str, manifest: dict, cfg, n_train: int, steps: int) -> None:
    """Can this run continue from that checkpoint? Names the first difference as a flag."""
    saved = manifest["config"]
    for key, flag in MUST_MATCH:
        theirs, ours = saved.get(key, ADDED_LATER.get(key)), getattr(cfg, key)
        if theirs != ours:
            show = lambda v: ",".join(map(str, v)) if isinstance(v, list) else str(v)
            raise SimparError(
                f"checkpoint {path} was trained with {flag} {show(theirs)}; this run has {flag} {show(ours)}"
            )
    rows = manifest["sampler"].get("n_train")
    if rows != n_train:
        raise SimparError(f"checkpoint {path} was trained on {rows} training rows; this data has {n_train}")
    if manifest["step"] >= steps:
        raise SimparError(
            f"checkpoint {path} is at step {manifest['step']} and this run ends at step {steps}: "
            "nothing left to train (ask for more --steps or --epochs)"
        )
