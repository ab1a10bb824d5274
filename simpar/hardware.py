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
  local          this machine, measured by `python -m simpar bench --calibrate` and cached in
                 ~/.cache/simpar/hardware-local.json; documented defaults if there is no cache.
  dgx-h100       one DGX H100 node: 8 H100 SXM GPUs on NVLink 4 (NVSwitch).
  ib-cluster     DGX H100 nodes joined by 400 Gb/s NDR InfiniBand, one ConnectX-7 NIC per GPU.
  ethernet-100g  8-GPU H100 nodes with a single 100 Gb/s Ethernet NIC (RoCE) per node.
  FILE.json      your own: the keys of `Hardware` (see `to_dict`), e.g. a calibrated file.

Every number below says where it comes from. Peak numbers are vendor spec sheets; "achievable"
fractions are the usual rule of thumb, stated as such -- change them in a JSON file if you know better.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field

from .config import SimparError

GB = 1e9


@dataclass
class Hardware:
    name: str
    description: str
    flops: dict                    # precision ("fp64" | "fp32" | "mixed") -> achievable FLOP/s per device
    gamma: float                   # s per byte reduced (dst += src), on the device
    intra_alpha: float             # s, latency of one message inside a node
    intra_bw: float                # bytes/s a device sends inside a node (per direction)
    devices_per_node: int          # ranks per node; a group larger than this leaves the node
    inter_alpha: float = 0.0       # s, latency of one message between nodes
    nic_bw: float = 0.0            # bytes/s of ONE network card (per direction)
    nics_per_node: int = 0
    memory_bytes: float = 0.0      # device memory (0: unknown, no limit check by default)
    intra_name: str = "intra-node"
    inter_name: str = "inter-node"
    sources: list = field(default_factory=list)
    cores: int = 0                 # CPU cores for ranks (local profile): more ranks than cores share them
    layer_overhead: float = 0.0    # s per layer per micro-batch (forward + backward) that is neither
                                   # math nor memory: Python and NumPy call overhead here; 0 for presets

    def compute_share(self, ranks_per_node: int) -> float:
        """The fraction of a device one rank gets: 1, or cores/ranks when ranks outnumber cores
        (`mpiexec -n 4` on 2 cores: every rank computes at half speed)."""
        return min(1.0, self.cores / ranks_per_node) if self.cores else 1.0

    def to_dict(self) -> dict:
        return asdict(self)

    def flop_rate(self, precision: str) -> float:
        return self.flops.get(precision) or self.flops["fp32"]


# -- presets -----------------------------------------------------------------------------------------

# H100 SXM5 (NVIDIA H100 Tensor Core GPU datasheet): dense peaks, no sparsity --
#   FP64 tensor core 67 TFLOP/s, TF32 tensor core 494.5 TFLOP/s, BF16/FP16 tensor core 989.4 TFLOP/s;
#   80 GB HBM3 at 3.35 TB/s; NVLink 4: 900 GB/s per GPU, i.e. 450 GB/s per direction.
# Achievable fraction: 50% of the dense peak for the large GEMMs of training (a model-FLOP
# utilisation of 40-55% is what well-tuned LLM training reports, e.g. the PaLM and Megatron papers).
_H100_FLOPS = {"fp64": 0.5 * 67e12, "fp32": 0.5 * 494.5e12, "mixed": 0.5 * 989.4e12}
# A reduction reads two operands and writes one: 3 bytes of HBM traffic per byte reduced at 3.35 TB/s.
_H100_GAMMA = 3 / 3.35e12
_NVLINK_SOURCES = [
    "NVIDIA H100 Tensor Core GPU datasheet: 989.4 TFLOP/s dense BF16, 67 TFLOP/s FP64 TC, 80 GB HBM3 3.35 TB/s",
    "NVLink 4 / NVSwitch (DGX H100 user guide): 900 GB/s per GPU bidirectional = 450 GB/s per direction; "
    "we assume 80% of it (360 GB/s), the bus bandwidth nccl-tests typically reports for all-reduce on DGX H100",
    "latency: NCCL's per-hop launch+sync cost on NVLink is a few microseconds; 3 us assumed",
    "achievable compute: 50% of the dense peak (typical model-FLOP utilisation of large-model training)",
]

