"""Build servetune's AIConfigurator vLLM serving runs (src/servetune/data/published/
aic_vllm_runs.csv) from NVIDIA AIConfigurator's published silicon measurements.

Source: github.com/ai-dynamo/aiconfigurator (Apache-2.0), commit 095f58a5,
aic-core/src/aiconfigurator_core/systems/silicon_sample.csv: mean-style TTFT and TPOT (ms)
of real serving runs, one row per (engine, model, GPU, precision, parallelism, ISL, OSL,
concurrency), used by that project to check its own predictions. Only figures are carried.

Kept: vLLM, aggregated serving (no disaggregation), pipeline 1, no attention data
parallelism (MoE TP equal to TP) and no expert parallelism (servetune's vLLM model prices
neither), FP8 or the checkpoint's own format (NVFP4 and INT4 are not priced), models and
GPUs in servetune's catalogs, released vLLM versions (a nightly build names no release whose
CPU-side figures apply). One row per configuration (the file lists some twice, from
two collection dates; the first is kept).

Left out on purpose: the same file's vLLM runs of Llama-3.1-70B, Qwen3-32B and Llama-3.1-8B
on H100 SXM and H200. Their composition (105 + 93 + 21 = 219 runs) and the figures issue 15
quotes match the held-out acceptance set of issue 15, which must stay out of development.

    python scripts/vllm_runs_from_aic.py SILICON_SAMPLE_CSV \
        > src/servetune/data/published/aic_vllm_runs.csv
"""

from __future__ import annotations

import csv
import sys

from servetune.validate.published import PublishedRun

COMMIT = "095f58a51c4ca8e61b66ec108d86f223f8d559ce"
PATH = "aic-core/src/aiconfigurator_core/systems/silicon_sample.csv"
URL = f"https://github.com/ai-dynamo/aiconfigurator/blob/{COMMIT}/{PATH}"
TITLE = (
    "NVIDIA AIConfigurator silicon sample (measured vLLM serving runs, fixed ISL/OSL, closed loop)"
)
# AIConfigurator model path -> servetune catalog name, and the quantization servetune runs.
MODELS = {
    "meta-llama/Llama-3.1-70B": "llama-3.1-70b",
    "Qwen/Qwen3-235B-A22B-FP8": "qwen3-235b-a22b-fp8",
    "openai/gpt-oss-120b": "gpt-oss-120b",
    "MiniMaxAI/MiniMax-M2.5": "minimax-m2.5",
}
# Checkpoints that ship quantized: the catalog entry carries their quantization_config
# (Qwen's and MiniMax's block-scaled FP8, GPT-OSS's MXFP4), so a run of them names no --quant.
OWN_FORMAT = ("Qwen/Qwen3-235B-A22B-FP8", "openai/gpt-oss-120b", "MiniMaxAI/MiniMax-M2.5")
GPUS = {"h100_sxm": "h100-sxm", "h200_sxm": "h200", "b200_sxm": "b200", "b300_sxm": "b300"}
HELD_OUT_MODELS = ("Llama-3.1-70B", "Qwen3-32B", "Llama-3.1-8B")
HELD_OUT_GPUS = ("h100_sxm", "h200_sxm")
FIELDS = list(PublishedRun.model_fields)  # the visible set's columns, in its order


def held_out(r: dict) -> bool:
    """A run of issue 15's held-out set: never carried."""
    return r["system"] in HELD_OUT_GPUS and any(m in r["model_path"] for m in HELD_OUT_MODELS)


def kept(r: dict) -> bool:
    """A run servetune's vLLM model can replay as it was run."""
    ones = ("", "1")
    return (
        r["backend"] == "vllm"
        and r["mode"] == "agg"
        and not held_out(r)
        and r["model_path"] in MODELS
        and r["system"] in GPUS
        and r["pp_size"] in ones
        and r["attention_dp_size"] in ones
        and r["moe_ep_size"] in ones
        and r["moe_tp_size"] in (*ones, r["tp_size"])  # else attention ran data-parallel
        and (r["precision"] == "fp8" or r["model_path"] == "openai/gpt-oss-120b")
        and not r["backend_version"].startswith("nightly")  # no release to take figures from
    )


# The rows a figure was fitted on (kernels.yaml names them too): each is a fit row, not
# a check.
FITS = {
    "aic-gpt-oss-120b-b200-tp8-1024-1024-c4-v0.15.1": "fit row of kernels.yaml "
    "engines.vllm.releases 0.15 (its api_overhead_s)",
}


def quantization(r: dict) -> str:
    """FP8 where vLLM quantized a 16-bit checkpoint to FP8 (`--quantization fp8`); blank
    for a checkpoint that ships its own format (OWN_FORMAT) and for 16-bit runs."""
    own = r["model_path"] in OWN_FORMAT
    return "fp8" if r["precision"] == "fp8" and not own else ""


def kv_cache_dtype(r: dict) -> str:
    """FP8 with FP8 weights (FP8_KV_NOTE), else the engine's default."""
    return "fp8" if r["precision"] == "fp8" else ""


# An FP8 run's KV cache is FP8 too. Not stated per run, inferred (docs/fidelity-gpu.md,
# "AIConfigurator's FP8 runs keep an FP8 KV cache"): AIConfigurator's SDK gives FP8 models
# an FP8 KV cache (aiconfigurator_core/sdk/models/helpers.py,
# `_infer_quant_modes_from_raw_config`: fp8, fp8_block and nvfp4 set the FMHA and KV-cache
# modes to FP8; its generator passes that as vLLM's --kv-cache-dtype), and the runs read as
# an FP8 pool: a 16-bit one could not hold the KV-bound runs that ran without queueing.
FP8_KV_NOTE = "; FP8 KV cache inferred, not stated (docs/fidelity-gpu.md)"


def main() -> None:
    with open(sys.argv[1], newline="") as f:
        rows = [r for r in csv.DictReader(f) if kept(r)]
    w = csv.DictWriter(sys.stdout, FIELDS, lineterminator="\n")
    w.writeheader()
    seen: set[tuple] = set()
    for r in rows:
        model, gpu = MODELS[r["model_path"]], GPUS[r["system"]]
        tp, isl, osl, c = r["tp_size"], r["isl"], r["osl"], r["batch_size"]
        key = (model, gpu, tp, r["precision"], isl, osl, c, r["backend_version"])
        if key in seen:
            continue
        seen.add(key)
        version = r["backend_version"]
        run_id = f"aic-{model}-{gpu}-tp{tp}-{isl}-{osl}-c{c}" + (f"-v{version}" if version else "")
        fit = FITS.get(run_id)
        w.writerow(
            {
                "id": run_id,
                "source_url": URL,
                "source_title": TITLE,
                "published": "2026",
                "engine": "vllm",
                "engine_version": version,
                "model": model,
                "source_model": r["model_path"],
                "gpu": gpu,
                "tp": tp,
                "quantization": quantization(r),
                "kv_cache_dtype": kv_cache_dtype(r),
                "max_model_len": "",
                "isl": isl,
                "osl": osl,
                "concurrency": c,
                "requests": "",
                "ttft_ms": f"{float(r['silicon_ttft_ms']):.2f}",
                "tpot_ms": f"{float(r['silicon_tpot_ms']):.3f}",
                "stat": "mean",
                "role": "fit" if fit else "check",
                "note": f"AIConfigurator id {r['id']}; the statistic is not named in the "
                "source (taken as the mean)"
                + (FP8_KV_NOTE if kv_cache_dtype(r) else "")
                + (f"; {fit}" if fit else ""),
            }
        )


if __name__ == "__main__":
    main()
