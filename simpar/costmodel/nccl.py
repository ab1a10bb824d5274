"""What a collective costs the way NCCL runs it: protocols, NVLink SHARP, rails; a GEMM by its shape.

Part of the cost model: plain arithmetic on plain numbers, so that the closed form (chunktime.py,
predict.py), the simulated clock (simclock.py, collectives/base.py) and `simpar validate` all call the
same functions. Every constant lives in a hardware profile (gpus.py), each with its source.

NCCL moves a ring collective in steps: an all-reduce over p ranks takes 2(p-1) steps, an all-gather or
reduce-scatter p-1, each moving 1/p of the buffer to the next rank. Its tuner (src/graph/tuning.cc)
prices each algorithm x protocol as

    time = base latency + steps x per-step latency + bytes on the bus / bus bandwidth

and runs the cheapest. The three protocols trade latency for bandwidth:
    LL      8-byte stores, half of them flags: lowest latency, half the bandwidth, capped per GPU
            generation and node count (llMaxBws)
    LL128   128-byte lines with a flag: middle latency, 92% of the bandwidth
    Simple  bulk copies behind a fence: highest latency, all the bandwidth
A step that crosses nodes costs the network's per-step latency instead of NVLink's.

NVLink SHARP (NVLS, Hopper + NVSwitch): the switch adds the operands up and multicasts the sum, so an
all-reduce costs about (base latency) + bytes / (its algorithm bandwidth), nearly the same for 5 to 8
GPUs; NCCL uses it only for all-reduce, on one node, above 4 GPUs.

Rails: each GPU of a DGX has its own NIC. NCCL's ring over several nodes runs many channels, each
leaving the node through a different NIC, so a group with m members on each node drives m rails:
its bus bandwidth is min(NVLink ring, m x NIC) (the multi-node points in validation/ agree).

The reduction inside a GPU collective runs in the same kernel as the copy (its cost is in the bus
bandwidth); on the CPU profile `local` it is charged apart, at gamma per byte.

Launch (the host side, `Launch` below): tuning.cc's base latency (baseLatencies, lines 149-152 at commit
5067397; ncclTopoGetAlgoTime adds it once per call, line 653) is read here as a device part plus ONE
eager kernel launch (the profile's launch_s), the launch nccl-tests pays with one process per GPU,
the setup tuning.cc's numbers were tuned on. (tuning.cc does not split it; the split is simpar's,
held by the small-message points in validation/collectives.csv.) A benchmark that launches otherwise
pays another host cost in place of that one launch: CUDA graphs, one process driving several GPUs, a
framework's call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

PROTOCOLS = ("LL", "LL128", "Simple")


@dataclass(frozen=True)
class Timing:
    """One way to run a collective: `base` once, then per step `hop` + step bytes / `bw`."""

    name: str
    base: float  # s, once per collective
    hop: float  # s, per step
    bw: float  # bytes/s on the bus (per rank and direction)

    def seconds(self, steps: int, step_bytes: float) -> float:
        return self.base + steps * (self.hop + step_bytes / self.bw)


@dataclass(frozen=True)
class GroupTuning:
    """What NCCL's tuner knows of one group, as plain numbers: its size, how many nodes it spans,
    its Simple-protocol bus bandwidth and link latency (hardware.group_link), and the profile's
    protocol table. `proto` empty: the plain alpha-beta link (the `local` profile)."""

    p: int
    nodes: int
    bw: float
    alpha: float
    proto: tuple = ()  # ((name, base_s, hop_intra_s, hop_inter_s, bw share, LL ceilings...), ...)
    nvls_bw: float = 0.0  # NVLS all-reduce algorithm bandwidth, bytes/s (0: no NVSwitch multicast)
    nvls_lat: float = 0.0
    nvls_min: int = 0

    def options(self, kind: str, nvls: bool = True) -> list[Timing]:
        """Every (algorithm, protocol) NCCL could run a `kind` collective with on this group."""
        if not self.proto:
            return [Timing("alpha-beta", 0.0, self.alpha, self.bw)]
        out = []
        for name, base, hop_intra, hop_inter, share, *ceiling in self.proto:
            bw = self.bw * share
            cap = ceiling[min(self.nodes, 3) - 1] if ceiling else 0.0
            if cap:  # LL's ceiling for this many nodes (tuning.cc llMaxBws)
                bw = min(bw, cap)
            hop = (
                hop_intra
                if self.p < 2
                else ((self.p - self.nodes) * hop_intra + (self.nodes - 1) * hop_inter) / (self.p - 1)
            )
            out.append(Timing(name, base, hop, bw))
        if nvls and kind == "all-reduce" and self.nvls_bw and self.nodes == 1 and self.p >= self.nvls_min:
            # priced as the ring's 2(p-1) steps of S/p with no per-step latency: S / nvls_bw in all
            out.append(Timing("NVLS", self.nvls_lat, 0.0, self.nvls_bw * 2 * (self.p - 1) / self.p))
        return out

    def choose(self, kind: str, step_bytes: float, nvls: bool = True, only: str = "") -> Timing:
        """The cheapest option for a ring collective moving `step_bytes` per step, as NCCL's tuner
        picks (`only`: a protocol forced, as NCCL_PROTO does). The choice depends on the step size,
        so the closed form and the simulated clock, which both know it, always agree on it."""
        steps = ring_steps(kind, self.p)
        options = [t for t in self.options(kind, nvls) if not only or t.name == only]
        return min(options, key=lambda t: t.seconds(steps, step_bytes))


def ring_steps(kind: str, p: int) -> int:
    """Steps of a ring collective: 2(p-1) for all-reduce, p-1 for all-gather, reduce-scatter and an
    all-to-all done as p-1 exchanges; 1 for one send."""
    if kind == "send-recv":
        return 1
    return 2 * (p - 1) if kind == "all-reduce" else p - 1


# -- NCCL_ALGO=Tree across nodes, one GPU per node (validation points that forced it) ----------------

# tuning.cc treeCorrectionFactor (line 623 at commit 5067397; applied in ncclTopoGetAlgoTime, line 630),
# by protocol, for nBytes/64 = 2^0 .. 2^22 (64 B .. 256 MiB): "Trees are not perfectly sticking to the
# model for medium sizes" -- NCCL multiplies the tree's bandwidth by it.
TREE_CORRECTION = {
    "LL": (1, 1, 1, 1, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1, 1, 1, 1),
    "LL128": (1, 1, 1, 1, 1, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1, 1),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
}  # fmt: skip


def tree_correction(protocol: str, nbytes: float) -> float:
    """The share of its bandwidth NCCL's tuner gives a tree all-reduce of `nbytes` (1 outside the table)."""
    log = int(math.log2(nbytes)) - 6 if nbytes >= 64 else -1
    return TREE_CORRECTION[protocol][log] if 0 <= log < len(TREE_CORRECTION[protocol]) else 1.0


