"""The seed 003 §16 experiment record of one run, as labelled sections of text: what
`runs show` prints and the report's table shows. Pure formatting of stored data."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from servetune.build import with_build
from servetune.measure.result import sim_signals
from servetune.metrics.pct import dist_text, sample_note
from servetune.results.schema import Load
from servetune.store.compare import knob_defaults
from servetune.store.meta import simulated_request_distribution
from servetune.store.runinfo import RunInfo

Section = tuple[str, list[tuple[str, str]]]

# Knobs shown under their §16 heading; any other non-default knob is listed after them.
CORE_KNOBS = {
    "parallelism": ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"),
    "context": ("max_model_len",),
    "KV cache": (
        "kv_cache_dtype",
        "gpu_memory_utilization",
        "kv_cache_space_gib",
        "kv_cache_tokens",
        "block_size",
        "enable_prefix_caching",
    ),
    "batching": ("max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill"),
    "scheduling": ("scheduling_policy",),
}
_SHOWN = {"engine", "dtype", "quantization"} | {k for ks in CORE_KNOBS.values() for k in ks}


def fmt(v: Any, digits: int = 3) -> str:
    """Numbers to 3 significant digits (ms, tok/s), None as '-'."""
    if v is None or v == "":
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.{digits}g}"
    if isinstance(v, (list, tuple)):
        return " ".join(str(x) for x in v) if v else "-"
    if isinstance(v, Mapping):
        return ", ".join(f"{k}={fmt(x)}" for k, x in v.items()) or "-"
    return str(v)


def _pct(d: Mapping[str, Any] | None, n: int | None = None) -> str:
    """P50 / P95 / P99 with the requests they rest on (`metrics.pct`)."""
    return dist_text(d, n=n)


def experiment_record(info: RunInfo, metrics: Mapping[str, Any] | None = None) -> list[Section]:
    """§16 fields: id/date, model & precision, hardware, software, request distribution,
    core parameters, performance, quality, stability, conclusion."""
    m = dict(metrics if metrics is not None else info.metrics or {})
    meta, hw, sw = info.meta, info.meta.get("hardware") or {}, info.meta.get("software") or {}
    prec = meta.get("precision") or {}
    cfg = info.engine_config
    rd, lengths_from = request_lengths(info)
    st = info.stability or {}
    load = info.load
    workload = info.part("workload") or {}
    server = info.result.get("server_summary") or {}
    status = info.status + (f" ({info.stop_reason})" if info.stop_reason else "")

    sections: list[Section] = [
        (
            "Experiment",
            [
                ("id", info.id),
                ("date (UTC)", info.created_utc),
                ("study", fmt(info.study)),
                ("backend", info.backend),
                ("status", status),
                ("tags", fmt(info.tags)),
                ("note", fmt(meta.get("note"))),
            ],
        ),
        (
            "Model & precision",
            [
                ("model", fmt(info.model)),
                ("dtype", fmt(prec.get("dtype"))),
                ("quantization", fmt(prec.get("quantization"))),
                ("KV cache dtype", fmt(prec.get("kv_cache_dtype"))),
            ],
        ),
        (
            "Hardware",
            [
                ("GPU", fmt(hw.get("gpu"))),
                ("GPU count", fmt(hw.get("gpu_count") or info.gpu_count)),
                ("topology", fmt(_first_line(hw.get("topology")))),
                ("CPU", f"{fmt(hw.get('cpu'))} ({fmt(hw.get('cpu_count'))} cores)"),
                ("memory GiB", fmt(hw.get("memory_gib"))),
            ],
        ),
        (
            "Software stack",
            [
                ("engine", f"{fmt(info.engine)} {sw.get('engine_version') or ''}".strip()),
                ("driver / CUDA", " / ".join(fmt(sw.get(k)) for k in ("driver", "cuda"))),
                ("NCCL", fmt(sw.get("nccl")) if sw.get("nccl") else NCCL_NOT_RECORDED),
                ("servetune", with_build(fmt(sw.get("servetune")), sw.get("servetune_build"))),
                ("python / OS", f"{fmt(sw.get('python'))} / {fmt(sw.get('os'))}"),
            ],
        ),
        (
            "Request distribution",
            [
                ("requests", _requests(rd, info.n_records, lengths_from)),
                (
                    "input tokens P50/P95/P99",
                    _lengths(rd.get("input_tokens"), rd.get("requests"), lengths_from),
                ),
                (
                    "output tokens P50/P95/P99",
                    _lengths(rd.get("output_tokens"), _output_n(rd, m), lengths_from),
                ),
                ("arrival", fmt(load.kind)),
                ("concurrency", fmt(load.concurrency)),
                ("rate (offered / achieved)", _rates(m, load, workload)),
                ("workload", fmt(workload.get("name") or workload.get("api"))),
            ],
        ),
        ("Core parameters", _core_params(cfg, meta.get("launch_command"))),
        (
            "Performance",
            [
                ("TTFT ms P50/P95/P99", _pct(m.get("ttft_ms"))),
                ("TPOT ms P50/P95/P99", _pct(m.get("tpot_ms"))),
                ("ITL ms P50/P95/P99", _pct(m.get("itl_ms"))),
                ("E2E ms P50/P95/P99", _pct(m.get("e2e_ms"))),
                (
                    "output / total tok/s",
                    f"{fmt(m.get('output_tok_s'))} / {fmt(m.get('total_tok_s'))}",
                ),
                ("req/s (goodput)", f"{fmt(m.get('req_s'))} ({fmt(m.get('goodput_req_s'))})"),
                ("SLO", _slo(m)),
                ("KV cache usage max", kv_usage_max(info, server)),
                ("GPU memory / util", _gpu_use(server)),
            ],
        ),
        ("Quality", [(k, fmt(v)) for k, v in (info.quality or {}).items()] or [_NO_QUALITY]),
        (
            "Stability",
            [
                ("errors (rate)", f"{fmt(st.get('errors'))} ({fmt(st.get('error_rate'))})"),
                ("by class", fmt(st.get("errors_by_class"))),
                (
                    "5xx / OOM / timeouts",
                    " / ".join(fmt(st.get(k)) for k in ("http_5xx", "ooms", "timeouts")),
                ),
                (
                    "cancelled (server freed)",
                    f"{fmt(st.get('cancelled'))} ({fmt(st.get('cancellation_freed'))})",
                ),
                ("TTFT, TPOT P99/P50", _tail_ratios(st, m)),
                ("P99 jitter (CV over 5 slices)", _jitter(st.get("p99_jitter_cv"), m)),
                ("preemptions", preemptions(info, server)),
                ("client bottleneck", fmt((info.result.get("client") or {}).get("warnings"))),
            ],
        ),
        (
            "Conclusion",
            [
                ("verdict", fmt(info.conclusion)),
                ("note", fmt(info.conclusion_note)),
                ("date (UTC)", fmt(info.concluded_utc)),
            ],
        ),
    ]
    return sections


def side_by_side(records: Sequence[list[Section]]) -> list[tuple[str, list[tuple[str, list[str]]]]]:
    """Several runs' records as one table: each section's rows are the ordered union of
    the runs' labels, each value looked up by its label ('-' where a run has none), since
    runs differ in their rows (engine knobs recorded or not, their own quality scores)."""
    titles: dict[str, dict[str, None]] = {}
    for rec in records:
        for title, fields in rec:
            titles.setdefault(title, {}).update(dict.fromkeys(label for label, _ in fields))
    runs = [{title: dict(fields) for title, fields in rec} for rec in records]

    def row(title: str, label: str) -> tuple[str, list[str]]:
        return label, [run.get(title, {}).get(label, "-") for run in runs]

    return [(title, [row(title, label) for label in labels]) for title, labels in titles.items()]


# What a record shows for seed 003 §16 fields that nothing fills yet, and how to fill them.
GPU_NOT_MEASURED = (
    "not measured: no GPU telemetry is read (watch `nvidia-smi --query-gpu="
    "memory.used,utilization.gpu --format=csv -l 1` during the run)"
)
# NCCL lives in the engine's process (its torch build), which servetune neither imports
# nor can ask over HTTP: only a caller that knows it (RunMeta.software["nccl"]) records it.
NCCL_NOT_RECORDED = "not recorded (the engine's own library: servetune cannot read it)"
_NO_QUALITY = (
    "-",
    "not measured: run `servetune quality --baseline URL --candidate URL --candidate-run"
    " RUN` (docs/quality.md), or record your own eval with Store.set_quality(run_id, {...})",
)


NOT_RECORDED_SIM = "not recorded by the simulator"
REDRAWN = "redrawn from the workload: the simulator stores no records for this run"


def _sim_without_records(info: RunInfo) -> bool:
    """A simulated run that measured requests but stored none (a tune trial): "0
    requests" would read as an empty run. A run that never ran is left as it is."""
    measured = (info.metrics or {}).get("measured")
    return info.backend == "sim" and not info.n_records and bool(measured)


