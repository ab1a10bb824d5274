"""Hardware profiles for the cost model: how fast a device computes, and how fast its links move bytes.

The time model is the alpha-beta-gamma model used to analyse MPI collectives (Thakur, Rabenseifner &
Gropp, "Optimization of Collective Communication Operations in MPICH", IJHPCA 2005):

    time of one message of n bytes = alpha + n * beta        alpha: latency (s), beta: s per byte
    time to reduce n bytes          = n * gamma               gamma: s per byte of `dst += src`
    time of a matmul of F flops     = F / flops

A profile has two kinds of link. `intra` joins the devices of one node (NVLink, or shared memory
on a laptop); `inter` joins nodes (InfiniBand, Ethernet). Which one a group of ranks uses follows
from simpar's rank layout (mesh.py: tp fastest, then dp, then pp) -- see `group_link`.

Profiles:
  local          this machine, measured by `python -m simpar bench --calibrate` (simpar/bench/calibrate.py)
                 and cached in ~/.cache/simpar/hardware-local.json; documented defaults if there is no cache.
  dgx-h100       one DGX H100 node: 8 H100 SXM GPUs on NVLink 4 (NVSwitch).
  h200           one node of 8 H200 SXM GPUs (NVLink 4, NVSwitch; 141 GB HBM3e).
  dgx-a100       one DGX A100 node: 8 A100 SXM4 80GB on NVLink 3 (NVSwitch).
  ib-cluster     DGX H100 nodes joined by 400 Gb/s NDR InfiniBand, one ConnectX-7 NIC per GPU.
  ethernet-100g  8-GPU H100 nodes with a single 100 Gb/s Ethernet NIC (RoCE) per node.
  FILE.json      your own: the keys of `Hardware` (see `to_dict`), e.g. a calibrated file.

Every GPU number says where it comes from (gpus.py); on GPU profiles a collective is priced the way
NCCL runs it (nccl.py: protocols, NVLink SHARP, every rail of a node), and `python -m simpar validate`
holds the profiles to published measurements (validation/).
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field

from ..config import SimparError
from ..files import read_json
from . import gpus, nccl
from .profile_check import check_profile

GB = 1e9


@dataclass
class Hardware:
    name: str
    description: str
    flops: dict  # precision ("fp64" | "fp32" | "mixed") -> achievable FLOP/s per device
    gamma: float  # s per byte reduced (dst += src), on the device
    intra_alpha: float  # s, latency of one message inside a node
    intra_bw: float  # bytes/s a device sends inside a node (per direction)
    devices_per_node: int  # ranks per node; a group larger than this leaves the node
    inter_alpha: float = 0.0  # s, latency of one message between nodes
    nic_bw: float = 0.0  # bytes/s of ONE network card (per direction)
    nics_per_node: int = 0
    memory_bytes: float = 0.0  # device memory (0: unknown, no limit check by default)
    intra_name: str = "intra-node"
    inter_name: str = "inter-node"
    sources: list = field(default_factory=list)
    cores: int = 0  # CPU cores for ranks (local profile): more ranks than cores share them
    busy_share: float = 1.0  # local: the part of its lone speed a rank keeps when every core runs one
    # (measured by bench --calibrate: shared caches and memory bus, lower turbo clocks); 1 for presets
    layer_overhead: float = 0.0  # s per layer per micro-batch (forward + backward) that is neither
    # math nor memory: Python and NumPy call overhead here; 0 for presets
    busy_stream_share: float = 1.0  # local: as busy_share, for memory-bound work (numpy.add on 64 MiB
    # on every core at once vs alone: the cores share one memory bus); 1 for presets
    host_progress: bool = False  # True for local: a collective moves only while its rank is inside MPI
    # (no spare core, no DMA engine), so a DDP bucket started during backward runs when the rank waits
    # for it, on the rank's own time. False for GPUs: NCCL's kernels run beside compute on their streams.
    # GPU profiles (gpus.py; nccl.py says how they are used; empty/0 on `local`: plain alpha-beta-gamma)
    ring_proto: dict = field(default_factory=dict)  # NCCL protocol -> [base s, step s NVLink, step s net,
    # share of the bus bandwidth, ceiling on 1, 2, more nodes (0: none)]
    nvls_bw: float = 0.0  # NVLink SHARP all-reduce algorithm bandwidth, bytes/s (0: none)
    nvls_lat: float = 0.0  # s, its latency
    nvls_min_ranks: int = 0  # NCCL uses NVLS above this many GPUs less one
    reduce_in_transfer: bool = False  # True on GPUs: a collective's reduction runs inside its copy kernel
    launch_s: float = 0.0  # s per kernel launch (the host's cost)
    sms: int = 0  # streaming multiprocessors: GEMM tiles run one per SM
    gemm_tile: dict = field(default_factory=dict)  # precision -> output elements per GEMM tile
    peak_flops: dict = field(default_factory=dict)  # precision -> the datasheet's dense FLOP/s, MFU's
    # denominator (empty, as on `local`: the achievable rate is the only peak known)

    def compute_share(self, ranks_per_node: int) -> float:
        """The fraction of a device one rank gets: 1; or cores/ranks when ranks outnumber cores
        (`mpiexec -n 4` on 2 cores: every rank computes at half speed); times busy_share when more
        than one rank runs on the node (measured for `local`, 1 for the GPU presets)."""
        share = min(1.0, self.cores / ranks_per_node) if self.cores else 1.0
        return share * (self.busy_share if ranks_per_node > 1 else 1.0)

    def stream_share(self, ranks_per_node: int) -> float:
        """compute_share for memory-bound work: the same core share, times busy_stream_share when more
        than one rank runs on the node (ranks of one step stream at the same moments: data parallelism's
        optimizer sweeps run together after the all-reduce)."""
        share = min(1.0, self.cores / ranks_per_node) if self.cores else 1.0
        return share * (self.busy_stream_share if ranks_per_node > 1 else 1.0)

    def to_dict(self) -> dict:
        return asdict(self)

    def flop_rate(self, precision: str) -> float:
        return self.flops.get(precision) or self.flops["fp32"]

    def peak_rate(self, precision: str) -> float:
        """The dense peak MFU divides by (PaLM's definition); the achievable rate where none is known."""
        return self.peak_flops.get(precision) or self.flop_rate(precision)


# -- presets -----------------------------------------------------------------------------------------
# Every GPU number, with its source, is in gpus.py; `simpar validate` checks them against validation/.
PRESETS = {name: Hardware(**spec) for name, spec in gpus.PRESETS.items()}

# What `local` is when nothing was calibrated: one core of a 2020s x86 laptop/server running
# NumPy + OpenBLAS single-threaded (~25 GFLOP/s fp64, ~50 fp32 measured on the machine simpar was
# written on), MPICH shared-memory messages (~1 us latency, ~5 GB/s for large messages), and
# numpy.add from main memory at ~10 GB/s of reduced data (measured: 9.2) -> gamma = 1/10e9.
LOCAL_DEFAULTS = Hardware(
    name="local",
    description="this machine, uncalibrated defaults (run `python -m simpar bench --calibrate`)",
    flops={"fp64": 25e9, "fp32": 50e9, "mixed": 50e9},
    gamma=1 / 10e9,
    intra_alpha=1e-6,
    intra_bw=5 * GB,
    devices_per_node=1 << 30,
    memory_bytes=0.0,
    intra_name="shared-memory",
    inter_name="none",
    cores=os.cpu_count() or 1,
    layer_overhead=30e-6,
    host_progress=True,
    sources=["defaults: single-core NumPy/OpenBLAS GEMM and MPICH shared memory on a typical x86 machine"],
)


def cache_path() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "simpar", "hardware-local.json")