PRESETS = {
    "dgx-h100": Hardware(
        name="dgx-h100", description="1 DGX H100 node: 8 x H100 SXM on NVLink 4",
        flops=_H100_FLOPS, gamma=_H100_GAMMA, intra_alpha=3e-6, intra_bw=360 * GB, devices_per_node=8,
        inter_alpha=5e-6, nic_bw=45 * GB, nics_per_node=8, memory_bytes=80e9,
        intra_name="NVLink4", inter_name="IB-NDR", sources=_NVLINK_SOURCES),
    "ib-cluster": Hardware(
        name="ib-cluster", description="DGX H100 nodes (8 GPUs, NVLink 4) joined by 400 Gb/s NDR InfiniBand, 1 NIC per GPU",
        flops=_H100_FLOPS, gamma=_H100_GAMMA, intra_alpha=3e-6, intra_bw=360 * GB, devices_per_node=8,
        inter_alpha=6e-6, nic_bw=45 * GB, nics_per_node=8, memory_bytes=80e9,
        intra_name="NVLink4", inter_name="IB-NDR",
        sources=_NVLINK_SOURCES + [
            "NVIDIA ConnectX-7 / Quantum-2 NDR: 400 Gb/s = 50 GB/s per port per direction; DGX H100 has 8 "
            "compute NICs, one per GPU; we assume 90% (45 GB/s) achievable",
            "latency: ~1-2 us IB hardware + NCCL proxy overhead; 6 us assumed per inter-node message"]),
    "ethernet-100g": Hardware(
        name="ethernet-100g", description="8 x H100 nodes with ONE 100 Gb/s Ethernet NIC (RoCE v2) per node",
        flops=_H100_FLOPS, gamma=_H100_GAMMA, intra_alpha=3e-6, intra_bw=360 * GB, devices_per_node=8,
        inter_alpha=20e-6, nic_bw=11 * GB, nics_per_node=1, memory_bytes=80e9,
        intra_name="NVLink4", inter_name="100GbE",
        sources=_NVLINK_SOURCES + [
            "100 GbE (IEEE 802.3 100GBASE): 12.5 GB/s per direction; ~88% achievable with RoCE v2 (11 GB/s)",
            "latency: RoCE ~5-10 us, TCP 20-50 us; 20 us assumed (NCCL over sockets/RoCE)"]),
}

# What `local` is when nothing was calibrated: one core of a 2020s x86 laptop/server running
# NumPy + OpenBLAS single-threaded (~25 GFLOP/s fp64, ~50 fp32 measured on the machine simpar was
# written on), MPICH shared-memory messages (~1 us latency, ~5 GB/s for large messages), and
# numpy.add from main memory at ~10 GB/s of reduced data (measured: 9.2) -> gamma = 1/10e9.
LOCAL_DEFAULTS = Hardware(
    name="local", description="this machine, uncalibrated defaults (run `python -m simpar bench --calibrate`)",
    flops={"fp64": 25e9, "fp32": 50e9, "mixed": 50e9}, gamma=1 / 10e9,
    intra_alpha=1e-6, intra_bw=5 * GB, devices_per_node=1 << 30, memory_bytes=0.0,
    intra_name="shared-memory", inter_name="none", cores=os.cpu_count() or 1, layer_overhead=30e-6,
    sources=["defaults: single-core NumPy/OpenBLAS GEMM and MPICH shared memory on a typical x86 machine"])


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
    for key in ("gamma", "intra_alpha", "intra_bw"):
        value = getattr(hw, key)
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise SimparError(f"{where}: {key} must be a non-negative number, got {value!r}")
    if not isinstance(hw.flops, dict) or "fp32" not in hw.flops:
        raise SimparError(f"{where}: flops must map precisions to FLOP/s and include 'fp32'")
    return hw


def load(name_or_file: str = "local") -> Hardware:
    """A preset by name, `local` (calibrated cache or defaults), or a JSON file."""
    if name_or_file in PRESETS:
        return PRESETS[name_or_file]
    if name_or_file == "local":
        path = cache_path()
        if os.path.exists(path):
            return _read(path)
        return LOCAL_DEFAULTS
    if name_or_file.endswith(".json") or os.path.exists(name_or_file):
        return _read(name_or_file)
    raise SimparError(f"unknown hardware {name_or_file!r}: choose local, {', '.join(PRESETS)} or a FILE.json")


def _read(path: str) -> Hardware:
    from .report import read_json
    d = read_json(path, "hardware file")
    if not isinstance(d, dict):
        raise SimparError(f"hardware file {path} must hold a JSON object")
    return from_dict(d, path)


# -- which link a group uses -------------------------------------------------------------------------

