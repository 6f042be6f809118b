"""Session metrics, from the raw records of a session run (`WorkloadSpec.sessions`).

Each record of a session run names its turn in `sub` (`turn0` first, `turn1`... the
follow-ups) and its session in `prefix_group` (`workload.session_plan`). From those:

- TTFT and TPOT by turn class (first vs follow-up) and by turn index: a follow-up's
  prompt is mostly history, so its TTFT is where prefix caching shows (seed 003 §4);
- session duration: the first turn's send to the last turn's last chunk;
- tokens re-sent (history the client sent again) and the hit rate the workload allows:
  per follow-up, the previous turn's prompt, when this prompt still extends it (it grew
  by at least the previous answer; after a context cap dropped history, the system
  prompt only); per first turn, its system prompt unless it is the first sent with that
  one (first turns sent together may still miss it: each computes before the others'
  blocks are cached); in whole cache blocks and never the last prompt token (vLLM
  computes one token to sample from: vllm/v1/core/kv_cache_manager.py,
  get_computed_blocks);
- the hit rate the engine measured, next to it: vLLM's counters
  (`prefix_cache_hits_total` / `prefix_cache_queries_total`, prompt tokens, over the
  run), else per-request cached tokens (llama.cpp's `timings.cache_n`; the simulator's
  `cached`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from servetune.metrics.compute import compute_metrics, request_latencies_ms
from servetune.metrics.stats import summarize
from servetune.results.schema import Dist, Metrics, RequestRecord, RunResult
from servetune.slo import SLO
from servetune.status import RequestStatus
from servetune.workload.session_plan import SESSION_POOL, plan_sessions
from servetune.workload.spec import WorkloadSpec

TURN_CLASSES = ("first", "followup")


def turn_index(sub: str) -> int | None:
    """`turn3` -> 3; None for a record of a request workload."""
    return int(sub[4:]) if sub.startswith("turn") and sub[4:].isdigit() else None


def in_class(sub: str, turns: str) -> bool:
    """Whether a record's turn belongs to `turns` (all | first | followup)."""
    j = turn_index(sub)
    return turns == "all" or (j is not None and (j == 0) == (turns == "first"))


class TurnLatency(BaseModel):
    requests: int = 0  # answered: the latencies are theirs
    failed: int = 0  # the turn's requests that failed (no latency)
    ttft_ms: Dist = Field(default_factory=Dist)
    tpot_ms: Dist = Field(default_factory=Dist)


class SessionMetrics(BaseModel):
    sessions: int  # started (any turn sent)
    turns: int  # answered
    broken_sessions: int = Field(0, description="Sessions a failed turn ended early.")
    failed_turns: int = 0
    first: TurnLatency
    followup: TurnLatency
    by_turn: dict[int, TurnLatency]
    session_duration_s: Dist
    prompt_tokens: int
    resent_tokens: int = Field(description="History the client sent again (follow-ups).")
    allowed_hit_rate: float = Field(description="Prompt tokens the workload lets a cache serve.")
    cached_tokens: int | None = Field(None, description="Prompt tokens the engine served cached.")
    measured_hit_rate: float | None = None

    @property
    def computed_tokens(self) -> int | None:
        """Prompt tokens the engine computed (re-sent minus what its cache served)."""
        return None if self.cached_tokens is None else self.prompt_tokens - self.cached_tokens


def _session(r: RequestRecord) -> int:
    """The session a turn's record belongs to (`prefix_group`; -1: none named)."""
    return r.prefix_group if r.prefix_group is not None else -1


def _latency(recs: Sequence[RequestRecord], failed: int = 0) -> TurnLatency:
    ttft, tpot = [], []
    for r in recs:
        a, b, _ = request_latencies_ms(r)
        if a is not None:
            ttft.append(a)
        if b is not None:
            tpot.append(b)
    return TurnLatency(
        requests=len(recs), failed=failed, ttft_ms=summarize(ttft), tpot_ms=summarize(tpot)
    )


