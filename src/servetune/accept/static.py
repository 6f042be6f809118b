"""The items of seed 003 §15 read from files, the config and the store: nothing is sent.
Pure functions over what `run` gathered, except `hash_files` and `autoscaling_signals`
(they read the files they are given)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from servetune.accept.checklist import Finding, failed, not_applicable, passed, unchecked
from servetune.engines.config import EngineConfig
from servetune.errors import InputError
from servetune.store import RunInfo
from servetune.workload.materialize import Request
from servetune.yamlfile import read_text

WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt", ".pth")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")
LONG_TAIL = 8.0  # P99/P50 input ratio above which one pool mixes very different requests
MAX_GPU_MEM_UTIL = 0.93  # seed 003 §14's grid tops out at 0.93
KV_PEAK_MAX = 0.95  # the KV pool's peak use under the stages, without an SLO target
# llama.cpp names for the canonical batching knobs (docs/engines.md)
KNOB_ALIASES = {
    "llamacpp": {"max_num_seqs": "parallel_slots", "max_num_batched_tokens": "batch_size"}
}


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def hash_files(paths: Iterable[Path]) -> str:
    """One digest over several files: sha256 of their names and sha256s, sorted by name."""
    h = hashlib.sha256()
    for p in sorted(paths, key=lambda p: p.name):
        h.update(f"{p.name}:{sha256_file(p)}\n".encode())
    return h.hexdigest()


def model_pinned(model_path: Path | None, served_model: str | None) -> Finding:
    """Weights hashed over the files, tokenizer files hashed (a GGUF carries its own)."""
    if model_path is None:
        return unchecked(
            "give --model-path (the files the engine serves) to hash the weights",
            f"served model name: {served_model}",
        )
    files = [model_path] if model_path.is_file() else sorted(model_path.rglob("*"))
    weights = [f for f in files if f.is_file() and f.suffix in WEIGHT_SUFFIXES]
    if not weights:
        return failed(
            "serve weights from files that can be hashed (no dummy/random weights)",
            f"{model_path}: no weight files ({', '.join(WEIGHT_SUFFIXES)})",
        )
    digest = hash_files(weights)
    ev = [
        f"served as {served_model}",
        f"weights sha256 {digest[:16]}... over {len(weights)} "
        f"file(s), {sum(f.stat().st_size for f in weights) / 2**30:.2f} GiB",
    ]
    toks = [f for f in files if f.name in TOKENIZER_FILES]
    if toks:
        tok = hash_files(toks)
        ev.append(f"tokenizer sha256 {tok[:16]}... ({', '.join(sorted(f.name for f in toks))})")
    elif all(f.suffix == ".gguf" for f in weights):
        tok = digest
        ev.append("tokenizer: inside the GGUF, pinned by the weights hash")
    else:
        return failed("ship the tokenizer files with the weights", *ev, weights_sha256=digest)
    return passed(*ev, weights_sha256=digest, tokenizer_sha256=tok)


def stack_pinned(software: dict[str, Any], on_gpu: bool, world_size: int) -> Finding:
    """Engine version from the server itself; driver/CUDA from nvidia-smi; NCCL matters
    when more than one GPU talks."""
    engine_v = software.get("engine_version")
    ev = [f"engine {software.get('engine')} {engine_v or '(version not reported)'}"]
    if on_gpu:
        ev.append(f"driver {software.get('driver', '?')}, CUDA {software.get('cuda', '?')}")
    else:
        ev.append("driver/CUDA: not used (CPU deployment)")
    if world_size > 1:
        ev.append(f"NCCL {software.get('nccl', '?')} ({world_size} GPUs talk)")
    else:
        ev.append("NCCL: not used (one device)")
    missing = [
        k
        for k, need in (
            ("engine version", True),
            ("driver", on_gpu),
            ("cuda", on_gpu),
            ("nccl", world_size > 1),
        )
        if need and not software.get(k.replace("engine version", "engine_version"))
    ]
    if missing:
        return failed(f"record the {', '.join(missing)} (the server or host does not say)", *ev)
    return passed(
        *ev,
        **{k: software[k] for k in ("engine_version", "driver", "cuda", "nccl") if k in software},
    )


def quality(runs: Sequence[RunInfo]) -> Finding:
    """A stored quality result (`servetune quality` writes the run's quality field)."""
    judged = [r for r in runs if r.quality and "verdict" in r.quality]
    if not judged:
        return unchecked(
            "run `servetune quality` (baseline vs this model) so the store holds a quality verdict"
        )
    last = judged[-1]
    q: dict = last.quality or {}
    # `quality_check` is the quality part of seed 003 §2's rule; `verdict` is the whole rule
    # (throughput, cost, P99 too), which other items judge.
    verdict = str(q.get("quality_check", q["verdict"]))
    ev = f"quality {verdict!r} in run {last.id} (§2 verdict {q['verdict']!r})"
    ratio = q.get("perplexity_ratio")
    if ratio is not None:
        ev += f", perplexity x{ratio} (95% CI {q.get('perplexity_ratio_ci95')})"
    f = passed(ev) if verdict in ("pass", "accepted", "ok") else failed("fix the regression", ev)
    return f.with_run(last.id)


def long_short_pools(sample: Sequence[Request], decision: str | None) -> Finding:
    ins = np.array([r.prompt_tokens for r in sample])
    p50, p99 = float(np.percentile(ins, 50)), float(np.percentile(ins, 99))
    ratio = p99 / max(p50, 1.0)
    ev = f"input tokens P50 {p50:.0f}, P99 {p99:.0f} (P99/P50 = {ratio:.1f})"
    if decision:
        return passed(f"decided: {decision} pool(s)", ev)
    if ratio < LONG_TAIL:
        return not_applicable(f"{ev} < {LONG_TAIL:g}: no long tail, one pool is the decision")
    return failed("decide whether long prompts get their own pool (--pools shared|split)", ev)


def memory_headroom(
    cfg: EngineConfig | None, kv_peak: float | None, slo_max: float | None
) -> Finding:
    limit = slo_max or KV_PEAK_MAX
    ev = []
    if (
        cfg is not None
        and cfg.gpu_memory_utilization > MAX_GPU_MEM_UTIL
        and cfg.kv_cache_space_gib is None
    ):
        return failed(
            f"gpu_memory_utilization {cfg.gpu_memory_utilization} > {MAX_GPU_MEM_UTIL} "
            "(seed 003 §14's largest grid value): leave room for activation peaks"
        )
    if kv_peak is None:
        return unchecked(
            "the engine exports no KV-usage gauge: give a GPU/DCGM exporter or an "
            "engine that reports it (vLLM kv_cache_usage_perc)"
        )
    ev.append(f"KV pool peak use {kv_peak:.1%} under the stability stage (limit {limit:.0%})")
    if kv_peak > limit:
        return failed(
            "lower the load per replica or give the KV pool more memory", *ev, kv_peak=kv_peak
        )
    return passed(*ev, kv_peak=kv_peak)


def kv_capacity(engine: str, kv_peak: float | None, preemptions: float | None) -> Finding:
    if engine == "llamacpp":
        return not_applicable(
            "llama.cpp reserves each slot's context at start: concurrency "
            "beyond -np waits (see queue-bound)"
        )
    if preemptions is None and kv_peak is None:
        return unchecked("the engine reports neither preemptions nor KV use")
    ev = [
        f"preemptions during the stability stage: {preemptions:g}"
        if preemptions is not None
        else "preemptions: not reported",
        f"KV pool peak use {kv_peak:.1%}" if kv_peak is not None else "KV use: not reported",
    ]
    if (preemptions or 0) > 0:
        return failed(
            "the KV pool is too small for the target concurrency: more KV memory, "
            "fewer max_num_seqs or a shorter max_model_len",
            *ev,
        )
    return passed(*ev)


def _knob(engine: str, knob: str) -> str:
    return KNOB_ALIASES.get(engine, {}).get(knob, knob)


def knob_tested(
    knob: str, cfg: EngineConfig | None, runs: Sequence[RunInfo], need_latency: bool = False
) -> Finding:
    """The config's value of `knob` was measured on a real engine beside other values
    (a sweep), so the choice rests on data; `need_latency`: those runs report both TTFT
    and TPOT (the trade-off the seed asks to weigh)."""
    if cfg is None:
        return unchecked("give --config or --from-study: the chosen value is needed")
    name = _knob(cfg.engine, knob)
    value = getattr(cfg, name)
    seen: dict[Any, list[str]] = {}
    for r in runs:
        if r.backend != "real" or r.engine_config.get("engine") != cfg.engine:
            continue
        m = r.metrics or {}
        if need_latency and not (
            (m.get("ttft_ms") or {}).get("p95") and (m.get("tpot_ms") or {}).get("p95")
        ):
            continue
        seen.setdefault(r.engine_config.get(name), []).append(r.id)
    values = sorted(seen, key=lambda v: (v is None, v or 0))
    shown = "(the engine default)" if value is None else value
    ev = f"{name}={shown}; real runs measured {name} in {values}"
    if value not in seen:
        f = failed(f"measure {name}={shown} on the real engine (servetune tune / bench --set)", ev)
    elif len(seen) < 2:
        f = failed(f"sweep {name} (seed 003 §14 stage three): only one value was measured", ev)
    else:
        f = passed(ev, values=[str(v) for v in values])
    f.runs = seen.get(value, [])[:5]
    return f


def chunked_prefill(
    cfg: EngineConfig | None,
    engine: str,
    mix_line: str | None,
    mix_ok: bool | None,
    long_in: int | None,
) -> Finding:
    if engine == "llamacpp":
        return not_applicable("llama.cpp has no chunked-prefill switch: prompts run in -ub batches")
    if cfg is not None and not cfg.enable_chunked_prefill:
        return not_applicable("chunked prefill is off in this config")
    if mix_line is None:
        return unchecked("the stability stage's long/short mix did not run")
    ev = [f"long prompts of {long_in} tokens mixed with the real ones", mix_line]
    if not mix_ok:
        return failed(
            "long prompts break the SLO with chunked prefill: tune "
            "max_num_batched_tokens or split the pools",
            *ev,
        )
    return passed(*ev)


def cuda_graphs(cfg: EngineConfig | None, on_gpu: bool, peak_running: float | None) -> Finding:
    if not on_gpu or (cfg is not None and cfg.enforce_eager) or (cfg and cfg.engine == "llamacpp"):
        return not_applicable("no CUDA graphs here (CPU, llama.cpp or --enforce-eager)")
    if cfg is None or peak_running is None:
        return unchecked("give --config and an engine that reports its running requests")
    top = min(cfg.max_num_seqs or 256, 512)  # vLLM captures batch sizes up to this by default
    ev = f"graphs captured up to batch {top}; peak batch seen {peak_running:g}"
    if peak_running > top:
        return failed("capture the batch sizes actually seen (--cuda-graph-sizes)", ev)
    return passed(ev)


METRIC_PARENTS = ("metric", "resource", "containerResource")
# Seed 003 §11's scaling metrics (扩容指标): queue_wait, pending_requests, active_tokens,
# KV utilisation and TTFT - a metric is one when its name carries one of these (the
# engines' own names included: vLLM num_requests_waiting / gpu_cache_usage_perc, SGLang
# num_queue_reqs / token_usage, TGI queue_size / batch_current_size, llama.cpp
# requests_deferred / requests_processing, servetune's recorded servetune:* signals).
LOAD_SIGNALS = {
    "queue wait / pending requests": ("queue", "waiting", "pending", "deferred"),
    "active requests / tokens": ("running", "active_tokens", "active_requests",
                                 "batch_current", "requests_processing"),
    "KV cache use": ("kv_cache", "cache_usage", "token_usage"),
    "TTFT": ("ttft", "time_to_first_token"),
}  # fmt: skip
# GPU exporters (DCGM, nvidia-smi's): never a load signal, whatever their names carry
# (DCGM_FI_PROF_GR_ENGINE_ACTIVE is the graphics engine's busy share, not active tokens).
GPU_EXPORTERS = ("dcgm_", "nvidia_", "nvml_")
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def load_signal(metric: str) -> str | None:
    """Which §11 scaling signal a metric name or PromQL expression reads (its first), or
    None: GPU utilisation, CPU, memory or anything else. Quoted strings (label values) are
    not metric names and are skipped."""
    for name in _IDENT.findall(_QUOTED.sub(" ", metric)):
        low = name.lower()
        if low.startswith(GPU_EXPORTERS):
            continue
        for signal, words in LOAD_SIGNALS.items():
            if any(w in low for w in words):
                return signal
    return None


def autoscaling_signals(path: Path | None) -> Finding:
    """The scaling metrics of an HPA, a KEDA ScaledObject or a rules file: at least one
    must be one of seed 003 §11's scaling metrics - queue_wait, pending_requests,
    active_tokens, KV use or TTFT ("不要仅以GPU计算利用率作为扩容依据"). GPU utilisation
    under any name (DCGM_FI_DEV_GPU_UTIL, DCGM_FI_PROF_SM_ACTIVE, nvidia-smi's) and CPU
    or memory say nothing about the queue."""
    if path is None:
        return unchecked("give --autoscaling FILE (HPA, KEDA ScaledObject or rules YAML)")
    docs = autoscaling_docs(path)
    names = sorted(set(_metric_names(docs)))
    if not names:
        return failed("the file names no scaling metric", f"{path}: no metrics found")
    found = {n: sig for n in names if (sig := load_signal(n))}
    ev = f"scaling metrics: {', '.join(names)}"
    if not found:
        return failed(
            "scale on queue wait, pending requests, active tokens, KV cache use or TTFT "
            "(seed 003 §11): GPU utilisation is high whether the queue is empty or not, and "
            "CPU or memory do not see the queue",
            ev,
            "none of them is a load signal of seed 003 §11",
        )
    return passed(
        ev,
        "load signals: " + ", ".join(f"{n} ({sig})" for n, sig in found.items()),
        metrics=names,
        signals=sorted(found),
    )


def autoscaling_docs(path: Path) -> list[Any]:
    """The documents of an `--autoscaling` file (an HPA and a KEDA object may share one);
    `accept` reads it before any probe, so an unreadable file is one line, exit 2."""
    import yaml

    text = read_text(path, "--autoscaling")
    try:
        docs = [d for d in yaml.safe_load_all(text) if d]
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0]
        raise InputError("--autoscaling", f"{path} is not valid YAML", first) from None
    if not docs or not all(isinstance(d, dict) for d in docs):
        # a word or a list is YAML too: it passed, and the verdict came after the live
        # checks as "names no scaling metric", for a file that is no autoscaler at all
        raise InputError(
            "--autoscaling",
            f"{path} holds no mapping: an HPA, a KEDA ScaledObject or a rules file is one",
            "give the autoscaler's manifest (YAML or JSON)",
        )
    return docs


