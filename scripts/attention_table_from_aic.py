"""Build servetune's measured decode-attention lines (src/servetune/data/gpu/attn_<gpu>.json)
from NVIDIA AIConfigurator's published vLLM kernel measurements.

Source: github.com/ai-dynamo/aiconfigurator (Apache-2.0), files
aic-core/src/aiconfigurator_core/systems/data/<gpu>/attention/vllm/0.24.0/
generation_attention_perf.parquet: latency (ms) of one layer's decode attention for
`batch_size` sequences of `step + 1` cached tokens each, per query heads, KV heads and head
size on one GPU, KV cache in bf16 or fp8, per vLLM kernel (`kernel_source`: FlashAttention-3
and -4 on Hopper, FlashInfer's TRT-LLM decode and Triton on B200); the faster at each point
is kept, the kernel a tuned deployment runs, and the file names the kernels.

Carried: for each shape (full attention, no window) and batch size, the line
`t = fixed + per_token x (batch x context)` through the measured points at contexts of
256 to 32,768 tokens, fitted by least squares on relative error (a decode step's attention
grows with the KV tokens it reads; the fixed part is the kernel's floor at short contexts).
How close the lines come to the measured points is written per GPU (`fit_rel_err`: median,
90th percentile and worst |relative error|; on H200: 2%, 6%, 45% at one sequence of 256
tokens, where the kernel's floor is all there is).

Run once, where pandas and pyarrow are installed (they are not servetune dependencies):
    python scripts/attention_table_from_aic.py AIC_CHECKOUT COMMIT
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd  # type: ignore[import-untyped]
from aic_tables import DATA, write_tables

GPUS = {"h100-sxm": "h100_sxm", "h200": "h200_sxm", "b200": "b200_sxm", "b300": "b300_sxm"}
KV = {"bfloat16": "bf16", "fp8": "fp8"}
KERNELS = {  # kernel_source -> the name a prediction's note gives
    "vllm_flash_attn_fa3": "FlashAttention-3",
    "vllm_flash_attn_fa4": "FlashAttention-4",
    "vllm_flashinfer_trtllmdecode": "FlashInfer TRT-LLM decode",
    "vllm_triton_attn": "Triton",
}
CONTEXTS = (256, 32768)  # the contexts the lines are fitted over


def line(x: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """fixed, per-token seconds of t = fixed + per_token x, least squares on t's relative
    error (each point weighed by 1 / t)."""
    w = 1.0 / t
    a = np.vstack([np.ones_like(x), x]).T * w[:, None]
    (fixed, per_token), *_ = np.linalg.lstsq(a, t * w, rcond=None)
    return max(float(fixed), 0.0), float(per_token)


def table(checkout: Path, gpu_dir: str, commit: str) -> dict:
    path = f"{DATA}/{gpu_dir}/attention/vllm/0.24.0/generation_attention_perf.parquet"
    d = pd.read_parquet(checkout / path)
    d = d[(d.window_size == 0) & d.kv_cache_dtype.isin(list(KV))]
    d = d.assign(context=d.step + 1)
    d = d[(d.context >= CONTEXTS[0]) & (d.context <= CONTEXTS[1])]
    shapes: dict[str, dict[str, list[float]]] = {}
    errs: list[float] = []
    keys = ["kv_cache_dtype", "num_heads", "num_key_value_heads", "head_dim"]
    for (kv, heads, kv_heads, head_dim), g in d.groupby(keys):
        batch, fixed_us, per_token_ns = [], [], []
        for b, gb in g.groupby("batch_size"):
            pts = gb.groupby("context").latency.min()
            if len(pts) < 3:
                continue
            x = b * pts.index.to_numpy(dtype=float)
            t = pts.to_numpy(dtype=float) * 1e-3
            fixed, per_token = line(x, t)
            if per_token <= 0:
                continue
            errs += np.abs((fixed + per_token * x) / t - 1).tolist()
            batch.append(int(b))
            fixed_us.append(round(fixed * 1e6, 3))
            per_token_ns.append(round(per_token * 1e9, 5))
        if len(batch) >= 2:
            name = f"{heads}/{kv_heads}/{head_dim}"
            shapes.setdefault(KV[kv], {})[name] = {
                "batch": batch,
                "fixed_us": fixed_us,
                "per_token_ns": per_token_ns,
            }
    return {
        "source": f"github.com/ai-dynamo/aiconfigurator@{commit}, {path}",
        "device": str(d.device.iloc[0]),
        "engine": "vLLM 0.24.0",
        "kernels": sorted(KERNELS[k] for k in d.kernel_source.unique()),
        "key": "query heads / KV heads / head size, per GPU",
        "contexts": list(CONTEXTS),
        "fit_rel_err": {
            "median": round(float(np.median(errs)), 3),
            "p90": round(float(np.quantile(errs, 0.9)), 3),
            "max": round(float(np.max(errs)), 3),
        },
        "lines": shapes,
    }


def main() -> None:
    write_tables("attn", GPUS, table)


if __name__ == "__main__":
    main()
