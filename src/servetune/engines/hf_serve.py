"""Hugging Face `transformers serve` adapter (engine name `transformers`).

The module is not called `transformers` so it never shadows the package. Flag names from
`transformers serve --help` of transformers 5.24.0 (installed by `servetune engine install
transformers`; the whole CLI is checked in as data/engine_flags/transformers.json and the
engine test compares it with the installed `--help`). The model directory is the
positional FORCE_MODEL argument: it is loaded at start and serves every request.

Batching: without `--continuous-batching` the server runs one `model.generate()` at a
time on one inference thread per model (`transformers/cli/serving/utils.py`,
`GenerateManager`): exactly `max_num_seqs` 1. With it, a paged-attention batch runs as
many requests as its KV blocks and `--cb-max-batch-tokens` hold; the CLI has no cap on
requests per batch, so every `max_num_seqs` above 1 turns it on (said in a note). The
first request after a start with continuous batching pays ~25 s of warm-up on this CPU
(tried here, 2026-12); `engines.process.launch` sends one completion before anything is
measured, so that cost never lands in a measured window.
No `/metrics`: every figure of a transformers run is client-side.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from servetune.engines.base import LLAMACPP_ONLY, Device, FlagBuilder, LaunchSpec, PlannedPool
from servetune.engines.config import EngineConfig

name = "transformers"
default_port = 8000
health_path = "/health"
MODULE = "transformers.cli.transformers"  # what the `transformers` console script runs
TARGET_VERSION = "5.24.0"

NO_TOKENIZE = True  # no /tokenize: prompts use the model directory's tokenizer
# Requests with fields outside the OpenAI schema get HTTP 422 (`_validate_request` in
# transformers/cli/serving/utils.py): bench leaves out ignore_eos/min_tokens here.
OPENAI_FIELDS_ONLY = True
METRICS: dict[str, str] = {}  # no Prometheus endpoint
HISTOGRAMS: dict[str, str] = {}

# Tokens per KV block of continuous batching (ContinuousBatchingConfig.page_size default,
# transformers/generation/configuration_utils.py, 5.24.0).
CB_PAGE_TOKENS = 256

FAILURE_PATTERNS: list[tuple[str, str]] = [
    (r"No such option|Invalid value for|Got unexpected extra argument", "bad_flag"),
    (r"Address already in use|address already in use", "port_in_use"),
    (r"out of memory|Cannot allocate memory", "oom"),
    (
        r"is not a local folder and is not a valid model identifier|OSError: .*config\.json",
        "bad_model",
    ),
]

_NO_FLAG = (
    "quantization",  # --quantization takes bitsandbytes' bnb-4bit/bnb-8bit only
    "kv_cache_dtype",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "max_model_len",
    "kv_cache_space_gib",
    "block_size",  # --cb-block-size is deprecated since 5.17 (page_size is fixed at 256)
    "scheduling_policy",
)
# Continuous-batching settings: they mean something only with --continuous-batching.
_CB_FLAGS = {
    "max_num_batched_tokens": "--cb-max-batch-tokens",
    "gpu_memory_utilization": "--cb-max-memory-percent",
}


def build(
    cfg: EngineConfig,
    model: str,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    device: Device = "gpu",
    prefix: Sequence[str] | None = None,
    pool: PlannedPool | None = None,
) -> LaunchSpec:
    """EngineConfig -> `transformers serve MODEL ...`. The launcher adds HF_HUB_CACHE (an
    existing directory in servetune's cache, `engines.process`)."""
    port = default_port if port is None else port
    py = list(prefix) if prefix else ["python"]
    argv = [*py, "-m", MODULE, "serve", model, "--host", host, "--port", str(port)]
    b = FlagBuilder(cfg, argv)
    b.flag("--device", "cpu" if device == "cpu" else "cuda")
    if cfg.dtype != "auto":
        b.flag("--dtype", cfg.dtype, knob="dtype")
    batching = cfg.max_num_seqs is not None and cfg.max_num_seqs > 1
    if batching:
        b.flag("--continuous-batching", knob="max_num_seqs")
        b.notes.append(
            f"max_num_seqs {cfg.max_num_seqs}: --continuous-batching (no cap on requests "
            "per batch: its KV blocks and --cb-max-batch-tokens bound it)"
        )
        b.map(_CB_FLAGS)
        if cfg.kv_cache_tokens is not None:
            blocks = math.ceil(cfg.kv_cache_tokens / CB_PAGE_TOKENS)
            b.flag("--cb-num-blocks", blocks, knob="kv_cache_tokens")
            b.notes.append(f"kv_cache_tokens: {blocks} blocks of {CB_PAGE_TOKENS} tokens")
        if not cfg.enable_prefix_caching:
            b.unsupported_knob("enable_prefix_caching", "block sharing is always on")
    else:
        if cfg.max_num_seqs == 1:
            b.notes.append("max_num_seqs 1: the default, one generate() at a time")
        for knob in (*_CB_FLAGS, "kv_cache_tokens"):
            b.unsupported_if_set(knob, "only with continuous batching (max_num_seqs > 1)")
    for knob in _NO_FLAG:
        b.unsupported_if_set(knob, "transformers serve has no flag for it")
    b.unsupported_if_set("enable_chunked_prefill", "transformers prefills each prompt whole")
    if cfg.enforce_eager:
        b.notes.append("enforce_eager: transformers serve is eager unless --compile")
    for knob in (*LLAMACPP_ONLY, "n_gpu_layers"):
        b.unsupported_if_set(knob, "llama.cpp-only knob")
    b.env |= {"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1"}
    b.notes.append("no /metrics: every figure is client-side")
    return b.finish(name, host, port)
