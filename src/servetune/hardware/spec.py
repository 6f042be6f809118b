"""HardwareSpec: one accelerator (or a CPU host) as the roofline and memory maths see it."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from servetune.units import GB, TFLOP, GiB

Dtype = Literal["fp32", "tf32", "fp16", "bf16", "fp8", "int8", "fp4", "int4"]

# Upper bounds, far above any device made (the catalog's largest: 268 GiB, 8,000 GB/s,
# 13,125 TFLOP/s; a Cerebras wafer's on-chip SRAM: 21 PB/s). Beyond them a figure is a
# typo, and an infinite or 1e300 one overflows the byte counts or makes a step take 0 s.
MAX_MEMORY_GIB = 1e6
MAX_GBS = 1e9
MAX_TFLOPS = 1e8
# The largest NVLink domain is 576 GPUs; planning walks every count up to this one.
MAX_DEVICES_PER_NODE = 10_000


class HardwareSpec(BaseModel):
    """Per-device figures from the vendor datasheet (dense, not sparse, TFLOP/s)."""

    model_config = ConfigDict(frozen=True, allow_inf_nan=False)

    name: str  # catalog key, e.g. "h100-sxm"
    display_name: str
    vendor: str
    kind: Literal["gpu", "cpu"] = "gpu"
    memory_gib: float = Field(gt=0, le=MAX_MEMORY_GIB)  # usable device memory, GiB (2**30)
    memory_bandwidth_gbs: float = Field(gt=0, le=MAX_GBS)  # GB/s (1e9), datasheet peak
    tflops: dict[Dtype, Annotated[float, Field(gt=0, le=MAX_TFLOPS)]]  # dense peak per dtype
    devices_per_node: int = Field(8, ge=1, le=MAX_DEVICES_PER_NODE)
    # CPU hosts: the cores the figures above are for (an engine's thread count uses a share)
    cores: PositiveInt | None = None
    # NVIDIA CUDA compute capability (major.minor, e.g. 8.9), from NVIDIA's "CUDA GPUs"
    # table (https://developer.nvidia.com/cuda-gpus): engines gate kernels on it (FP8 needs
    # 8.9 for W8A8, `plan.quant.on_hardware`). None: not an NVIDIA GPU, or not known.
    compute_capability: float | None = Field(None, ge=1, le=99)
    interconnect: Literal["nvlink", "pcie", "infinity-fabric", "none"] = "pcie"
    # Per-device, one direction, GB/s: what a ring all-reduce can push.
    interconnect_gbs: float = Field(0.0, ge=0, le=MAX_GBS)
    # A point-to-point mesh (AMD Infinity Fabric: 7 links to the 7 peers of an 8-GPU
    # board) rather than a switch: interconnect_gbs is all `interconnect_links` together,
    # and a TP group of n GPUs reaches its n - 1 peers over n - 1 of them
    # (`allreduce_gbs`). None: a switch (NVSwitch) or bus gives every TP size the figure.
    interconnect_links: PositiveInt | None = None
    # Between nodes (per device, one direction), for pipeline parallelism.
    node_interconnect_gbs: float = Field(50.0, ge=0, le=MAX_GBS)
    source: str = Field(..., min_length=1)  # datasheet the figures come from

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GiB)

    def allreduce_gbs(self, tp: int) -> float:
        """One direction GB/s a TP group of `tp` GPUs all-reduces over: interconnect_gbs,
        or on a point-to-point mesh the min(tp - 1, links) links that reach the peers."""
        if self.interconnect_links is None or tp <= 1:
            return self.interconnect_gbs
        per_link = self.interconnect_gbs / self.interconnect_links
        return per_link * min(tp - 1, self.interconnect_links)

    @property
    def bandwidth_bytes_s(self) -> float:
        return self.memory_bandwidth_gbs * GB

    def peak_flops(self, dtype: str) -> float:
        """Dense FLOP/s for a compute dtype; where the device lacks it, the 16-bit rate
        (weight-only formats dequantize to 16-bit before the matmul)."""
        for candidate in (dtype, "bf16", "fp16", "fp32"):
            if candidate in self.tflops:
                return self.tflops[candidate] * TFLOP  # type: ignore[index]
        return min(self.tflops.values()) * TFLOP
