"""Build servetune's measured all-reduce curves (src/servetune/data/gpu/allreduce_<gpu>.json)
from NVIDIA AIConfigurator's published vLLM kernel measurements.

Source: github.com/ai-dynamo/aiconfigurator (Apache-2.0), files
aic-core/src/aiconfigurator_core/systems/data/<gpu>/comm/vllm/0.24.0/
custom_allreduce_perf.parquet: latency (ms) of one bf16 all-reduce through vLLM's own
all-reduce (`vLLM_custom_graph`: replayed from a CUDA graph, as vLLM runs decode), per TP
size and message size. The collector's `message_size` counts elements (a [tokens, 4096]
bf16 tensor, aiconfigurator collector/network/collect_all_reduce.py), so bytes = 2 x it.
Only figures are carried (microseconds against bytes); no code.

Run once, where pandas and pyarrow are installed (they are not servetune dependencies):
    python scripts/allreduce_table_from_aic.py AIC_CHECKOUT COMMIT
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd  # type: ignore[import-untyped]
from aic_tables import DATA, write_tables

GPUS = {"h100-sxm": "h100_sxm", "h200": "h200_sxm", "b200": "b200_sxm", "b300": "b300_sxm"}


def table(checkout: Path, gpu_dir: str, commit: str) -> dict:
    path = f"{DATA}/{gpu_dir}/comm/vllm/0.24.0/custom_allreduce_perf.parquet"
    d = pd.read_parquet(checkout / path)
    d = d[d.kernel_source == "vLLM_custom_graph"]
    x = d.pivot_table(index="message_size", columns="num_gpus", values="latency").dropna()
    return {
        "source": f"github.com/ai-dynamo/aiconfigurator@{commit}, {path}",
        "device": str(d.device.iloc[0]),
        "engine": "vLLM 0.24.0",
        "kernel": "vLLM_custom_graph",
        "bytes": [int(m) * 2 for m in x.index],
        "us": {str(int(tp)): [round(float(v) * 1000, 2) for v in x[tp]] for tp in x.columns},
    }


def main() -> None:
    write_tables("allreduce", GPUS, table)


if __name__ == "__main__":
    main()
