"""HardwareSpec: one accelerator (or a CPU host) as the roofline and memory maths see it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt

from servetune.units import GB, TFLOP, GiB

Dtype = Literal["fp32", "tf32", "fp16", "bf16", "fp8", "int8", "fp4", "int4"]


class HardwareSpec(BaseModel):
    """Per-device figures from the vendor datasheet (dense, not sparse, TFLOP/s)."""

    model_config = ConfigDict(frozen=True)

    name: str  # catalog key, e.g. "h100-sxm"
    display_name: str
    vendor: str
    kind: Literal["gpu", "cpu"] = "gpu"
    memory_gib: PositiveFloat  # usable device memory, GiB (2**30)
    memory_bandwidth_gbs: PositiveFloat  # GB/s (1e9), datasheet peak
    tflops: dict[Dtype, PositiveFloat]  # dense peak per dtype
    devices_per_node: PositiveInt = 8
    # CPU hosts: the cores the figures above are for (an engine's thread count uses a share)
    cores: PositiveInt | None = None
    interconnect: Literal["nvlink", "pcie", "infinity-fabric", "none"] = "pcie"
    # Per-device, one direction, GB/s: what a ring all-reduce can push.
    interconnect_gbs: float = Field(0.0, ge=0)
    # Between nodes (per device, one direction), for pipeline parallelism.
    node_interconnect_gbs: float = Field(50.0, ge=0)
    source: str = Field(..., min_length=1)  # datasheet the figures come from

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GiB)

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
