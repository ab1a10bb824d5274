"""One run's runtime: the clock, the flight recorder, the tracer and the kernel backend it uses.

A run builds one `Runtime` (run/setup.py) and hands it down: the world communicator carries it, every
group split from it carries the same one (comm.py), and the strategies give it to the layers and
optimizers they build. Nothing is kept in a process global, so two runs in one process (a notebook,
a test, the tour's layouts one after the other) never see each other's clock, recorder or kernels.

    clock     None: wall time; or a simclock.SimClock (--clock sim)
    recorder  None, or the flight.FlightRecorder (its watchdog, --check-collectives, --inject desync)
    tracer    None, or the trace.Tracer (--trace)
    kernels   the kernel backend (kernels/: numpy, numba, cuda; precision.HalfKernels for mixed runs)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import kernels as kernel_backends


@dataclass(eq=False)  # one run's: compared (and hashed) by identity
class Runtime:
    clock: object = None
    recorder: object = None
    tracer: object = None
    kernels: object = field(default=kernel_backends.NumpyKernels)


class _Sealed(Runtime):
    """A Runtime whose fields cannot be reassigned once sealed."""

    def __setattr__(self, name, value):
        if getattr(self, "_sealed", False):
            raise AttributeError(
                "runtime.PLAIN is shared by every layer built outside a run: give yours a Runtime()"
            )
        object.__setattr__(self, name, value)


# Wall time, no recorder, no tracer, the NumPy reference: what a layer built outside a run (a test, a
# benchmark) uses. Sealed, so that it cannot become a process-wide clock or kernel choice by the back door.
PLAIN = _Sealed()
PLAIN._sealed = True
