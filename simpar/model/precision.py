"""Mixed-precision training: half-precision weights, activations and gradients, float32 master weights.

    python -m simpar train --precision mixed-fp16 --optimizer adam --lr 0.005
    mpiexec -n 4 python -m mpi4py -m simpar train --precision mixed-bf16 --zero 2 --optimizer adam

The recipe of Micikevicius et al. 2018 ("Mixed Precision Training", sec. 3):
  * the model's weights, the activations and the gradients are half precision (IEEE float16, or
    bfloat16 from the `ml_dtypes` package): 2 bytes each, and every message moves 2-byte elements;
  * the optimizer updates a float32 MASTER copy of the weights (sec. 3.1: a half-precision update
    w + lr*g loses small updates to rounding) and keeps its state (momentum, Adam's moments) in
    float32, then rounds the updated master back into the half weights;
  * the loss is multiplied by a loss scale before backward (sec. 3.2), so that small gradients do not
    flush to zero in float16; the optimizer divides it out in float32. The scale is DYNAMIC, as in
    NVIDIA's apex / PyTorch's GradScaler: when any gradient is inf/NaN the step is SKIPPED (weights
    and optimizer state untouched) and the scale halves; after GROWTH_INTERVAL good steps in a row it
    doubles. Skipped steps are counted (metrics: precision.skipped_steps). bfloat16 has float32's
    exponent range, so it starts at scale 1 and rarely needs it (Kalamkar et al. 2019).

Memory per parameter, the ZeRO paper's accounting (Rajbhandari et al. 2020, sec. 3.1): 2 bytes of
half weights + 2 of half gradients + K of optimizer state, K = 12 for Adam (fp32 master 4, momentum 4,
variance 4); SGD keeps the master (4) and a velocity (4) with momentum. `state_nbytes` reports the
master copy as optimizer state, so ZeRO's sharding of the optimizer shards the master too (sec. 5.1).

Compute: NumPy has no fast float16 (or any bfloat16) matmul -- it would loop in C without BLAS. So
HalfKernels computes each layer in float32 from the half inputs and rounds the results (z, y, dx,
dW, db) back to half: the stored and communicated numbers are exactly half precision; only the
internal accumulation is wider, as on tensor cores (half inputs, float32 accumulators). resmlp's
LayerNorm and the zero-bubble B/W halves (model.py, resmlp.py) follow the same rule.

Layouts: serial, --dp, --zero 1/2/3, --pp and --tp (the overflow verdict is agreed over the group
whose ranks hold different gradients: ZeRO's dp group, each rank a shard; the pipeline's pp group,
each stage its layers, the last one applying the loss scale; with --tp the whole world, as tp shards
differ inside every stage -- see vote_comm). tp's f and g all-reduce half activations and gradients.
--experts (the MLP's parallel/expert.py: mixed-bf16 only; gpt's expert_gpt.py, expert_zero.py,
expert_tensor_gpt.py, pipeline/expert_stage.py, context_expert.py: both): the whole dp group votes (with
--tp or --pp the world), as ep ranks hold different experts; the router computes in float32
(moe.router_dtype) and the aux loss's gradient is scaled too.
"""

from __future__ import annotations

import numpy as np

from .mlp import softmax_cross_entropy
from .optim import make_optimizer

INITIAL_SCALE = {"mixed-fp16": 2.0**16, "mixed-bf16": 1.0}
GROWTH_INTERVAL = 2000  # good steps before the scale doubles (apex / GradScaler's default)
MIN_SCALE = 2.0**-24  # the scale never underflows to 0 however many steps overflow
# Bytes per updated parameter the mixed step moves beyond the float32 optimizer's own sweeps: the
# overflow check reads g (2), unscaling reads g and writes a float32 copy (2 + 4), rounding the
# master back reads it and writes w (4 + 2). costmodel/work.py counts the same.
CAST_BYTES = 14


