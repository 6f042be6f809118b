"""Build servetune's measured GEMM tables (src/servetune/data/gpu/gemm_<gpu>.json) from
NVIDIA AIConfigurator's published vLLM kernel measurements.

Source: github.com/ai-dynamo/aiconfigurator (Apache-2.0), files
aic-core/src/aiconfigurator_core/systems/data/<h100_sxm|h200_sxm>/gemm/vllm/0.24.0/
gemm_perf.parquet: latency (ms) of one GEMM of M x K by K x N on one GPU, as vLLM 0.24.0
runs it (`torch.nn.functional.linear` for 16-bit weights, `CutlassFP8ScaledMMLinearKernel`
for FP8 weights with per-token activation scales, activation quantisation included).
Block-scaled FP8 weights (128 x 128 scales: Qwen3-*-FP8, DeepSeek-V3) take, cell by cell,
the faster of two measurements of vLLM's block-scaled path (`fp8_block`): vLLM 0.24.0's
(DeepGEMM from M = 32, FlashInfer below), which AIConfigurator's collector times without a
CUDA graph (collector/vllm/collect_gemm.py, `use_cuda_graph=gemm_type != "fp8_block"`), so
its small-M cells hold the host's launch cost (a 58-84 us floor on an H200) that vLLM's
CUDA graphs remove; and vLLM 0.14.0's (`vllm_default`), which its earlier collector
replayed from a graph (33-60 us at small M on an H200: the block-scaled GEMM runs one CTA
per 128 output columns, far from the bandwidth), but whose large-M kernel was up to 2x
slower than 0.24.0's. Where the 0.14.0 grid stops short (H100: no M = 16384, no
51200-wide N or K), a cell takes the nearest measured one at the same time per weight
element (K, N) or per row (M): the rate at the grid's edge.
Only figures are carried (a subset of the grid, in microseconds); no code.

Run once, where pandas and pyarrow are installed (they are not servetune dependencies):
    python scripts/gemm_table_from_aic.py AIC_CHECKOUT COMMIT
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd  # type: ignore[import-untyped]
from aic_tables import DATA, write_tables

GPUS = {"h100-sxm": "h100_sxm", "h200": "h200_sxm", "b300": "b300_sxm"}
KERNELS = {"bf16": "torch.nn.functional.linear", "fp8": "CutlassFP8ScaledMMLinearKernel"}
BLOCK_GRAPHED = ("0.14.0", "vllm_default")  # a release timed from CUDA graphs, its kernel
# M: tokens in the step; the table's powers of two (its M = 2^k + 1 rows show the padding
# that gpu_kernels.tile_efficiency prices, so they are left out).
M = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
# N, K: the weight shards of the models served (per-GPU shards of 1-8-way TP).
NK = [256, 512, 1024, 1536, 2048, 3072, 4096, 5120, 6144, 7168, 8192, 10240, 12288, 16384, 51200]


def edge(x: pd.Series, m: int, n: int, k: int) -> float:
    """The measured ms of (m, n, k); off the measured cells, the nearest one (in log N and
    log K, at the same M where that M was measured, else at the nearest M) scaled linearly
    in N, K and M: the rate at the grid's edge."""
    if (m, n, k) in x.index:
        return float(x[(m, n, k)])
    ms = sorted(set(x.index.get_level_values(0)))
    m0 = m if m in ms else min(ms, key=lambda v: abs(math.log(m / v)))
    cells = x.xs(m0, level=0)
    n0, k0 = min(cells.index, key=lambda c: abs(math.log(n / c[0])) + abs(math.log(k / c[1])))
    return float(cells[(n0, k0)]) * (m / m0) * (n / n0) * (k / k0)


def grid_us(x: pd.Series) -> list:
    """Microseconds on servetune's (M, N, K) grid."""
    return [[[round(edge(x, m, n, k) * 1000, 2) for k in NK] for n in NK] for m in M]


def table(checkout: Path, gpu_dir: str, commit: str) -> dict:
    path = f"{DATA}/{gpu_dir}/gemm/vllm/0.24.0/gemm_perf.parquet"
    d = pd.read_parquet(checkout / path)
    us: dict[str, list] = {}
    kernels = dict(KERNELS)
    sources = [path]
    for dtype, kernel in KERNELS.items():
        us[dtype] = grid_us(d[(d.kernel_source == kernel)].set_index(["m", "n", "k"]).latency)
    release, kernel = BLOCK_GRAPHED
    graphed_path = f"{DATA}/{gpu_dir}/gemm/vllm/{release}/gemm_perf.parquet"
    if (checkout / graphed_path).is_file():
        eager = d[d.gemm_dtype == "fp8_block"].set_index(["m", "n", "k"]).latency
        b = pd.read_parquet(checkout / graphed_path)
        b = b[(b.gemm_dtype == "fp8_block") & (b.kernel_source == kernel)]
        graphed = b.set_index(["m", "n", "k"]).latency
        faster = np.minimum(np.array(grid_us(eager)), np.array(grid_us(graphed)))
        us["fp8_block"] = faster.tolist()
        kernels["fp8_block"] = f"the faster of 0.24.0's (eager) and {release}'s {kernel}"
        sources.append(graphed_path)
    return {
        "source": f"github.com/ai-dynamo/aiconfigurator@{commit}, {'; '.join(sources)}",
        "device": str(d.device.iloc[0]),
        "engine": "vLLM 0.24.0",
        "kernels": kernels,
        "m": M,
        "n": NK,
        "k": NK,
        "us": us,
    }


def main() -> None:
    write_tables("gemm", GPUS, table)


if __name__ == "__main__":
    main()
