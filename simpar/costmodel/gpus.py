"""The GPU presets: every number of dgx-h100, h200, dgx-a100, ib-cluster and ethernet-100g, and where it
comes from. hardware.py turns each dict into a Hardware; nccl.py says how the numbers are used;
validation/ holds the published measurements `simpar validate` checks them against (the points a
constant was read from are marked `fit` there, so the rest are checks, not echoes).

Plain dicts, importing nothing: the cost model and the simulated clock share them.
"""

from __future__ import annotations

GB = 1e9
TUNING_CC = "NVIDIA/nccl src/graph/tuning.cc (commit 5067397, 2026): baseLatencies, hwLatencies, llMaxBws"
MAMF = "stas00/ml-engineering compute/accelerator/README.md, Maximum Achievable Matmul FLOPS table"
HBM_SHARE = 0.75  # measured/spec device memory bandwidth, A100 80GB: 1500/2000 (NVIDIA/cuda-samples#311)


def ring_protocols(ll_max: tuple) -> dict:
    """NCCL's ring protocols as tuning.cc prices them: base latency, per-step latency on NVLink and on
    the network, the share of the Simple bus bandwidth, and LL's ceiling by node count (1, 2, more;
    per GPU generation, `llMaxBws`). LL moves half the bytes (a flag in every 8), LL128 92%."""
    return {
        "LL": [6.6e-6, 0.6e-6, 2.7e-6, 0.5, *ll_max],
        "LL128": [14.0e-6, 1.9e-6, 4.0e-6, 0.92, 0.0, 0.0, 0.0],
        "Simple": [8.4e-6, 3.4e-6, 14.0e-6, 1.0, 0.0, 0.0, 0.0],
    }


# One blocking torch.distributed.all_reduce as all_reduce_bench.py times it (CUDA events around the
# call, after a barrier): Python, c10d's work and stream events, beyond the one launch tuning.cc's base
# latency holds (nccl.Launch "torch"). Read from that bench's 32 KiB point on 8 x H200 (39.96 us,
# marked fit in validation/collectives.csv) less the closed form's eager price there (15.41 us); the
# same sweep's 2 MiB point checks it. stas00/ml-engineering network/benchmarks/results/all-reduce-8xH200.md
TORCH_CALL_S = 24.55e-6

# NCCL_ALGO=Tree all-reduce with one GPU per node (nccl.tree_options): protocol -> (base latency, the
# network's latency per tree level). tuning.cc baseLatencies' Tree row (6.8, 14, 8.4 us; line 151) and
# hwLatencies NET Tree (5.0, 8.5, 14 us; line 171), which tuning.cc uses for every algorithm when
# ppn == 1 ("latencies are fully exposed", line 386); a tree all-reduce adds 2 log2(nNodes) of them
# (line 416).
TREE_PROTOCOLS = {"LL": (6.8e-6, 5.0e-6), "LL128": (14.0e-6, 8.5e-6), "Simple": (8.4e-6, 14.0e-6)}

RING_PROTOCOLS = ring_protocols((141e9, 45e9, 35e9))  # Hopper's LL ceilings
AMPERE_PROTOCOLS = ring_protocols((87.7e9, 22.5e9, 19.0e9))