def request_lengths(info: RunInfo) -> tuple[dict[str, Any], str]:
    """The run's request distribution and where it comes from: '' for the stored one
    (from its records); for a simulated run without records, its lengths redrawn from its
    workload (`REDRAWN`), or none (`NOT_RECORDED_SIM`) when they cannot be redrawn."""
    rd = dict(info.request_dist or {})
    if not _sim_without_records(info) or rd.get("requests"):
        return rd, ""
    redrawn = simulated_request_distribution(info.part("workload") or {})
    if redrawn is None:
        return rd, NOT_RECORDED_SIM
    return rd | redrawn, REDRAWN


def _requests(rd: Mapping[str, Any], n_records: int, source: str) -> str:
    """The request count, saying when it is not the stored records'."""
    if source == NOT_RECORDED_SIM:
        return NOT_RECORDED_SIM
    n = fmt(rd.get("requests", n_records))
    return f"{n} ({source})" if source else n


def _lengths(d: Mapping[str, Any] | None, n: int | None, source: str) -> str:
    """Token-length P50/P95/P99 with n, or why a simulated run has none."""
    if not d and source:
        return NOT_RECORDED_SIM
    return _pct(d, n)


def _output_n(rd: Mapping[str, Any], m: Mapping[str, Any]) -> int | None:
    """Output lengths rest on the completed requests; redrawn ones on every request."""
    return rd.get("requests") if rd.get("source") == "workload" else m.get("completed")