def from_dict(d: dict, where: str) -> Hardware:
    known = set(Hardware.__dataclass_fields__)
    unknown = sorted(set(d) - known)
    if unknown:
        raise SimparError(f"{where}: unknown hardware keys {unknown} (known: {sorted(known)})")
    try:
        hw = Hardware(**d)
    except TypeError as exc:
        raise SimparError(f"{where}: {exc}") from None
    check_profile(hw, where)  # every field: its type, finite, and > 0 where something divides by it
    return hw


def load(name_or_file: str = "local") -> Hardware:
    """A preset by name, `local` (calibrated cache or defaults), or a JSON file."""
    if name_or_file in PRESETS:
        return PRESETS[name_or_file]
    if name_or_file == "local":
        path = cache_path()
        if os.path.exists(path):  # a cache written before host_progress existed is still a CPU's
            return _read(path, defaults={"host_progress": True})
        return LOCAL_DEFAULTS
    if name_or_file.endswith(".json") or os.path.exists(name_or_file):
        return _read(name_or_file)
    raise SimparError(f"unknown hardware {name_or_file!r}: choose local, {', '.join(PRESETS)} or a FILE.json")


def _read(path: str, defaults: dict | None = None) -> Hardware:
    d = read_json(path, "hardware file")
    if not isinstance(d, dict):
        raise SimparError(f"hardware file {path} must hold a JSON object")
    return from_dict({**(defaults or {}), **d}, path)