def allowed_reuse(
    prev: RequestRecord,
    cur: RequestRecord,
    block_tokens: int,
    system_tokens: int = 0,
    cut: bool | None = None,
) -> int:
    """Prompt tokens of `cur` a prefix cache can serve from `prev`, the turn before it;
    when the history was cut, its system prompt only. `cut`: the plan's word (a turn whose
    `keep_from` moved); None: guessed from the lengths (the prompt no longer extends
    `prev`), which misses a cut whose new message outgrew what it dropped (an agent's tool
    results: 67% allowed where 63% was, and measured)."""
    p, q = prev.input_tokens, cur.input_tokens
    if cut if cut is not None else q < p + prev.output_tokens:
        p = system_tokens
    return (min(p, q - 1) // block_tokens) * block_tokens


def session_metrics(
    records: Iterable[RequestRecord],
    *,
    block_tokens: int = 1,
    server_deltas: dict[str, float] | None = None,
    system_prompts: dict[int, tuple[int, int]] | None = None,
    cuts: set[tuple[int, int]] | None = None,
) -> SessionMetrics | None:
    """The session view of a run's records; None when they are not a session run.
    `block_tokens`: the engine's cache granularity (vLLM's block size; 1 for llama.cpp).
    `system_prompts`: session -> (system prompt group, tokens), from the plan
    (`SessionPlan.system_prompts`); without it shared system prompts are not counted.
    `cuts`: (session, turn) pairs whose history a context cap cut, from the plan
    (`SessionPlan.cuts`); None: guessed from the lengths (`allowed_reuse`)."""
    turns = [r for r in records if turn_index(r.sub) is not None]
    ok = [r for r in turns if r.status == RequestStatus.OK]
    if not ok:
        return None
    # a failed turn ends its session early: counted, and its session kept out of the
    # durations (they had counted only answered turns: 12 sessions with 3 broken read as
    # 9, and a broken session as a short one)
    failed = [r for r in turns if r.status == RequestStatus.ERROR]
    broken = {_session(r) for r in failed}
    by_session: dict[int, list[RequestRecord]] = defaultdict(list)
    by_turn: dict[int, list[RequestRecord]] = defaultdict(list)
    for r in ok:
        j = turn_index(r.sub)
        assert j is not None
        by_session[_session(r)].append(r)
        by_turn[j].append(r)
    failed_by_turn: dict[int, int] = defaultdict(int)
    for r in failed:
        failed_by_turn[turn_index(r.sub) or 0] += 1
    durations, resent, allowed = [], 0, 0
    systems = system_prompts or {}
    for s, recs in by_session.items():
        sys_tokens = systems.get(s, (-1, 0))[1]
        recs.sort(key=lambda r: turn_index(r.sub) or 0)
        if s not in broken:
            durations.append((max(r.end_ns for r in recs) - recs[0].send_ns) / 1e9)
        for prev, cur in zip(recs, recs[1:], strict=False):
            j = turn_index(cur.sub) or 0
            if j == (turn_index(prev.sub) or 0) + 1:
                cut = None if cuts is None else (s, j) in cuts
                resent += allowed_reuse(prev, cur, 1, sys_tokens, cut)
                allowed += allowed_reuse(prev, cur, block_tokens, sys_tokens, cut)
    allowed += _system_reuse([r for r in ok if r.sub == "turn0"], system_prompts, block_tokens)
    prompt = sum(r.input_tokens for r in ok)
    cached, measured = _engine_cache(ok, server_deltas)
    later = [r for j, rs in by_turn.items() if j > 0 for r in rs]
    return SessionMetrics(
        sessions=len({_session(r) for r in turns}),
        turns=len(ok),
        broken_sessions=len(broken),
        failed_turns=len(failed),
        first=_latency(by_turn.get(0, []), failed_by_turn.get(0, 0)),
        followup=_latency(later, sum(n for j, n in failed_by_turn.items() if j > 0)),
        by_turn={
            j: _latency(by_turn.get(j, []), failed_by_turn.get(j, 0))
            for j in sorted({*by_turn, *failed_by_turn})
        },
        session_duration_s=summarize(np.asarray(durations)),
        prompt_tokens=prompt,
        resent_tokens=resent,
        allowed_hit_rate=allowed / prompt if prompt else 0.0,
        cached_tokens=cached,
        measured_hit_rate=measured,
    )


def _system_reuse(
    firsts: list[RequestRecord], systems: dict[int, tuple[int, int]] | None, block_tokens: int
) -> int:
    """Tokens first turns can find cached from other sessions' system prompts: all but the
    first sent with each system prompt."""
    if not systems:
        return 0
    seen: set[int] = set()
    total = 0
    for r in sorted(firsts, key=lambda r: r.send_ns):
        g, n = systems.get(r.prefix_group if r.prefix_group is not None else -1, (-1, 0))
        if g >= 0 and g in seen:
            total += (min(n, r.input_tokens - 1) // block_tokens) * block_tokens
        seen.add(g)
    return total


def _engine_cache(
    recs: Sequence[RequestRecord], deltas: dict[str, float] | None
) -> tuple[int | None, float | None]:
    """(cached prompt tokens, hit rate) as the engine reports them, or (None, None)."""
    d = deltas or {}
    if "prefix_cache_queries_total" in d:  # no lookups (caching off): nothing hit
        queries, hits = d["prefix_cache_queries_total"], d.get("prefix_cache_hits_total", 0.0)
        return int(hits), hits / queries if queries > 0 else 0.0
    per = [(r.server_timings or {}) for r in recs]
    key = next((k for k in ("cache_n", "cached") if any(k in t for t in per)), None)
    if key is None:
        return None, None
    cached = int(sum(t.get(key, 0.0) for t in per))
    prompt = sum(r.input_tokens for r in recs)
    return cached, cached / prompt if prompt else None


def apply_turn_slo(
    m: Metrics, records: Sequence[RequestRecord], slo: SLO, spec: WorkloadSpec
) -> None:
    """Judge the SLO on one turn class only (e.g. P95 TTFT of follow-ups): the class's own
    metrics, over the run's own window rules (warm-up, cool-down, streamed or not),
    replace the run's pass/fail, attainment and goodput."""
    if spec.sessions is None or spec.sessions.slo_turns == "all":
        return
    turns = spec.sessions.slo_turns
    part = [r for r in records if in_class(r.sub, turns)]
    sub = compute_metrics(
        part, warmup_s=spec.warmup_s, cooldown_s=spec.cooldown_s, slo=slo, stream=spec.stream
    )
    m.slo_checks = [c.model_copy(update={"metric": f"{turns}.{c.metric}"}) for c in sub.slo_checks]
    m.slo_pass = sub.slo_pass
    m.slo_attainment = sub.slo_attainment
    m.goodput_req_s = sub.goodput_req_s


def run_session_metrics(res: RunResult) -> SessionMetrics | None:
    """`session_metrics` of a stored or fresh run: the cache block of its engine (vLLM's
    block size as its /metrics reported it, else as configured, else 16, its GPU default;
    1 for llama.cpp or an unknown server), the engine's counters, the system prompts of its
    workload. None when it is not a session run."""
    spec = WorkloadSpec.model_validate(res.workload) if res.workload else None
    if spec is None or spec.sessions is None:
        return None
    cfg = res.target.config or {}
    engine = res.target.engine or cfg.get("engine")
    reported = res.server.peak("kv_block_tokens") if res.server else None
    block = int(reported or cfg.get("block_size", 16)) if engine == "vllm" else 1
    plan = plan_sessions(spec)
    return session_metrics(
        res.records,
        block_tokens=block,
        server_deltas=res.server.deltas if res.server else None,
        system_prompts=plan.system_prompts(),
        cuts=plan.cuts(),
    )


def session_fields(res: RunResult) -> dict[str, Any]:
    """`{"sessions": ...}` for a session run's --json summary (empty otherwise): the
    figures `session_line` prints, for scripts, without changing the RunResult schema."""
    m = run_session_metrics(res)
    return {} if m is None else {"sessions": m.model_dump(mode="json")}


def session_line(res: RunResult) -> str | None:
    """One line for the CLI: follow-up vs first-turn TTFT and the cache hit rates."""
    m = run_session_metrics(res)
    if m is None:
        return None

    def ms(d: Dist) -> str:
        return "/".join("-" if v is None else f"{v:,.0f}" for v in (d.p50, d.p95))

    hit = "-" if m.measured_hit_rate is None else f"{m.measured_hit_rate:.0%}"
    broke = (
        f" ({m.broken_sessions} ended early by {m.failed_turns} failed turns)"
        if m.broken_sessions
        else ""
    )
    line = (
        f"{m.sessions} sessions{broke}: TTFT p50/p95 first {ms(m.first.ttft_ms)} ms, "
        f"follow-up {ms(m.followup.ttft_ms)} ms; prefix-cache hit rate {hit} "
        f"(the workload allows {m.allowed_hit_rate:.0%}); {m.resent_tokens:,} tokens re-sent"
    )
    return line + (f"; {out}" if (out := ran_out(res, m.sessions)) else "")


def ran_out(res: RunResult, sessions: int) -> str | None:
    """A closed loop of sessions sized by its duration plans SESSION_POOL sessions and
    does not cycle them, as a request pool does: when they run out before the duration,
    users drop out one by one and the load is no longer the users asked (256 users for
    120 s stopped sending at 49 s). Said, with the fix, rather than read as that load."""
    spec = WorkloadSpec.model_validate(res.workload)
    if spec.arrival.open_loop or spec.count is not None or not spec.duration_s:
        return None
    if sessions < SESSION_POOL or not res.records:
        return None
    sends = [r.send_ns for r in res.records]
    span = (max(sends) - min(sends)) / 1e9
    if span >= 0.9 * spec.duration_s:
        return None
    return (
        f"the {SESSION_POOL} planned sessions ran out {span:.0f} s into the "
        f"{spec.duration_s:g} s asked, users dropping out as they did: give the workload a "
        "`count` of sessions that lasts the duration"
    )