class HalfKernels:
    """A kernel backend (kernels/__init__.py interface) for half-precision tensors: each call runs
    the wrapped backend in float32 on the upcast inputs and rounds every result back to `dtype`."""

    def __init__(self, inner, dtype):
        self.inner, self.dtype = inner, np.dtype(dtype)
        self.name = f"{inner.name}+{self.dtype.name}"

    def linear_act_forward(self, x, W, b, act):
        f = np.float32
        z, y = self.inner.linear_act_forward(
            x.astype(f), W.astype(f), None if b is None else b.astype(f), act
        )
        zh = z.astype(self.dtype)
        return zh, (zh if y is z else y.astype(self.dtype))  # the logits layer's y IS its z

    def linear_act_backward(self, dy, x, W, z, y, act, need_dx):
        f, h = np.float32, self.dtype
        dx, dW, db = self.inner.linear_act_backward(
            dy.astype(f), x.astype(f), W.astype(f), z.astype(f), y.astype(f), act, need_dx
        )
        return (None if dx is None else dx.astype(h)), dW.astype(h), db.astype(h)

    @staticmethod
    def reduce_add(dst, src):
        np.add(dst, src, out=dst)  # NumPy adds float16 and bfloat16 elementwise, rounding each sum

    def sgd_update(self, *args):  # the optimizer works on the float32 masters: the inner backend's
        self.inner.sgd_update(*args)

    def adam_update(self, *args):
        self.inner.adam_update(*args)

    # The passes of the float32 work are the inner backend's (the casts are charged on their own).
    def forward_passes(self, bias: bool, act: bool) -> int:
        return self.inner.forward_passes(bias, act)

    def backward_passes(self, act: bool) -> int:
        return self.inner.backward_passes(act)

    def optimizer_passes(self, name: str, momentum: bool) -> int:
        return self.inner.optimizer_passes(name, momentum)


def scaled_loss_grad(logits, labels, global_batch: int, scale: float, clock=None):
    """Softmax cross-entropy of half logits, computed in float32 (exp and log of half numbers lose
    too much), and its gradient multiplied by the loss scale BEFORE rounding to half: dL/dlogits is
    p/B, small enough for B in the thousands to lose bits in float16 unscaled."""
    loss, d = softmax_cross_entropy(logits.astype(np.float32), labels, global_batch, clock)
    d *= np.float32(scale)
    return loss, d.astype(logits.dtype)


class MixedPrecisionOptimizer:
    """A float32 optimizer (optim.py) behind a dynamic loss scaler, updating float32 masters of the
    half parameters it is given (the same arrays every step: a whole buffer or this rank's shard).

    `comm`: the group whose ranks hold different parts of the gradients (ZeRO's dp group), which must
    agree on skipping; None when every rank holds the same all-reduced gradients (data parallel)."""

    def __init__(self, inner, precision: str, comm=None, initial_scale: float | None = None):
        self.inner, self.comm = inner, comm
        self.scale = float(initial_scale or INITIAL_SCALE[precision])
        self.good_steps = 0
        self.steps = 0
        self.skipped: list[int] = []  # 1-based optimizer steps that overflowed and were skipped
        self.master: dict[int, np.ndarray] = {}

    def step(self, params: list[np.ndarray], grads: list[np.ndarray]) -> None:
        self.steps += 1
        for i, w in enumerate(params):
            if i not in self.master:  # from the half weights, as DeepSpeed's fp16 optimizer does
                self.master[i] = w.astype(np.float32)
        # A float64 sum is non-finite iff some element is inf/NaN (no false overflow of the sum).
        overflow = any(not np.isfinite(g.sum(dtype=np.float64)) for g in grads)
        if self.comm is not None and self.comm.size > 1:
            overflow = self.comm.allreduce_scalar(float(overflow)) > 0  # control: a vote, not training
        clock = self.rt.clock
        n = sum(g.size for g in grads)
        if overflow:
            self.skipped.append(self.steps)
            self.scale = max(self.scale / 2, MIN_SCALE)
            self.good_steps = 0
            if clock is not None:
                clock.stream(2 * n)
            return
        masters = [self.master[i] for i in range(len(params))]
        inv = np.float32(1 / self.scale)  # a power of two unless --loss-scale says otherwise: exact
        self.inner.step(masters, [g.astype(np.float32) * inv for g in grads])
        for w, m in zip(params, masters):
            w[...] = m.astype(w.dtype)
        if clock is not None:
            clock.stream(CAST_BYTES * n)
        self.good_steps += 1
        if self.good_steps == GROWTH_INTERVAL:
            self.scale, self.good_steps = self.scale * 2, 0

    @property
    def rt(self):
        """The run's runtime: the inner optimizer's."""
        return self.inner.rt

    def state_nbytes(self) -> int:
        return sum(m.nbytes for m in self.master.values()) + self.inner.state_nbytes()

    def summary(self) -> dict:
        return {"loss_scale": self.scale, "skipped_steps": len(self.skipped), "skipped_at": self.skipped}

    # Checkpoints: the float32 masters are one more slot beside the inner optimizer's (keyed by
    # position like them, so ZeRO's shards gather and slice the same way), and the scaler's state
    # is scalars. Resuming restores all of it: the run continues bit for bit.
    def state_slots(self) -> dict[str, dict[int, np.ndarray]]:
        return {"master": self.master, **self.inner.state_slots()}

    def state_scalars(self) -> dict:
        scaler = {"loss_scale": self.scale, "good_steps": self.good_steps, "steps": self.steps}
        return {**self.inner.state_scalars(), **scaler, "skipped_at": list(self.skipped)}

    def load_state(self, slots: dict, scalars: dict) -> None:
        self.master = {i: np.asarray(a, np.float32) for i, a in slots.get("master", {}).items()}
        self.inner.load_state({k: v for k, v in slots.items() if k != "master"}, scalars)
        self.scale = float(scalars.get("loss_scale", self.scale))
        self.good_steps = int(scalars.get("good_steps", 0))
        self.steps = int(scalars.get("steps", 0))
        self.skipped = [int(k) for k in scalars.get("skipped_at", [])]


