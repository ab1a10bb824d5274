"""A simulated cluster clock: run the real job, but let time pass as it would on other hardware.

    python -m simpar train --clock sim --hardware dgx-h100          (default: --clock wall)

With `--clock sim` every rank keeps its own simulated time, in seconds. The numerics are the real
run's -- same losses, same bytes; only the clock differs. This is the technique of trace-free MPI
simulators such as SimGrid/SMPI, applied at the one choke point simpar already has (comm.py):

* Compute advances the clock from a model of each kernel call on the chosen profile
  (`--compute model`, the default, deterministic):
      matmul of (m x k) @ (k x n)      2mkn FLOPs / the profile's FLOP rate (for this precision)
      elementwise work, reductions     bytes moved / memory bandwidth   (bandwidth = 3 / gamma:
                                       gamma is seconds per byte reduced, which reads 2 and writes 1)
      each layer's forward call        + the profile's per-layer overhead (0 on the GPU presets)
  Which calls are charged, and how many bytes each moves, is listed in model.py (charge_forward,
  charge_backward), optim.py and model.softmax_cross_entropy; with
  more ranks on a node than cores (the `local` profile), each rank computes at cores/ranks speed,
  and with every core busy, memory-bound work at the measured busy_stream_share (the cores share one
  memory bus; Hardware.stream_share).
  `--compute measured` instead charges the thread's own CPU time (`time.thread_time`, which
  oversubscription does not inflate), scaled by (this machine's GEMM rate / the profile's).
* Every point-to-point message carries its simulated arrival time in a small header message on a
  duplicate of its communicator. Headers are simulation bookkeeping, not training traffic: the
  ledger does not count them (`headers_sent` counts them apart). A message of n bytes sent at t
  on a link (alpha, bandwidth) departs when the link is free, d = max(t, free), arrives at
  d + alpha + n / bandwidth, and keeps the link busy until d + n / bandwidth: a rank's sends in
  one group go out one after another (one outgoing port per rank and group), and messages a
  collective receives in the same round come in one after another (one incoming port). A receive
  completes at max(when the rank waits, arrival).
  Links: from where the ranks sit (network.py, the profile's numbers copied in by run/setup.py): a
  group inside one node talks over the intra-node link, a group that spans nodes over the node's
  network cards (its slowest hop; Network.per_hop: each message's own two nodes instead); a profile
  given fixed `links` per group name (tests) uses those.
  On GPU profiles a ring collective's messages use the protocol NCCL's tuner would pick for it
  (`Profile.tuner`: costmodel/nccl.py's tuner as a function of plain numbers, handed in by run/setup.py;
  the clock gives it the group's size, node span and link from where its ranks sit): its per-step
  latency and bandwidth, plus its base latency once when the collective starts.
* Collectives run on one communication stream per rank and group (tp, dp, pp, world), as NCCL runs
  a communicator's kernels on a CUDA stream: in the order they were started, each beginning when
  the previous one on that group ended and not before the rank started it; their rounds are chained by
  the arrival of their messages, and the reduction
  inside them costs bytes x gamma on the stream. Compute does not wait for them until the code
  waits (data parallelism starts a bucket during backward and waits after it: that is the
  overlap). `--collectives mpi` gets the closed-form time of the ring (or Rabenseifner's
  algorithm, whichever is faster), marked modeled.
* Each step ends with the loss all-reduce, which synchronises the ranks: every rank's clock jumps
  to the latest one. Control traffic (logging, metrics) takes no simulated time.

Per step and rank, the time splits (as Holistic Trace Analysis reports it) into compute, exposed
communication (the clock waiting for a transfer or collective in progress), overlapped
communication (transfer time hidden behind compute) and idle (waiting for a peer that has not sent
yet: the pipeline bubble, stragglers). compute + exposed + idle = the step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .network import Link, Network  # noqa: F401  (Link re-exported: simclock.Link)


@dataclass
class Profile:
    """The numbers the clock needs, taken from a hardware profile for one layout (train.py builds it)."""

    name: str
    flop_rate: float  # FLOP/s one rank gets for this run's precision (shared cores included)
    gamma: float  # s per byte reduced (dst += src)
    layer_overhead: float  # s per layer forward call (Python/NumPy call cost; 0 on GPU presets)
    compute_share: float  # 1, or cores/ranks when ranks share cores
    links: dict  # communicator name -> Link: fixed links per group (used when `network` is None)
    measured_scale: float = 0.0  # --compute measured: profile seconds per local CPU second
    stream_share: float = 0.0  # memory-bound work's share (Hardware.stream_share); 0: compute_share
    host_progress: bool = False  # Hardware.host_progress: a collective runs when its rank waits for it
    network: Network | None = None  # where ranks sit: each message's link from its two ranks' nodes
    tuner: object = None  # GPU profiles: (p, nodes, bw, alpha) -> NCCL's choices for a group (nccl.py)
    reduce_gamma: float | None = None  # s per byte a collective's reduction adds (None: gamma; 0 on GPUs)


@dataclass
class StepTimes:
    step_s: float = 0.0
    compute_s: float = 0.0
    comm_exposed_s: float = 0.0
    comm_overlapped_s: float = 0.0
    idle_s: float = 0.0


class SimClock:
    """This rank's simulated time, its communication stream, and its accounting per step."""

    def __init__(self, profile: Profile, measured: bool = False):
        self.profile = profile
        self.measured = measured
        self.now = 0.0
        self.stream_free: dict = {}  # group -> when that group's collective stream is next free
        self.cursor: float | None = None  # set while a collective runs: its own time on the stream
        self.link_free: dict = {}  # group -> when this rank's outgoing link in that group is free again
        self.in_flight: dict = {}  # group -> started collectives not finished yet, oldest first
        self.override: dict = {}  # group -> Link of the protocol the running collective uses (GPU profiles)
        self.headers_sent = 0
        self.steps: list[StepTimes] = []
        self._step = StepTimes()
        self._step_start = 0.0
        self._comm_busy = 0.0
        self._cpu = time.thread_time()

    # -- compute ------------------------------------------------------------------------------------
    def compute(self, seconds: float) -> None:
        if not self.measured:
            self.now += seconds
            self._step.compute_s += seconds

    def matmul(self, m: int, k: int, n: int) -> None:
        self.compute(2.0 * m * k * n / self.profile.flop_rate)

    def stream(self, nbytes: float) -> None:
        """Memory-bound work moving `nbytes` through memory."""
        self.compute(
            nbytes * self.profile.gamma / 3 / (self.profile.stream_share or self.profile.compute_share)
        )

    def layer_call(self) -> None:
        self.compute(self.profile.layer_overhead / self.profile.compute_share)

    def sync_measured(self) -> None:
        """--compute measured: charge the CPU time this thread used since the last call."""
        if self.measured:
            cpu = time.thread_time()
            seconds = (cpu - self._cpu) * self.profile.measured_scale
            self._cpu = cpu
            self.now += seconds
            self._step.compute_s += seconds

    def reduce(self, nbytes: int) -> None:
        """`dst += src` of nbytes inside a collective: on the stream while one runs (on GPU profiles
        free: NCCL reduces inside the copy kernel, its cost is in the protocol's bandwidth)."""
        gamma = self.profile.gamma if self.profile.reduce_gamma is None else self.profile.reduce_gamma
        seconds = nbytes * gamma
        if self.cursor is not None:
            self.cursor += seconds
        else:
            self.compute(seconds)

    # -- messages -------------------------------------------------------------------------------------
    def issue_time(self) -> float:
        """When a message posted now leaves: the running collective's time, else the rank's."""
        if self.cursor is not None:
            return self.cursor
        self.sync_measured()
        return self.now

    def link(self, group: str, link: Link | None = None) -> Link:
        """The link a message on `group` uses now: the running collective's protocol, else its own
        (`link`, Communicator.link_to), else the group's fixed link."""
        return self.override.get(group) or link or self.profile.links[group]

    def collective_timing(self, group: str, call: dict | None):
        """How NCCL would run this collective on a GPU profile (the tuner chooses by its bytes per ring
        step, ceil(n/p) elements, for a group of this size, node span and link). None on CPU profiles
        and for algorithms other than the ring (their messages use their own links)."""
        if self.profile.tuner is None or not call or not call.get("ring") or call["comm"].size < 2:
            return None
        comm = call["comm"]
        link = comm.group_link()
        tuning = self.profile.tuner(comm.size, comm.node_span(), link.bandwidth, link.alpha)
        size, p = call["dtype"].itemsize, comm.size
        step = -(-(call["nbytes"] // size) // p) * size
        return tuning.choose(call["kind"], step, nvls=call.get("nvls", False))

    def send(self, group: str, peer: int, nbytes: int, link: Link | None = None) -> tuple[float, float]:
        """(when the last byte has left, when it arrives) of a message posted now on `group` (see link)."""
        link = self.link(group, link)
        depart = max(self.issue_time(), self.link_free.get(group, 0.0))
        on_wire = nbytes / link.bandwidth
        self.link_free[group] = depart + on_wire
        return depart + on_wire, depart + on_wire + link.alpha

    def receive_round(self, group: str, receives: list) -> float:
        """When the last of several messages received at once (one round of a collective) has
        arrived: they share this rank's incoming link, so their bytes arrive one after another."""
        data_end, done = float("-inf"), float("-inf")
        over = self.override.get(group)
        fixed = self.profile.links[group].alpha if group in self.profile.links else None
        own = lambda sim: fixed if getattr(sim, "alpha", None) is None else sim.alpha  # its link's alpha
        timed = sorted(
            (sim.transfer_start(), sim.completion(), over.alpha if over else own(sim)) for sim in receives
        )
        for start, arrival, alpha in timed:
            wire = arrival - alpha - start
            data_end = max(start + wire, data_end + wire)
            done = max(done, data_end + alpha)
        return done

    def wait_until(self, t: float, busy_from: float | None = None) -> None:
        """The rank blocks until t. The part after `busy_from` (a transfer or collective in progress)
        is exposed communication; before it the rank was idle, waiting for its peer to send."""
        self.sync_measured()
        if t <= self.now:
            return
        busy_from = self.now if busy_from is None else max(self.now, busy_from)
        self._step.comm_exposed_s += t - busy_from
        self._step.idle_s += busy_from - self.now
        self.now = t

    def comm_busy(self, seconds: float) -> None:
        """Record time a transfer or collective kept this rank's links busy (for the overlapped share)."""
        self._comm_busy += seconds

    # -- steps --------------------------------------------------------------------------------------
    def begin_step(self, latest: float) -> None:
        """`latest`: the largest clock over all ranks -- every step starts together."""
        self.sync_measured()
        self.now = max(self.now, latest)
        self._step, self._step_start, self._comm_busy = StepTimes(), self.now, 0.0

    def end_step(self, latest: float) -> StepTimes:
        """`latest`: the largest clock over all ranks (the loss all-reduce synchronises them)."""
        self._step.idle_s += max(0.0, latest - self.now)
        self.now = max(self.now, latest)
        s = self._step
        s.step_s = self.now - self._step_start
        s.comm_overlapped_s = max(0.0, self._comm_busy - s.comm_exposed_s)
        self.steps.append(s)
        return s


@dataclass
class SimRequest:
    """A non-blocking message under the simulated clock: the MPI requests (payload and header), the
    buffers that must stay alive, and when it completes in simulated time (a receive learns it from
    its header)."""

    requests: list
    done_at: float = 0.0
    header: object = None  # receive: the 1-element array the arrival time lands in
    keep: list = field(default_factory=list)
    busy_from: float = 0.0
    alpha: float | None = None  # receive: the latency of the link it arrives on

    def completion(self) -> float:
        """Send: when its last byte left. Receive: its arrival (the header says [transfer start, arrival])."""
        return float(self.header[1]) if self.header is not None else self.done_at

    def transfer_start(self) -> float:
        return float(self.header[0]) if self.header is not None else self.busy_from