def tree_options(tune: GroupTuning, tree: dict, nbytes: float) -> list[Timing]:
    """A tree all-reduce over nodes with one GPU each, as tuning.cc prices it: the tree's base latency,
    then up and down the tree, 2 log2(nodes) levels of the network's tree latency (`tree`: protocol ->
    (base s, per-level s)); its bytes as the ring's (on 2 nodes the tree is one exchange), at the ring
    protocol's bandwidth times tree_correction."""
    steps = ring_steps("all-reduce", tune.p)
    levels = 2 * math.log2(tune.nodes)
    return [
        Timing(
            f"tree/{t.name}",
            tree[t.name][0],
            levels * tree[t.name][1] / steps,
            t.bw * tree_correction(t.name, nbytes),
        )
        for t in tune.options("all-reduce", nvls=False)
    ]


def bus_factor(kind: str, p: int) -> float:
    """nccl-tests' busbw = algbw x this (doc/PERFORMANCE.md): what each rank puts on the wire."""
    if kind == "all-reduce":
        return 2 * (p - 1) / p
    if kind in ("all-gather", "reduce-scatter", "all-to-all"):
        return (p - 1) / p
    return 1.0


def rail_bandwidth(intra_bw: float, nic_bw: float, nics_per_node: int, members: int, groups: int) -> float:
    """Bus bandwidth of a group that spans nodes with `members` ranks on each, `groups` such groups
    sharing the node's NICs: each can drive one rail per member (every GPU has its own NIC), at most
    its share of the node's NICs, and never faster than the NVLink ring inside the node."""
    rails = min(members, nics_per_node / max(1, groups))
    return min(intra_bw, rails * nic_bw)