# Hopper (H100/H200 SXM5): NVIDIA H100 Tensor Core GPU datasheet, dense: FP64 67, FP32 67 (no tensor
# core), TF32 494.5, BF16/FP16 989.4 TFLOP/s; 132 SMs. Achievable: the BF16 MAMF 794.5 TFLOP/s = 80.3%
# of 989 (MAMF table; "H200 is the same"), the same share assumed for the other precisions.
_HOPPER_EFF = 794.5 / 989.4
_HOPPER_PEAK = {"fp64": 67e12, "fp32": 67e12, "tf32": 494.5e12, "mixed": 989.4e12}  # datasheet, dense
_HOPPER_FLOPS = {
    "fp64": _HOPPER_EFF * 67e12,
    "fp32": _HOPPER_EFF * 67e12,  # true FP32 on CUDA cores (PyTorch's default since 1.12, Numba's kernels)
    "tf32": _HOPPER_EFF * 494.5e12,  # FP32 inputs on TF32 tensor cores: 7.4x true FP32
    "mixed": _HOPPER_EFF * 989.4e12,  # BF16/FP16 tensor cores
}
# Output elements per tile of the GEMM kernels (the one-wave floor of nccl.gemm_seconds): 16-bit
# 128x256, Hopper cuBLAS's usual CTA tile; TF32 and FP32 fitted to the 1024^3 points of
# zzc0721/torch-performance-test-data#79 (marked fit in validation/compute.csv).
_TILES = {"mixed": 128 * 256, "tf32": 128 * 192, "fp32": 128 * 96, "fp64": 128 * 96}
_NVLINK4 = dict(
    intra_alpha=RING_PROTOCOLS["LL"][0] + RING_PROTOCOLS["LL"][1],  # one small send: LL base + a step
    intra_bw=370 * GB,  # NCCL's effective NVLink 4 bandwidth, ring busbw (nccl-tests#212, maintainer)
    devices_per_node=8,
    nvls_bw=276 * GB,  # NVLS all-reduce algbw, large sizes (nccl-tests#212: ~275; MAMF-style fit, see below)
    nvls_lat=150e-6 - TORCH_CALL_S,  # fitted: the 0.5-16 GiB H200 sweep (ml-engineering network/README)
    # is ~ S/276 GB/s + 150 us, of which TORCH_CALL_S is that bench's torch.distributed call, not NVLS
    # (NCCL's own model says 25 us: NVLS's channels fill slowly at medium sizes)
    nvls_min_ranks=5,  # NCCL picks NVLS above 4 GPUs on H200 (ml-engineering network/README, SHARP)
    ring_proto=RING_PROTOCOLS,
    reduce_in_transfer=True,
    launch_s=3.0e-6,  # cuLaunchKernel of a no-op kernel (meta-pytorch/tritonbench#1017, GB200 host)
    layer_overhead=5 * 3.0e-6,  # 5 kernels per layer per micro-batch (fwd GEMM + bias/act; bwd act'/db,
    # dW and dx GEMMs), each launched at launch_s: the host cost of small layers
    sms=132,
    gemm_tile=_TILES,
    intra_name="NVLink4",
)
_NVLINK4_SOURCES = [
    "NVIDIA H100 Tensor Core GPU datasheet: dense FP64/FP32 67, TF32 494.5, BF16 989.4 TFLOP/s; 132 SMs",
    f"achievable GEMM rate 80.3% of peak: {MAMF} (H100 SXM BF16 794.5)",
    "NVLink 4: 450 GB/s per direction; NCCL gets ~370 GB/s ring busbw, NVLS ~480 busbw / ~275 algbw "
    "(github.com/NVIDIA/nccl-tests/issues/212, maintainer); NVLS above 4 GPUs and its latency fitted to "
    "the 8x H200 sweep of stas00/ml-engineering network/README.md, less that bench's PyTorch call "
    "(24.55 us, read from its 32 KiB point: network/benchmarks/results/all-reduce-8xH200.md)",
    f"protocols LL/LL128/Simple: {TUNING_CC}",
    f"memory: {HBM_SHARE:.0%} of the HBM spec, the measured share on A100 (NVIDIA/cuda-samples#311)",
    "kernel launch 3.0 us: cuLaunchKernel of a no-op kernel (meta-pytorch/tritonbench#1017)",
]
_NDR = dict(
    inter_alpha=RING_PROTOCOLS["LL"][0] + RING_PROTOCOLS["LL"][2],  # one small send over the network
    nic_bw=47 * GB,  # ConnectX-7 at NDR 400 Gb/s: 46-48 GB/s per NIC (nccl-tests#290, maintainer)
    nics_per_node=8,
    inter_name="IB-NDR",
)

