"""Synthetic runs from a toy saturating server: stored runs for the store, runs and
report tests and for benchmarks/store_speed.py, without a server or the simulator.

Not a simulator (that is `servetune.sim`): a few lines of queueing arithmetic that give
records with the right shape. Per-token time grows with the batch,
tpot = t0 * (1 + b / knee), so throughput b / tpot rises linearly, then saturates toward
knee / t0 (seed 000 §3.1); past `max_num_seqs` requests queue, TTFT soars and throughput
stays flat (over-saturation).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np

from servetune.engines.config import EngineConfig
from servetune.metrics.compute import compute_metrics
from servetune.results.schema import Load, RequestRecord, RunResult, ServerSeries, Target
from servetune.slo import SLO
from servetune.status import RequestStatus
from servetune.store.meta import RunMeta

NS_PER_MS = 1_000_000
TOY_SLO = {"ttft_ms": {"p95": 800, "p99": 2000}, "tpot_ms": {"p95": 40}, "error_rate": 0.01}


def synthetic_run(
    concurrency: int,
    *,
    config: EngineConfig | None = None,
    backend: str = "real",
    n_requests: int | None = None,
    seed: int = 0,
    t0_ms: float = 12.0,
    knee: float = 24.0,
    error_rate: float = 0.01,
    created: datetime | None = None,
    model: str = "llama-3.1-8b",
    gpu: str = "h100-sxm",
) -> tuple[RunResult, RunMeta]:
    """One closed-loop load point: `n_requests` records (default: enough for every user
    to send several) at `concurrency` users."""
    n_requests = n_requests or max(120, 6 * concurrency)
    cfg = config or EngineConfig(max_num_seqs=64)
    rng = np.random.default_rng(seed * 7919 + concurrency * 31 + (backend == "sim"))
    cap = cfg.max_num_seqs or 256
    batch = min(concurrency, cap)
    tpot_ms = t0_ms * (1 + batch / knee) * (0.92 if backend == "sim" else 1.0)
    in_tok = np.clip(rng.lognormal(6.0, 0.6, n_requests), 16, 4096).astype(int)
    out_tok = np.clip(rng.lognormal(4.6, 0.5, n_requests), 4, 512).astype(int)
    service_ms = tpot_ms * out_tok.mean() + 0.05 * in_tok.mean()
    queue_ms = max(0, concurrency - cap) / cap * service_ms
    users = np.zeros(concurrency)  # next free time of each user, ms
    records: list[RequestRecord] = []
    for i in range(n_requests):
        u = int(np.argmin(users))
        send = users[u]
        ttft = 0.05 * in_tok[i] + queue_ms * rng.uniform(0.5, 1.5) + rng.gamma(2.0, 8.0)
        send_ns = int(send * NS_PER_MS)
        if rng.random() < error_rate:
            end = send + ttft
            records.append(
                RequestRecord(
                    index=i,
                    send_ns=send_ns,
                    end_ns=int(end * NS_PER_MS),
                    status=RequestStatus.ERROR,
                    error="http_5xx",
                    http_status=503,
                    prompt_tokens=int(in_tok[i]),
                    max_tokens=int(out_tok[i]),
                )
            )
            users[u] = end
            continue
        gaps = rng.gamma(16.0, tpot_ms / 16.0, out_tok[i] - 1)
        chunks = send + ttft + np.concatenate(([0.0], np.cumsum(gaps)))
        chunk_ns = (chunks * NS_PER_MS).astype(np.int64).tolist()
        records.append(
            RequestRecord(
                index=i,
                send_ns=send_ns,
                first_event_ns=send_ns + int(ttft * 0.9 * NS_PER_MS),
                chunk_ns=chunk_ns,
                chunk_tokens=[1] * len(chunk_ns),
                end_ns=chunk_ns[-1] + 200_000,
                prompt_tokens=int(in_tok[i]),
                max_tokens=int(out_tok[i]),
                usage_prompt_tokens=int(in_tok[i]),
                usage_completion_tokens=int(out_tok[i]),
                finish_reason="length",
            )
        )
        users[u] = chunks[-1] + 0.5
    records.sort(key=lambda r: (r.send_ns, r.index))
    slo = SLO.model_validate(TOY_SLO)
    metrics = compute_metrics(records, slo=slo)
    end_s = max(r.end_ns for r in records) / 1e9
    t = np.arange(0.0, end_s, 1.0)
    kv = min(1.0, batch * (in_tok.mean() + out_tok.mean() / 2) / 60_000)
    series = ServerSeries(
        t_ns=(t * 1e9).astype(np.int64).tolist(),
        values=[
            {
                "kv_cache_usage": float(np.clip(kv * rng.uniform(0.9, 1.05), 0, 1)),
                "requests_running": float(batch),
                "requests_waiting": float(max(0, concurrency - cap) * rng.uniform(0.8, 1.2)),
                "preemptions_total": float(int(j * max(0.0, kv - 0.95) * 10)),
            }
            for j in range(len(t))
        ],
    )
    created = created or datetime(2026, 1, 1, tzinfo=timezone.utc)
    created += timedelta(minutes=concurrency, seconds=int(backend == "sim"))
    run_id = (
        f"{'sim' if backend == 'sim' else 'bench'}-{created:%Y%m%dT%H%M%S}-c{concurrency}-s{seed}"
    )
    result = RunResult(
        id=run_id,
        created_utc=created.isoformat(),
        backend=backend,  # type: ignore[arg-type]
        target=Target(url="http://127.0.0.1:8000", api="chat", model=model),
        workload={
            "name": "chat-synthetic",
            "seed": seed,
            "api": "chat",
            "arrival": {"kind": "closed", "concurrency": concurrency},
        },
        load=Load(kind="closed", rate=None, concurrency=concurrency),
        slo=slo,
        duration_s=end_s,
        records=records,
        metrics=metrics,
        server=series,
    )
    meta = RunMeta(
        id=run_id,
        backend=backend,  # type: ignore[arg-type]
        model=model,
        engine_config=cfg.model_dump(mode="json"),
        hardware={"gpu": gpu, "gpu_count": cfg.world_size, "cpu": "synthetic", "memory_gib": 64},
        software={"engine_version": "synthetic"},
        launch_command=["vllm", "serve", model, f"--max-num-seqs={cap}"],
    )
    return result, meta


def synthetic_sweep(
    concurrencies: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128),
    **kw: Any,
) -> list[tuple[RunResult, RunMeta]]:
    """One run per concurrency level (a study's worth)."""
    return [synthetic_run(c, **kw) for c in concurrencies]
