"""Kernel figures per accelerator for the `gpu` step-time tier, read from the packaged
`data/gpu/kernels.yaml` (each figure names its source there), and the pure functions that
turn them into seconds: GEMM efficiency against the tokens in the batch, all-reduce time
against message size and TP.

A GPU without an entry gets the `default` figures on its own datasheet peaks; `KernelFigures.
rule` says which, so every prediction can name it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from servetune.errors import InputError
from servetune.hardware.spec import HardwareSpec
from servetune.yamlfile import parse_yaml


@dataclass(frozen=True)
class KernelFigures:
    """One accelerator's figures (see kernels.yaml for what each means)."""

    mamf: dict[str, float]
    gemm_tile_m: int
    hbm_eff: float  # weight streaming of 16-bit GEMMs (and any dtype not in hbm_eff_by_dtype)
    hbm_eff_by_dtype: dict[str, float]
    attn_eff: float
    fa_eff: float
    model_gemm_eff: float
    per_layer_s: float
    allreduce_latency_s: dict[int, float]
    allreduce_busbw_bytes_s: float
    rule: str  # "measured (h100-sxm)" or "no measurements: default figures on <gpu>'s peaks"

    def mamf_for(self, dtype: str) -> float:
        """Achievable share of the dense peak for `dtype` (16-bit's when not listed, as
        `HardwareSpec.peak_flops` falls back to the 16-bit rate)."""
        for d in (dtype, "bf16", "fp16"):
            if d in self.mamf:
                return self.mamf[d]
        return min(self.mamf.values())

    def hbm_for(self, dtype: str) -> float:
        """Share of the datasheet HBM bandwidth that decode GEMMs running in `dtype` reach
        while streaming their weights (FP8 GEMMs quantise their activations first)."""
        return self.hbm_eff_by_dtype.get(dtype, self.hbm_eff)


@lru_cache(maxsize=1)
def _data() -> dict[str, Any]:
    text = (resources.files("servetune") / "data" / "gpu" / "kernels.yaml").read_text("utf-8")
    return parse_yaml(text)


def engine_cpu_figures(engine: str) -> dict[str, float]:
    """The CPU side of `engine` on a GPU box (ingress, per-chunk, per-step seconds)."""
    engines = _data()["engines"]
    if engine not in engines:
        raise InputError(
            "tier", f"the gpu tier has no CPU-side figures for {engine}", "use roofline"
        )
    return dict(engines[engine])


def kernel_figures(hw: HardwareSpec) -> KernelFigures:
    """The figures for `hw`: its own entry, else the default rule on its datasheet."""
    table = _data()["accelerators"]
    entry = table.get(hw.name)
    if entry is not None:
        rule = f"kernel figures for {hw.name} from public measurements (data/gpu/kernels.yaml)"
    else:
        entry = table["default"]
        rule = f"no kernel measurements for {hw.name}: default figures on its datasheet peaks"
    ar = entry["allreduce"]
    busbw = ar["busbw_gbs"]
    if busbw is None:  # the default rule: 80% of the catalog link, as measured on NVLink 4
        link = hw.interconnect_gbs if hw.interconnect_gbs > 0 else 16.0
        busbw = 0.8 * link
    return KernelFigures(
        mamf={str(k): float(v) for k, v in entry["mamf"].items()},
        gemm_tile_m=int(entry["gemm_tile_m"]),
        hbm_eff=float(entry["hbm_eff"]),
        hbm_eff_by_dtype={
            str(k): float(v) for k, v in (entry.get("hbm_eff_by_dtype") or {}).items()
        },
        attn_eff=float(entry["attn_eff"]),
        fa_eff=float(entry["fa_eff"]),
        model_gemm_eff=float(entry["model_gemm_eff"]),
        per_layer_s=float(entry["per_layer_us"]) * 1e-6,
        allreduce_latency_s={int(k): float(v) * 1e-6 for k, v in ar["latency_us"].items()},
        allreduce_busbw_bytes_s=float(busbw) * 1e9,
        rule=rule,
    )


def tile_efficiency(tokens: int, tile_m: int) -> float:
    """Share of a GEMM's tiles doing useful rows: M tokens run in ceil(M / tile_m) tiles of
    tile_m rows (CUTLASS/cuBLAS CTA tiling), so M = 129 on 128-row tiles wastes 127 rows."""
    m = max(int(tokens), 1)
    return m / (tile_m * math.ceil(m / tile_m))


def allreduce_s(fig: KernelFigures, tp: int, message_bytes: float) -> float:
    """One all-reduce of `message_bytes` over `tp` GPUs: a latency by TP size (the largest
    listed size at or below tp) plus the ring's 2 (tp - 1) / tp x bytes over bus bandwidth
    (nccl-tests' busbw convention)."""
    if tp <= 1:
        return 0.0
    sizes = sorted(fig.allreduce_latency_s)
    lat = fig.allreduce_latency_s[max([s for s in sizes if s <= tp] or sizes[:1])]
    return lat + 2 * (tp - 1) / tp * message_bytes / fig.allreduce_busbw_bytes_s