def vote_comm(mesh, group):
    """The group that votes on skipping an overflowed step: `group` (the one whose ranks hold different
    gradients in a layout without tp), or with --tp the world: tp shards differ inside every stage and
    replica group, and one scalar all-reduce over the world covers tp x pp (dp replicas agree anyway)."""
    return mesh.world if mesh.tp > 1 else group


def build_optimizer(model, optimisation, comm=None, rt=None):
    """The run's optimizer (the optimisation section's sgd or adam, lr, momentum): optim.py's as is, or
    wrapped for the model section's --precision mixed-*. `rt`: the run's runtime (a strategy passes its
    mesh's: mesh.world.runtime; None: the plain one)."""
    opt = optimisation
    inner = make_optimizer(opt.optimizer, opt.lr, opt.momentum, *([rt] if rt is not None else []))
    return MixedPrecisionOptimizer(inner, model.precision, comm, model.loss_scale) if model.mixed else inner


def loss_grad(optimizer, logits, labels, global_batch: int):
    """(loss share, dL/dlogits), the gradient scaled by the optimizer's loss scale if it has one."""
    if isinstance(optimizer, MixedPrecisionOptimizer):
        return scaled_loss_grad(logits, labels, global_batch, optimizer.scale, optimizer.rt.clock)
    return softmax_cross_entropy(logits, labels, global_batch, optimizer.rt.clock)


# -- moving bfloat16 through MPI ---------------------------------------------------------------------
# NumPy cannot export an ml_dtypes array through the buffer protocol, so mpi4py cannot send one.
# MPI only moves bytes point to point (simpar's collectives add in NumPy), so a bfloat16 message
# travels as a uint16 VIEW of the same memory: same bytes, same count in the ledger.


def as_wire(buf: np.ndarray) -> np.ndarray:
    """`buf` itself, or for bfloat16 a uint16 view of the same memory (receives land in `buf`)."""
    return buf.view(np.uint16) if buf.dtype.char == "E" and buf.dtype.itemsize == 2 else buf


class WireComm:
    """A Communicator whose point-to-point calls pass bfloat16 buffers as uint16 views; everything
    else (size, rank, ledger, waitall, ...) is the wrapped communicator's."""

    def __init__(self, comm):
        self._comm = comm

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def send(self, buf, dest, category, op, tag=0):
        return self._comm.send(as_wire(np.ascontiguousarray(buf)), dest, category, op, tag)

    def recv(self, buf, source, category, op, tag=0):
        self._comm.recv(as_wire(buf), source, category, op, tag)
        return buf

    def isend(self, buf, dest, category, op, tag=0):
        return self._comm.isend(as_wire(buf), dest, category, op, tag)

    def irecv(self, buf, source, category, op, tag=0):
        return self._comm.irecv(as_wire(buf), source, category, op, tag)


def wire(comm, cfg):
    """`comm`, wrapped in WireComm when this run communicates bfloat16. Always the SAME wrapper for one
    communicator: collectives keep their tag counter on the object they are given (collectives/base.py),
    so two wrappers of one group (say, two pipeline chunks' tp stacks) would hand out colliding tags.
    Its one caller is the mesh (run/setup.py build_mesh), which wraps every group once as it builds it."""
    if cfg.precision != "mixed-bf16":
        return comm
    if getattr(comm, "_wire", None) is None:
        comm._wire = WireComm(comm)
    return comm._wire