H100 = dict(
    flops=_HOPPER_FLOPS,
    peak_flops=_HOPPER_PEAK,
    gamma=3 / (HBM_SHARE * 3.35e12),  # 80 GB HBM3 at 3.35 TB/s (datasheet)
    memory_bytes=80e9,
    **_NVLINK4,
)
PRESETS = {
    "dgx-h100": dict(
        name="dgx-h100",
        description="1 DGX H100 node: 8 x H100 SXM on NVLink 4 / NVSwitch (8 NDR NICs for more nodes)",
        **H100,
        **_NDR,
        sources=_NVLINK4_SOURCES + ["ConnectX-7 NDR: 46-48 GB/s per NIC (nccl-tests#290, maintainer)"],
    ),
    "h200": dict(
        name="h200",
        description="1 node: 8 x H200 SXM (141 GB HBM3e, 4.8 TB/s) on NVLink 4 / NVSwitch",
        **{**H100, "gamma": 3 / (HBM_SHARE * 4.8e12), "memory_bytes": 141e9},
        **_NDR,
        sources=_NVLINK4_SOURCES + ["NVIDIA H200 datasheet: 141 GB HBM3e at 4.8 TB/s, H100's compute"],
    ),
    "ib-cluster": dict(
        name="ib-cluster",
        description="DGX H100 nodes (8 GPUs, NVLink 4) joined by 400 Gb/s NDR InfiniBand, 1 NIC per GPU",
        **H100,
        **_NDR,
        sources=_NVLINK4_SOURCES
        + [
            "ConnectX-7 NDR 400 Gb/s: 46-48 GB/s per NIC (nccl-tests#290, maintainer); 8 per DGX H100",
            "network per-step latency: tuning.cc's NET hwLatencies (ring LL 2.7, LL128 4.0, Simple 14 us)",
        ],
    ),
    "ethernet-100g": dict(
        name="ethernet-100g",
        description="8 x H100 nodes with ONE 100 Gb/s Ethernet NIC (RoCE v2) per node",
        **H100,
        inter_alpha=20e-6,
        nic_bw=11 * GB,
        nics_per_node=1,
        inter_name="100GbE",
        sources=_NVLINK4_SOURCES
        + [
            "100 GbE (IEEE 802.3 100GBASE): 12.5 GB/s per direction; ~88% achievable with RoCE v2 (11 GB/s), "
            "the same share as NDR's 47 of 50 GB/s would give 11.75",
            "latency: RoCE ~5-10 us, TCP 20-50 us; 20 us assumed (NCCL over sockets/RoCE)",
        ],
    ),
    "dgx-a100": dict(
        name="dgx-a100",
        description="1 DGX A100 node: 8 x A100 SXM4 80GB on NVLink 3 / NVSwitch (8 HDR NICs)",
        flops={
            "fp64": 271.2 / 312 * 19.5e12,  # A100 datasheet: FP64 TC 19.5, FP32 19.5, TF32 156, BF16 312
            "fp32": 271.2 / 312 * 19.5e12,
            "tf32": 271.2 / 312 * 156e12,
            "mixed": 271.2e12,  # the BF16 MAMF of A100 SXM (86.9% of 312)
        },
        peak_flops={"fp64": 19.5e12, "fp32": 19.5e12, "tf32": 156e12, "mixed": 312e12},  # datasheet, dense
        gamma=3 / (HBM_SHARE * 2.039e12),  # 80 GB HBM2e at 2.039 TB/s (datasheet); measured 1500 GB/s
        memory_bytes=80e9,
        intra_alpha=RING_PROTOCOLS["LL"][0] + RING_PROTOCOLS["LL"][1],
        intra_bw=235 * GB,  # tuning.cc v2.7.5-v2.17 capped A100 (sm80) bus bandwidth at 235.0f (v2.18.1
        # dropped the cap); measured 234.89 at 16 GiB, 230.77 at 1 GiB on another node (nccl#527)
        devices_per_node=8,
        ring_proto=AMPERE_PROTOCOLS,
        reduce_in_transfer=True,
        launch_s=3.0e-6,
        layer_overhead=5 * 3.0e-6,
        sms=108,
        gemm_tile=_TILES,
        intra_name="NVLink3",
        inter_alpha=RING_PROTOCOLS["LL"][0] + RING_PROTOCOLS["LL"][2],
        nic_bw=23.5 * GB,  # ConnectX-6 HDR 200 Gb/s = 25 GB/s; 94% achievable, NDR's measured share
        nics_per_node=8,
        inter_name="IB-HDR",
        sources=[
            "NVIDIA A100 Tensor Core GPU datasheet: FP64 TC 19.5, TF32 156, BF16 312 TFLOP/s; 80 GB HBM2e "
            "2.039 TB/s; 108 SMs; NVLink 3 300 GB/s per direction",
            f"achievable GEMM rate: {MAMF} (A100 SXM BF16 271.2 = 86.9%)",
            "ring bus bandwidth 235 GB/s: NVIDIA/nccl src/graph/tuning.cc v2.7.5-v2.17 (sm80 cap, dropped in "
            "v2.18.1), measured 234.89 GB/s at 16 GiB (stas00/ml-engineering network/README.md)",
            f"protocols: {TUNING_CC}; memory: {HBM_SHARE:.0%} of spec (NVIDIA/cuda-samples#311, A100 80GB)",
            "DGX A100 user guide: 8 single-port ConnectX-6 HDR 200 Gb/s compute NICs",
        ],
    ),
}