def kv_usage_max(info: RunInfo, server: Mapping[str, Any]) -> str:
    """Peak KV-cache usage: the engine's /metrics summary, or for a simulated run (no
    /metrics) the simulator's peak blocks in use over its pool (`target.sim`), the
    fraction its memory SLO check reads too."""
    if server.get("kv_cache_usage_max") is not None or info.backend != "sim":
        return fmt(server.get("kv_cache_usage_max"))
    if not info.target.sim:
        return NOT_RECORDED_SIM
    sig = sim_signals(info.target)
    used, blocks = sig["max_kv_blocks_used"], sig["kv_blocks"]
    if not blocks:
        return "- (slots preallocate their KV: no pool to fill)"
    return f"{fmt(used / blocks)} ({used:,} of {blocks:,} blocks)"


def preemptions(info: RunInfo, server: Mapping[str, Any]) -> str:
    """Preemptions: the engine's counter, or for a simulated run the simulator's."""
    if server.get("preemptions") is not None or info.backend != "sim":
        return fmt(server.get("preemptions"))
    if not info.target.sim:
        return NOT_RECORDED_SIM
    return fmt(sim_signals(info.target)["preemptions"])


def _tail_ratios(st: Mapping[str, Any], m: Mapping[str, Any]) -> str:
    """P99/P50 of TTFT and TPOT, with the requests the P99s rest on."""
    a, b = st.get("ttft_p99_over_p50"), st.get("tpot_p99_over_p50")
    if a is None and b is None:
        return "-"
    return f"{fmt(a)}, {fmt(b)} ({sample_note('p99', (m.get('ttft_ms') or {}).get('count'))})"