@dataclass
class Link:
    name: str
    alpha: float       # s per message
    bw: float          # bytes/s per direction available to ONE flow of this group

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
    nics_per_node * nic_bw / (G/m), but never more than one NIC's worth.
    """
    G = hw.devices_per_node
    stride, size = {"tp": (1, tp), "dp": (tp, dp), "pp": (tp * dp, pp), "world": (1, dp * tp * pp)}[kind]
    if stride * size <= G or hw.nics_per_node <= 0:
        return Link(hw.intra_name, hw.intra_alpha, hw.intra_bw)
    members_per_node = max(1, min(size, G // stride)) if stride <= G else 1
    flows = max(1, G // members_per_node)
    per_flow = min(hw.nic_bw, hw.nics_per_node * hw.nic_bw / flows)
    return Link(hw.inter_name, hw.inter_alpha, per_flow)


# -- calibration (python -m simpar bench --calibrate) ------------------------------------------------

def measure_gemm(dtype: str, n: int = 384, seconds: float = 0.6) -> float:
    """Single-thread GEMM rate in FLOP/s (the caller has capped BLAS at one thread)."""
    import time
    import numpy as np
    a = np.random.default_rng(0).standard_normal((n, n)).astype(dtype)
    b = a.T.copy()
    a @ b
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        count += 1
    return 2.0 * n ** 3 * count / (time.perf_counter() - start)


def measure_gamma(nbytes: int = 1 << 26, seconds: float = 0.5) -> float:
    """Seconds per byte of `dst += src` (the reduction inside every reducing collective).

    On 64 MiB, i.e. from main memory, not cache: the buffers that matter (gradient buckets, the
    optimizer's sweep over all parameters) are that large; a 4 MiB measurement ran 2.4x too fast."""
    import time
    import numpy as np
    dst = np.ones(nbytes // 8)
    src = np.ones_like(dst)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        np.add(dst, src, out=dst)
        count += 1
    return (time.perf_counter() - start) / (count * dst.nbytes)


def measure_layer_overhead(repeats: int = 400) -> float:
    """Seconds per layer per micro-batch of forward + backward + optimizer on a model so small that
    its arithmetic is nothing: what remains is the cost of the calls themselves."""
    import time
    import numpy as np
    from .model import layer_backward, layer_forward, serial_store, softmax_cross_entropy
    from .optim import SGD
    store, opt = serial_store([8, 8, 8, 8, 8], "relu", 0, np.float64), SGD(0.01, 0.9)
    x, y = np.ones((1, 8)), np.zeros(1, dtype=np.int64)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        store.zero_grad()
        h, ctxs = x, []
        for layer in store.layers:
            h, ctx = layer_forward(layer, h)
            ctxs.append(ctx)
        _, g = softmax_cross_entropy(h, y, 1)
        for layer, ctx in zip(reversed(store.layers), reversed(ctxs)):
            g = layer_backward(layer, ctx, g, need_dx=layer.index > 0)
        opt.step([store.params], [store.grads])
        times.append(time.perf_counter() - start)
    return float(np.median(times)) / len(store.layers)


def pingpong_main() -> None:
    """Run on 2 ranks: fit alpha and beta from round trips of a small and a large message."""
    import time
    import numpy as np
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, peer = comm.Get_rank(), 1 - comm.Get_rank()
    result = {}
    for size, reps in ((8, 2000), (1 << 22, 40)):
        buf = np.zeros(size, dtype=np.uint8)
        for phase in ("warm", "time"):
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(reps if phase == "time" else 5):
                if rank == 0:
                    comm.Send(buf, dest=peer)
                    comm.Recv(buf, source=peer)
                else:
                    comm.Recv(buf, source=peer)
                    comm.Send(buf, dest=peer)
            result[size] = (time.perf_counter() - start) / (2 * reps)   # one-way time
    if rank == 0:
        small, big = result[8], result[1 << 22]
        alpha = small
        beta = max(big - alpha, 1e-12) / (1 << 22)
        print(json.dumps({"alpha": alpha, "beta": beta}))


def calibrate(timeout: float = 25.0) -> Hardware:
    """Measure this machine (< 30 s): GEMM rates, reduction speed, and MPI ping-pong on 2 ranks."""
    import subprocess
    import sys
    from pathlib import Path
    flops = {"fp64": measure_gemm("float64"), "fp32": measure_gemm("float32")}
    flops["mixed"] = flops["fp32"]          # NumPy has no fast half-precision GEMM: mixed runs at fp32 speed
    gamma = measure_gamma()
    mpiexec = Path(sys.executable).parent / "mpiexec"
    cmd = [str(mpiexec) if mpiexec.exists() else "mpiexec", "-n", "2", sys.executable, "-c",
           "from simpar.hardware import pingpong_main; pingpong_main()"]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SimparError(f"calibration: could not run the MPI ping-pong ({exc})") from None
    if out.returncode != 0 or not out.stdout.strip():
        raise SimparError(f"calibration: the MPI ping-pong failed: {out.stderr.strip()[-300:]}")
    pp = json.loads(out.stdout.strip().splitlines()[-1])
    try:
        memory = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        memory = 0.0
    return Hardware(
        name="local", description=f"this machine, calibrated ({os.cpu_count()} cores, 1 thread per rank)",
        flops=flops, gamma=gamma, intra_alpha=pp["alpha"], intra_bw=1.0 / pp["beta"],
        devices_per_node=1 << 30, memory_bytes=memory, intra_name="shared-memory", inter_name="none",
        cores=os.cpu_count() or 1, layer_overhead=measure_layer_overhead(),
        sources=["measured by `python -m simpar bench --calibrate`: 384x384 GEMM on one thread, numpy.add "
                 "on 64 MiB, MPI ping-pong of 8 B and 4 MiB between 2 local ranks (one-way time), "
                 "forward+backward+SGD of a 4-layer 8-wide MLP on one row (per-layer call overhead)"])