def _metric_names(node: Any, parent: str | None = None) -> Iterable[str]:
    """Every metric an autoscaler reads: HPA `metric.name` / `resource.name`, KEDA
    `metricName` / `query`, a Prometheus rule's `expr`."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("metricName", "query", "expr") and isinstance(v, str):
                yield v.strip()
            elif k == "name" and isinstance(v, str) and parent in METRIC_PARENTS:
                yield v
            else:
                yield from _metric_names(v, k)
    elif isinstance(node, list):
        for v in node:
            yield from _metric_names(v, parent)


def oom_step_back(cfg: EngineConfig | None, summary: dict[str, Any]) -> Finding:
    edges = summary.get("oom_edges") or []
    if cfg is None or not summary:
        return unchecked("run `servetune tune` (it finds the OOM edge) and pass --from-study")
    if not edges:
        return unchecked("the study searched no OOM edge (tune with a memory knob in the space)")
    ev, bad = [], []
    for e in edges:
        knob, value = e.get("knob"), getattr(cfg, e.get("knob", ""), None)
        ev.append(f"{knob}={value}: {e.get('note') or ''}".strip())
        first_fail, largest = e.get("first_fail"), e.get("largest_ok")
        if first_fail is not None and value is not None and value >= largest:
            bad.append(f"{knob}={value} sits on the edge (next step {first_fail} fails)")
    if bad:
        return failed(f"step back one value: {'; '.join(bad)}", *ev)
    return passed(*ev)


def _same_config(a: dict[str, Any], b: EngineConfig) -> bool:
    try:
        other = EngineConfig.model_validate(a)
    except ValueError:
        return False
    return other.model_dump(mode="json") == b.model_dump(mode="json")


def config_linked(cfg: EngineConfig | None, runs: Sequence[RunInfo]) -> Finding:
    """The shipped config has performance data in the store from before acceptance (a
    real bench or tune run of exactly this config; a simulated one measured the
    simulator), so a change can be compared and rolled back to a measured state."""
    if cfg is None:
        return unchecked("give --config or --from-study: the shipped config is needed")
    linked = [
        r
        for r in runs
        if r.backend == "real"  # a simulated run measured a model, not this deployment
        and r.engine_config
        and _same_config(r.engine_config, cfg)
        and "accept" not in r.tags
        and r.metrics
    ]
    if not linked:
        return failed(
            "measure this exact config before shipping (bench --set / tune) so the "
            "change is linked to data",
            "no stored real run has this config (simulated runs do not count)",
        )
    ids = [r.id for r in linked]
    f = passed(
        f"{len(ids)} stored run(s) of this exact config, latest {ids[-1]}",
        "canary and rollback are deployment steps: servetune links the data only",
    )
    f.runs = ids[-5:]
    return f