def _jitter(cv: Any, m: Mapping[str, Any]) -> str:
    """The P99 jitter with the requests each slice's P99 rests on (a fifth of the run's)."""
    if cv is None:
        return "-"
    n = (m.get("ttft_ms") or {}).get("count")
    return f"{fmt(cv)} ({sample_note('p99', n // 5 if n else None)} per slice)"


def _offered(m: Mapping[str, Any], load: Load, workload: Mapping[str, Any]) -> str:
    """The offered rate with its unit: none in a closed loop (each user sends when its
    last request ends, so the rate is an outcome, shown as achieved), else the arrivals
    per second the run measured or, without them, the workload's rate. A sessions
    workload's schedule offers sessions/s (`metrics.offered_unit`), not req/s."""
    if load.kind == "closed":
        return "- (closed loop)"
    planned = "sessions/s" if workload.get("sessions") else "req/s"  # the load's rate
    if m.get("offered_req_s"):
        return f"{fmt(m['offered_req_s'])} {m.get('offered_unit') or planned}"
    return f"{fmt(load.rate)} {planned}" if load.rate is not None else "-"


def _rates(m: Mapping[str, Any], load: Load, workload: Mapping[str, Any]) -> str:
    """Offered / achieved, each with its unit: achieved is always completed requests/s."""
    achieved = m.get("req_s")
    done = "-" if achieved is None else f"{fmt(achieved)} req/s"
    return f"{_offered(m, load, workload)} / {done}"


def _gpu_use(server: Mapping[str, Any]) -> str:
    """Peak GPU memory / mean utilisation from the scraped series, when it has them:
    `68.0 GiB peak / 88% mean` (raw bytes and a fraction read as neither)."""
    mem, util = server.get("gpu_memory_used_max"), server.get("gpu_util_mean")
    if mem is None and util is None:
        return GPU_NOT_MEASURED
    # the summary keeps bytes and a 0..1 fraction (`server_summary`): read as GiB and %
    peak = "-" if mem is None else f"{mem / 2**30:.1f} GiB peak"
    mean = "-" if util is None else f"{util:.0%} mean"
    return f"{peak} / {mean}"


def _first_line(text: Any) -> Any:
    return text.splitlines()[0] if isinstance(text, str) and text else text


def _slo(m: Mapping[str, Any]) -> str:
    if m.get("slo_pass") is None:
        return "-"
    verdict = "pass" if m["slo_pass"] else "FAIL"
    return f"{verdict}, attainment {fmt(m.get('slo_attainment'))}"


def _core_params(cfg: Mapping[str, Any], launch: Any) -> list[tuple[str, str]]:
    if not cfg and not launch:
        return [("-", "no engine config recorded")]
    defaults = knob_defaults()
    rows = [
        (title, ", ".join(f"{k}={fmt(cfg.get(k, defaults.get(k)))}" for k in keys))
        for title, keys in CORE_KNOBS.items()
    ]
    other = {k: v for k, v in cfg.items() if k not in _SHOWN and _set_by_run(k, v, defaults)}
    if other:
        rows.append(("other knobs", fmt(other)))
    if launch:
        rows.append(("launch", launch if isinstance(launch, str) else " ".join(launch)))
    return rows


def _set_by_run(knob: str, value: Any, defaults: Mapping[str, Any]) -> bool:
    """Whether a stored knob differs from its default, compared as JSON: the store keeps
    a tuple default (`extra_args=()`) as a list, and `[] != ()` listed it as set."""
    if knob not in defaults:
        return True
    return json.dumps(value, sort_keys=True, default=str) != json.dumps(
        defaults[knob], sort_keys=True, default=str
    )