# -- launch: the host's part of a collective --------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    """How the collective was started, in nccl-tests' words (a validation point's `launch` column).

    mode         eager: one ncclAllReduce per call, each kernel launched by the host (nccl-tests'
                 default); graphs: captured in a CUDA graph that one launch replays (nccl-tests -G);
                 torch: eager, through torch.distributed (a Python and c10d call around it)
    per_process  GPUs one host thread drives (nccl-tests -g N): their N launches run one after the
                 other, and the collective starts when the last GPU's kernel does
    graph_ops    collectives per CUDA graph (nccl-tests -G M): one graph launch per GPU serves M

    The host cost of a call is per_process x launch_s (graphs: / graph_ops), plus framework_s for
    torch. tuning.cc's base latency already holds one eager launch, so a point pays the difference
    (`extra_seconds`): 0 for plain nccl-tests with one process per GPU, what the trainer also assumes.
    Checked by validation/collectives.csv: nccl-tests#123 (one process, 2-8 A100s: +4.2 us a GPU,
    2 hops and one launch), nccl#1259 (2 H100s in CUDA graphs: below tuning.cc's price) and
    nccl#583 (2 A100s from one process: above it).
    """

    mode: str = "eager"
    per_process: int = 1
    graph_ops: int = 1

    def host_seconds(self, launch_s: float, framework_s: float = 0.0) -> float:
        launches = self.per_process * launch_s
        if self.mode == "graphs":
            return launches / self.graph_ops
        return launches + (framework_s if self.mode == "torch" else 0.0)

    def label(self) -> str:
        """The launch in the `launch` column's words (parse_launch reads it back)."""
        counts = (f" g={self.per_process}" if self.per_process > 1 else "") + (
            f" G={self.graph_ops}" if self.graph_ops > 1 else ""
        )
        return self.mode + counts

    def extra_seconds(self, launch_s: float, framework_s: float = 0.0) -> float:
        """What this launch costs beyond the one eager launch inside tuning.cc's base latency."""
        return self.host_seconds(launch_s, framework_s) - launch_s


LAUNCH_MODES = ("eager", "graphs", "torch")


def parse_launch(text: str) -> Launch:
    """`eager`, `eager g=8`, `graphs g=2 G=10`, `torch` (g: GPUs per process, G: collectives per
    graph; nccl-tests' -g and -G). Empty: eager, one process per GPU."""
    words = text.split()
    if not words:
        return Launch()
    mode, counts = words[0], {"g": 1, "G": 1}
    if mode not in LAUNCH_MODES:
        raise ValueError(f"launch {text!r}: the mode is one of {', '.join(LAUNCH_MODES)}")
    for word in words[1:]:
        key, _, value = word.partition("=")
        if key not in counts or not value.isdigit() or int(value) < 1:
            raise ValueError(f"launch {text!r}: expected g=N (GPUs per process) or G=N (per graph)")
        counts[key] = int(value)
    return Launch(mode, counts["g"], counts["G"])


# -- compute ------------------------------------------------------------------------------------------


def gemm_seconds(
    m: int,
    n: int,
    k: int,
    rate: float,
    tile: float = 0.0,
    sms: int = 0,
    hbm: float = 0.0,
    elem_bytes: int = 2,
) -> float:
    """A GEMM (m x k) @ (k x n) on a GPU: the larger of its FLOPs at the achievable rate, its operands
    through memory, and one output tile's k-loop on one SM (a GEMM cannot end before the SM with the
    last tile has computed it: the floor that makes small GEMMs slow; `tile` output elements per tile).
    On a CPU profile (tile 0) it is the FLOPs at the rate."""
    flops = 2.0 * m * n * k
    t = flops / rate
    if tile and sms:
        t = max(t, 2.0 * tile * k / (rate / sms))
    if hbm:
        t = max(t, (m * k + k * n + m * n) * elem_bytes / hbm)
    return t
