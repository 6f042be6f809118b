"""Build servetune's measured GEMM tables (src/servetune/data/gpu/gemm_<gpu>.json) from
NVIDIA AIConfigurator's published vLLM kernel measurements.

Source: github.com/ai-dynamo/aiconfigurator (Apache-2.0), files
aic-core/src/aiconfigurator_core/systems/data/<h100_sxm|h200_sxm>/gemm/vllm/0.24.0/
gemm_perf.parquet: latency (ms) of one GEMM of M x K by K x N on one GPU, as vLLM 0.24.0
runs it (`torch.nn.functional.linear` for 16-bit weights, `CutlassFP8ScaledMMLinearKernel`
for FP8 weights with per-token activation scales, activation quantisation included).
Only figures are carried (a subset of the grid, in microseconds); no code.

Run once, where pandas and pyarrow are installed (they are not servetune dependencies):
    python scripts/gemm_table_from_aic.py AIC_CHECKOUT COMMIT
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd  # type: ignore[import-untyped]
from aic_tables import DATA, write_tables

GPUS = {"h100-sxm": "h100_sxm", "h200": "h200_sxm", "b300": "b300_sxm"}
KERNELS = {"bf16": "torch.nn.functional.linear", "fp8": "CutlassFP8ScaledMMLinearKernel"}
# M: tokens in the step; the table's powers of two (its M = 2^k + 1 rows show the padding
# that gpu_kernels.tile_efficiency prices, so they are left out).
M = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
# N, K: the weight shards of the models served (per-GPU shards of 1-8-way TP).
NK = [256, 512, 1024, 1536, 2048, 3072, 4096, 5120, 6144, 7168, 8192, 10240, 12288, 16384, 51200]


def table(checkout: Path, gpu_dir: str, commit: str) -> dict:
    path = f"{DATA}/{gpu_dir}/gemm/vllm/0.24.0/gemm_perf.parquet"
    d = pd.read_parquet(checkout / path)
    us: dict[str, list] = {}
    for dtype, kernel in KERNELS.items():
        x = d[(d.kernel_source == kernel)].set_index(["m", "n", "k"]).latency
        us[dtype] = [[[round(float(x[(m, n, k)]) * 1000, 2) for k in NK] for n in NK] for m in M]
    return {
        "source": f"github.com/ai-dynamo/aiconfigurator@{commit}, {path}",
        "device": str(d.device.iloc[0]),
        "engine": "vLLM 0.24.0",
        "kernels": KERNELS,
        "m": M,
        "n": NK,
        "k": NK,
        "us": us,
    }


def main() -> None:
    write_tables("gemm", GPUS, table)


if __name__ == "__main__":
    main()
