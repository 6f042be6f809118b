"""Build servetune's measured fused-MoE tables (src/servetune/data/gpu/moe_<gpu>.json) from
NVIDIA AIConfigurator's published vLLM kernel measurements.

Source: github.com/ai-dynamo/aiconfigurator (Apache-2.0), files
aic-core/src/aiconfigurator_core/systems/data/<gpu>/moe/vllm/0.24.0/moe_perf.parquet:
latency (ms) of one MoE layer's routed experts (the fused-MoE kernel: gate-up GEMM,
activation, down GEMM, top-k reduce) for a step of `num_tokens` tokens, per model shape
(hidden, expert intermediate, experts, top-k), expert tensor parallelism and routing.
Only figures are carried (in microseconds); no code.

Kept: tensor-parallel experts (EP 1, vLLM's default), the `power_law_1.2` routing (real
routers are skewed, not balanced; 1.2 is the skew AIConfigurator's own estimator assumes
for Qwen, GPT-OSS and Mixtral-style MoE, sdk/models/moe.py), and the kernels vLLM
picks for a checkpoint in plain 16 bits (`bf16`), FP8 (`fp8`: vLLM's Fp8MoEMethod, the
table's `fp8_block` rows) and GPT-OSS's MXFP4 (`mxfp4`); the fastest of them where the
table times several. ModelOpt and compressed-tensors checkpoints' kernels are left out.
On Blackwell (B200, B300) only FP8: there the table times the kernel vLLM's Fp8MoEMethod
runs (FlashInfer's TRT-LLM block-FP8 MoE), checked by MiniMax-M2.5's B200/B300 runs in
data/published/aic_vllm_runs.csv. Its MXFP4 rows time a bf16-activation kernel, where vLLM
serves GPT-OSS on Blackwell with MXFP4 x MXFP8 kernels the table has not timed for its
shapes (they priced the B200 GPT-OSS runs up to twice too slow), and no visible run checks
its bf16 rows there; those keep the formula.

Run once, where pandas and pyarrow are installed (they are not servetune dependencies):
    python scripts/moe_table_from_aic.py AIC_CHECKOUT COMMIT
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd  # type: ignore[import-untyped]
from aic_tables import DATA, write_tables

GPUS = {"h100-sxm": "h100_sxm", "h200": "h200_sxm", "b200": "b200_sxm", "b300": "b300_sxm"}
HOPPER_DTYPES = {"bfloat16": "bf16", "fp8_block": "fp8", "w4a16_mxfp4": "mxfp4"}
BLACKWELL_DTYPES = {"fp8_block": "fp8"}
BLACKWELL = ("b200_sxm", "b300_sxm")
SKIP = ("vllm_modelopt", "vllm_compressedtensors")  # other checkpoints' formats
ROUTING = "power_law_1.2"


def table(checkout: Path, gpu_dir: str, commit: str) -> dict:
    path = f"{DATA}/{gpu_dir}/moe/vllm/0.24.0/moe_perf.parquet"
    d = pd.read_parquet(checkout / path)
    dtypes = BLACKWELL_DTYPES if gpu_dir in BLACKWELL else HOPPER_DTYPES
    d = d[(d.moe_ep_size == 1) & (d.distribution == ROUTING) & d.moe_dtype.isin(list(dtypes))]
    d = d[~d.kernel_source.str.startswith(SKIP)]
    tokens = sorted(int(t) for t in d.num_tokens.unique())
    shapes: dict[str, dict[str, list[float]]] = {}
    keys = ["moe_dtype", "hidden_size", "inter_size", "num_experts", "topk", "moe_tp_size"]
    for (dtype, h, inter, e, k, tp), g in d.groupby(keys):
        fastest = g.groupby("num_tokens").latency.min()
        if len(fastest) != len(tokens):
            continue  # a shape timed on part of the grid only
        name = f"{h}x{inter}x{e}x{k}/tp{tp}"
        us = [round(float(fastest[t]) * 1000, 2) for t in tokens]
        shapes.setdefault(dtypes[dtype], {})[name] = us
    return {
        "source": f"github.com/ai-dynamo/aiconfigurator@{commit}, {path}",
        "device": str(d.device.iloc[0]),
        "engine": "vLLM 0.24.0",
        "routing": ROUTING,
        "key": "hidden x expert_intermediate x experts x top_k / tp",
        "tokens": tokens,
        "us": shapes,
    }


def main() -> None:
    write_tables("moe", GPUS, table)


if __name__ == "__main__":
    main()
