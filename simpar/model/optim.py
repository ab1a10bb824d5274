"""Optimizers that update arrays in place, element by element.

Because every update is elementwise, it does not matter how the parameters are grouped: a whole
flat buffer (data parallelism), a tensor-parallel shard, or a ZeRO slice of 1/p of the model all
get exactly the numbers the serial run gets. The optimizer state (momentum, Adam moments) lives
beside the shard it updates -- which is precisely what ZeRO-1 exploits to cut memory.

The update itself is the kernel backend's (kernels/reference.py has the math): NumPy's makes a
temporary per operation, the Numba backend's is one fused sweep with the same bits. The simulated
clock charges the sweeps the backend that ran really makes (_charge: its `optimizer_passes`, counted
from its source), so a run on the Numba kernels is not charged NumPy's temporaries.
"""

from __future__ import annotations

import numpy as np

from ..runtime.context import PLAIN


class SGD:
    """SGD with (heavy-ball) momentum, as in PyTorch:  v <- mu*v + g ;  w <- w - lr*v."""

    def __init__(self, lr: float, momentum: float = 0.9, rt=PLAIN):
        self.lr, self.momentum, self.rt = lr, momentum, rt  # rt: the run's kernels and clock
        self.velocity: dict[int, np.ndarray] = {}

    def step(self, params: list[np.ndarray], grads: list[np.ndarray]) -> None:
        update = self.rt.kernels.sgd_update  # the math: kernels/reference.py
        for i, (w, g) in enumerate(zip(params, grads)):
            v = None
            if self.momentum:
                v = self.velocity.get(i)
                if v is None:
                    v = self.velocity[i] = np.zeros_like(w)
            update(w, g, v, self.lr, self.momentum)
        _charge(self.rt, params, "sgd", bool(self.momentum))

    def state_nbytes(self) -> int:
        return sum(v.nbytes for v in self.velocity.values())

    # Checkpoints: state is kept per POSITION in step()'s list; which parameters a position is, the
    # strategy knows (Strategy.optimizer_params), and it maps each to full shape and back.
    def state_slots(self) -> dict[str, dict[int, np.ndarray]]:
        return {"velocity": self.velocity}

    def state_scalars(self) -> dict:
        return {}

    def load_state(self, slots: dict, scalars: dict) -> None:
        self.velocity = dict(slots.get("velocity", {})) if self.momentum else {}


class Adam:
    """Adam (Kingma & Ba 2015, Algorithm 1) with bias correction."""

    def __init__(self, lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8, rt=PLAIN):
        self.lr, self.beta1, self.beta2, self.eps, self.rt = lr, beta1, beta2, eps, rt
        self.m: dict[int, np.ndarray] = {}
        self.v: dict[int, np.ndarray] = {}
        self.t = 0

    def step(self, params: list[np.ndarray], grads: list[np.ndarray]) -> None:
        self.t += 1
        m_scale, v_scale = 1 / (1 - self.beta1**self.t), 1 / (1 - self.beta2**self.t)
        update = self.rt.kernels.adam_update  # the math: kernels/reference.py
        for i, (w, g) in enumerate(zip(params, grads)):
            if i not in self.m:
                self.m[i], self.v[i] = np.zeros_like(w), np.zeros_like(w)
            update(w, g, self.m[i], self.v[i], self.lr, self.beta1, self.beta2, self.eps, m_scale, v_scale)
        _charge(self.rt, params, "adam", False)

    def state_nbytes(self) -> int:
        return sum(a.nbytes for a in self.m.values()) + sum(a.nbytes for a in self.v.values())

    def state_slots(self) -> dict[str, dict[int, np.ndarray]]:  # as SGD's: per position
        return {"m": self.m, "v": self.v}

    def state_scalars(self) -> dict:
        return {"t": self.t}

    def load_state(self, slots: dict, scalars: dict) -> None:
        self.m, self.v = dict(slots.get("m", {})), dict(slots.get("v", {}))
        self.t = int(scalars.get("t", 0))


def _charge(rt, params: list[np.ndarray], name: str, momentum: bool) -> None:
    """The simulated clock's cost of an update: the run's backend's sweeps over the parameters
    (reads and writes of w, g, the state and NumPy's temporaries; kernels/__init__.py) -- memory-bound
    work. The cost model writes the same table again (costmodel/passes.py)."""
    clock = rt.clock
    if clock is not None:
        passes = rt.kernels.optimizer_passes(name, momentum)
        clock.stream(passes * sum(w.nbytes for w in params))


def make_optimizer(name: str, lr: float, momentum: float, rt=PLAIN):
    """`rt`: the run's runtime (its kernels run the update, its clock is charged for it)."""
    return SGD(lr, momentum, rt) if name == "sgd" else Adam(lr, rt=rt)