# -- which link a group uses -------------------------------------------------------------------------


@dataclass
class Link:
    name: str
    alpha: float  # s per message
    bw: float  # bytes/s per direction available to ONE flow of this group
    tuning: nccl.GroupTuning | None = None  # how a collective on it is priced (nccl.py)

    @property
    def beta(self) -> float:
        return 1.0 / self.bw if self.bw > 0 else math.inf


def group_link(hw: Hardware, kind: str, dp: int, tp: int, pp: int) -> Link:
    """The link that bounds a collective of one `kind` ("tp" | "dp" | "pp" | "world") group.

    Ranks are numbered rank = (pp_i * dp + dp_i) * tp + tp_i (mesh.py), and a node holds G
    consecutive ranks. So, with G = 8 GPUs per node:
      tp group: tp consecutive ranks              -> stays in a node while tp <= G     (NVLink)
      dp group: stride tp, spans dp*tp ranks      -> stays in a node while dp*tp <= G
      pp group: stride dp*tp, spans dp*tp*pp      -> stays in a node while dp*tp*pp <= G
    That is why Megatron puts tensor parallelism innermost: its activation all-reduces sit on the
    critical path of every layer, so they get the fastest links (Narayanan et al. 2021, sec. 3).

    A group that leaves the node is as slow as its slowest hop (a ring waits for its slowest link).
    The node's NICs are shared by every group of this kind that has members on the node: with m
    members of one group per node, G/m groups cross the node boundary at once, and each gets
    nics_per_node * nic_bw / (G/m), but never more than one NIC's worth. Node 0 is full whenever a
    group leaves it, so its count is the rule; a part-filled last node (c < G ranks, c/m groups) gives
    the same link or the simulated clock refuses the placement (run/setup.check_placement).
    """
    G = hw.devices_per_node
    stride, size = {"tp": (1, tp), "dp": (tp, dp), "pp": (tp * dp, pp), "world": (1, dp * tp * pp)}[kind]
    if stride * size <= G or hw.nics_per_node <= 0:
        return Link(
            hw.intra_name,
            hw.intra_alpha,
            hw.intra_bw,
            tuning=tuning(hw, size, 1, hw.intra_bw, hw.intra_alpha),
        )
    members_per_node = max(1, min(size, G // stride)) if stride <= G else 1
    flows = max(1, G // members_per_node)
    if hw.ring_proto:  # NCCL: one rail per member, its share of the NICs, at most the NVLink ring
        per_flow = nccl.rail_bandwidth(hw.intra_bw, hw.nic_bw, hw.nics_per_node, members_per_node, flows)
    else:
        per_flow = min(hw.nic_bw, hw.nics_per_node * hw.nic_bw / flows)
    nodes = -(-size // members_per_node)
    return Link(
        hw.inter_name, hw.inter_alpha, per_flow, tuning=tuning(hw, size, nodes, per_flow, hw.inter_alpha)
    )


def tuning(hw: Hardware, p: int, nodes: int, bw: float, alpha: float) -> nccl.GroupTuning:
    """The numbers NCCL's tuner prices a group's collectives with (nccl.GroupTuning): on `local` just
    the link's alpha and bandwidth; on GPU profiles the protocol table and NVLink SHARP."""
    proto = tuple((k, *v) for k, v in hw.ring_proto.items())
    return nccl.GroupTuning(p, nodes, bw, alpha, proto, hw.nvls_bw, hw.nvls_lat, hw.nvls_min_ranks)
