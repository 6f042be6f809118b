"""Seed 003 §14 stage six (稳定性压测): steady state, peak, burst, long/short mix, very
long outputs and a disconnect storm, each a point through the measure seam at the tuned
load, each judged against the SLO. The stage's runs also give the memory items their
evidence: the KV pool's peak use and preemptions under these loads.

The tuned load L is the peak the deployment is sized for (what `tune` found it carries
within the SLO, or --load). Stages other than "peak" run at 0.7 L: the seed names no
factor; 0.7 is a common daily-peak to provisioned-peak ratio, and what matters is that
each stage changes one thing (arrivals, lengths, cancels) at the same load.
"""

from __future__ import annotations

import math
import os
import shlex
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from servetune.accept.checklist import Finding, failed, passed, unchecked
from servetune.accept.measuring import Prober, Sizes, at_rate
from servetune.accept.probes import Capacity
from servetune.measure.steady import SteadyRule, judge
from servetune.results.schema import RequestRecord, RunResult
from servetune.status import RequestStatus
from servetune.workload.materialize import Request
from servetune.workload.spec import WorkloadSpec

BASE = 0.7  # the stages' share of the tuned load (see the module docstring)
BURSTINESS = 0.25  # gamma shape: inter-arrival CV^2 = 1 / 0.25 = 4 (bursty, not Poisson)
CANCEL_FRACTION = 0.5  # the disconnect storm: half the clients go away mid-stream
LONG_WEIGHT = 0.2  # the long/short mix: one request in five is long
# A stage's errors (5xx, 429 sheds, timeouts; not its deliberate cancels) when the SLO
# sets no error_rate: seed 003 §1's example asks 5xx < 0.1%, which a stage of tens of
# requests cannot resolve; 1% still fails a deployment that sheds its own tuned load.
ERROR_RATE = 0.01


@dataclass(frozen=True)
class Load:
    kind: str  # "rate" or "concurrency"
    value: float

    def scaled(self, f: float) -> Load:
        if self.kind == "concurrency":
            return Load(self.kind, max(1, round(self.value * f)))
        return Load(self.kind, self.value * f)

    def apply(self, spec: WorkloadSpec, count: int, **arrival: Any) -> WorkloadSpec:
        if self.kind == "concurrency":
            return spec.with_load(concurrency=int(self.value), count=count)
        return at_rate(spec, self.value, count, **arrival)

    def text(self) -> str:
        return f"{self.value:g} users" if self.kind == "concurrency" else f"{self.value:.3g} req/s"


@dataclass
class StageResult:
    name: str
    load: Load
    ok: bool
    line: str
    run: RunResult


@dataclass
class Stability:
    """The stage's outcome and what the memory items read from it."""

    stages: list[StageResult] = field(default_factory=list)
    kv_peak: float | None = None
    preemptions: float | None = None
    fault_note: str | None = None  # why the fault test did not run
    skipped: list[str] = field(default_factory=list)  # stages that would test nothing, why

    @property
    def runs(self) -> list[str]:
        return [s.run.id for s in self.stages]


def _with_lengths(spec: WorkloadSpec, **dists: dict[str, Any]) -> WorkloadSpec:
    data = spec.model_dump()
    data["mix"] = [{**m, **dists} for m in data["mix"]]
    return WorkloadSpec.model_validate(data)


def long_short(spec: WorkloadSpec, long_input: int) -> WorkloadSpec:
    """The workload plus a long-prompt class (weight LONG_WEIGHT of all requests)."""
    data = spec.model_dump()
    total = sum(m["weight"] for m in data["mix"])
    long_ = {
        **data["mix"][0],
        "name": "long",
        "weight": total * LONG_WEIGHT / (1 - LONG_WEIGHT),
        "input_tokens": {"dist": "fixed", "value": long_input},
        "dataset": None,
        "prefix": None,
    }
    data["mix"] = [*data["mix"], long_]
    return WorkloadSpec.model_validate(data)


def p99_output(sample: list[Request]) -> int:
    return int(np.percentile([r.output_tokens or 0 for r in sample], 99))


def stage_lengths(sample: list[Request], limit: int | None, cap: int | None) -> tuple[int, int]:
    """(long prompt, very long output) in tokens: 8x the real P99 each, inside the context
    limit and the output cap when there are ones."""
    p99_in = int(np.percentile([r.prompt_tokens for r in sample], 99))
    p99_out = p99_output(sample)
    long_in, long_out = 8 * p99_in, 8 * max(p99_out, 1)
    if cap:
        long_out = min(long_out, cap)
    if limit:
        long_in = min(long_in, max(1, int(0.75 * limit) - p99_out))
        long_out = min(long_out, max(1, limit - p99_in - 16))
    return long_in, long_out


def _judge(name: str, load: Load, spec: WorkloadSpec, res: RunResult) -> StageResult:
    m = res.metrics
    missed = [
        f"{c.metric} {c.stat} {c.value:.4g} > {c.target:g}"
        for c in m.slo_checks
        if not c.ok and c.value is not None
    ]
    if (res.slo is None or res.slo.error_rate is None) and m.error_rate > ERROR_RATE:
        missed.append(f"errors {m.error_rate:.1%} > {ERROR_RATE:.0%}")
    slope = None
    if spec.arrival.open_loop:
        st = judge(res, spec, SteadyRule(warmup_s=0.0, window_s=1.0))
        slope = st.queue_slope if st is not None else None
        if slope is not None and slope > 0.05:  # measure.steady's real-engine bound
            missed.append(f"queue grows: TTFT {slope:+.3f} s/s")
    p99 = m.ttft_ms.p99
    line = (
        f"{name} at {load.text()}: {m.completed} ok, {m.failed} failed"
        + (f", {m.cancelled} cancelled" if getattr(m, "cancelled", 0) else "")
        + (f", P99 TTFT {p99:.0f} ms" if p99 is not None else "")
        + (f", P95 TPOT {m.tpot_ms.p95:.1f} ms" if m.tpot_ms.p95 is not None else "")
        + (f"; misses {'; '.join(missed)}" if missed else "; meets the SLO")
    )
    ok = not missed and bool(m.slo_pass) and m.completed > 0
    return StageResult(name, load, ok, line, res)


def run_stage(
    p: Prober,
    spec: WorkloadSpec,
    tuned: Load,
    sample: list[Request],
    limit: int | None,
    cap: int | None,
    sizes: Sizes,
    fault: Fault | None = None,
) -> Stability:
    """Every stage in turn (each stored as it is measured); the fault test last, since
    it leaves one replica down."""
    out = Stability()
    n = sizes.stage_requests
    base = tuned.scaled(BASE)
    long_in, long_out = stage_lengths(sample, limit, cap)
    plan: list[tuple[str, Load, WorkloadSpec, dict[str, Any]]] = [
        ("steady", base, base.apply(spec, n), {}),
        ("peak", tuned, tuned.apply(spec, n), {}),
        ("burst", base, base.apply(spec, n, kind="gamma", burstiness=BURSTINESS), {}),
        ("long-short-mix", base, base.apply(long_short(spec, long_in), n), {}),
        (
            "long-outputs",
            base,
            base.apply(
                _with_lengths(spec, output_tokens={"dist": "fixed", "value": long_out}),
                max(4, n // 4),
            ),
            {},
        ),
        (
            "disconnect-storm",
            base,
            base.apply(spec, n),
            {"cancel_fraction": CANCEL_FRACTION, "cancel_after_chunks": sizes.cancel_after_chunks},
        ),
    ]
    if base.kind == "concurrency" and base.value == tuned.value:
        plan = [s for s in plan if s[0] != "steady"]  # one user: steady and peak coincide
    if long_out <= p99_output(sample):  # the cap (or the context) is the real P99 already
        plan = [s for s in plan if s[0] != "long-outputs"]
        out.skipped.append(
            f"long-outputs not run: outputs are capped at {long_out} tokens (the output cap "
            f"or the context limit), no longer than the workload's P99 output "
            f"({p99_output(sample)}): the cap is what bounds them"
        )
    for name, load, pt, opts in plan:
        if name == "burst" and load.kind == "concurrency":  # a closed loop has no arrivals
            rate = _achieved(out.stages, base, tuned)
            if rate is None:
                out.skipped.append(f"burst not run: no rate was achieved at {base.text()}")
                continue
            load = Load("rate", rate)
            pt = load.apply(spec, n, kind="gamma", burstiness=BURSTINESS)
        res = p.measure(f"stage-{name}", pt, **opts)
        out.stages.append(_judge(name, load, pt, res))
        if res.server is not None:
            peak = res.server.peak("kv_cache_usage")
            if peak is not None:
                out.kv_peak = max(out.kv_peak or 0.0, peak)
            pre = res.server.deltas.get("preemptions_total")
            if pre is not None:
                out.preemptions = (out.preemptions or 0.0) + pre
    if fault is not None:
        out.stages.append(
            fault_stage(p, base.apply(spec, fault_requests(base, fault, n)), base, fault)
        )
    return out


def _achieved(done: list[StageResult], base: Load, tuned: Load) -> float | None:
    """The burst stage's mean rate under a load in users: what the steady stage achieved
    at the base users (else the peak's, scaled to them). The stage had run the users as a
    closed loop, which sends no burst, and passed as "burst"."""
    by_name = {s.name: s for s in done}
    if "steady" in by_name:
        rate = by_name["steady"].run.metrics.req_s
    elif "peak" in by_name:
        rate = by_name["peak"].run.metrics.req_s * base.value / tuned.value
    else:
        return None
    return rate if rate > 0 else None


def fault_requests(load: Load, fault: Fault, n: int) -> int:
    """The fault stage's request count: at a rate, enough that half the stage's `n` are
    still to be sent once the grace after the kill is over, wherever the kill falls. A
    stage sized by `n` alone can end, or be caught up in one burst by a client that was
    starved of CPU, before the grace does: then no request tests the failover."""
    if load.kind != "rate":
        return n
    return math.ceil(load.value * (fault.after_s + fault.grace_s)) + math.ceil(n / 2)


def _causes(records: list[RequestRecord]) -> str:
    """`3 http_502, 1 connect_error`: why requests failed, most common first."""
    n = Counter(r.error or (f"http_{r.http_status}" if r.http_status else str(r.status))
                for r in records)  # fmt: skip
    return ", ".join(f"{k} x{v}" for k, v in n.most_common())


# How long the fault test waits, after a `kill PID` command returns, for the process to
# be gone: a signal is only queued, and a replica starved of CPU (or shutting down on
# SIGTERM) keeps serving until it has run its exit.
GONE_WAIT_S = 10.0


@dataclass(frozen=True)
class Fault:
    """The fault test: `command` stops one replica `after_s` into a stage at the base
    load. Requests sent from `grace_s` after the replica is gone must all succeed: the
    front has moved the traffic to the replicas left (what is in flight on the lost one
    may fail). Gone: the command has returned (`docker stop` returns once the container
    has stopped) and, for a plain `kill [-SIG] PID...`, the processes have exited."""

    command: str
    after_s: float
    grace_s: float = 2.0


def killed_pids(command: str) -> list[int]:
    """The processes a plain `kill [-SIG | -s SIG] PID...` stops; [] for any other command
    (a shell pipeline, a job spec, a process group)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return []
    if not words or os.path.basename(words[0]) != "kill":
        return []
    pids: list[int] = []
    rest = iter(words[1:])
    for w in rest:
        if w in ("-s", "-n", "--signal"):
            next(rest, None)  # the signal's name
        elif w.isdigit():
            pids.append(int(w))
        elif not (w.startswith("-") and not pids):  # a signal, before the pids, is fine
            return []  # `kill 12; ...`, `kill %1`, `kill 12 -13`: not what this can follow
    return pids


def _gone(pid: int) -> bool:
    import psutil

    try:  # a zombie (a killed child not yet reaped) has exited: its sockets are closed
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:  # no such process; or not ours to watch: the command's return
        return True  # is all there is to go by


def wait_gone(pids: list[int], timeout_s: float = GONE_WAIT_S) -> list[int]:
    """Waits (bounded) for the processes to exit; returns those still running."""
    deadline = time.monotonic() + timeout_s
    left = [p for p in pids if not _gone(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = [p for p in left if not _gone(p)]
    return left


def fault_stage(p: Prober, pt: WorkloadSpec, load: Load, fault: Fault) -> StageResult:
    """One stage with a replica stopped `fault.after_s` in. The grace is counted from when
    the replica is gone, not from when the command was started: a stamp taken before the
    kill (a shell starved of CPU took seconds to run `kill`) once judged requests that
    died in flight on the victim as sent after the grace, and blamed the front."""
    killed: dict[str, Any] = {}
    pids = killed_pids(fault.command)

    def kill() -> None:
        killed["start_ns"] = time.monotonic_ns()
        killed["rc"] = subprocess.run(fault.command, shell=True, check=False).returncode
        killed["left"] = wait_gone(pids) if killed["rc"] == 0 else []
        killed["ns"] = time.monotonic_ns()  # the replica is gone: the grace starts

    requests = p.requests(pt)  # before the clock: the kill times the load, not the set-up
    timer = threading.Timer(fault.after_s, kill)
    timer.start()
    try:
        res = p.measure("stage-fault", pt, requests)
    finally:
        timer.cancel()
        timer.join(timeout=GONE_WAIT_S + 5)  # a kill under way: its outcome, not a guess
    if "start_ns" not in killed:
        return StageResult("fault", load, False, "fault: the stage ended before the kill", res)
    if "ns" not in killed:
        line = f"fault: the stage ended before `{fault.command}` returned"
        return StageResult("fault", load, False, line, res)
    gone_s = (killed["ns"] - res.anchor_ns) / 1e9
    after = killed["ns"] - res.anchor_ns + int(fault.grace_s * 1e9)
    late = [r for r in res.records if r.send_ns >= after]
    bad = [r for r in late if r.status != RequestStatus.OK]
    left = killed["left"]
    line = (
        f"fault at {load.text()}: `{fault.command}` (exit {killed['rc']}) at {fault.after_s:.1f} s"
        + (
            f", pid {', '.join(map(str, left))} still running {GONE_WAIT_S:g} s after;"
            if left
            else f", the replica gone at {gone_s:.1f} s;"
        )
        + f" {len(late) - len(bad)}/{len(late)} requests sent {fault.grace_s:g} s after it served"
        + (f" ({_causes(bad)})" if bad else "")
    )
    ok = bool(late) and not bad and killed["rc"] == 0 and not left
    return StageResult("fault", load, ok, line, res)


def verdict(st: Stability, tuned: Load, source: str) -> Finding:
    ev = [f"tuned load {tuned.text()} ({source}); stages at {BASE:g}x unless named peak"]
    ev += [("ok: " if s.ok else "FAIL: ") + s.line for s in st.stages]
    if st.fault_note:
        ev.append(st.fault_note)
    ev += st.skipped
    bad = [s.name for s in st.stages if not s.ok]
    f = (
        failed(
            f"stages {', '.join(bad)} miss the SLO at the tuned load: lower the load per "
            "replica or change the config, then re-run",
            *ev,
        )
        if bad
        else passed(*ev)
    )
    f.runs = st.runs
    return f


def unsized(kind: str | None, load: float | None, capacity: Capacity) -> Finding | None:
    """The item, unchecked, when no load sizes the stages: none was tuned or given and the
    capacity probe served nothing (a deployment refusing every request with 429). The
    stages would otherwise run at a token 0.1 req/s: hours for what proves nothing."""
    if (kind and load) or (math.isfinite(capacity.req_s) and capacity.req_s > 0):
        return None
    return unchecked(
        "make the deployment serve the capacity probe's requests, or give --load rate=R "
        "(the load it is sized for)",
        f"the capacity probe ({capacity.users} users, run {capacity.run_id}) served "
        f"{capacity.req_s:g} req/s: no load to size the stages by, none run",
        capacity_req_s=capacity.req_s,
    ).with_run(capacity.run_id)


def tuned_load(kind: str | None, load: float | None, capacity_req_s: float) -> tuple[Load, str]:
    """The load the stages run at: the tuned one, else 0.8x the measured saturated rate."""
    if kind and load:
        return Load("concurrency" if kind == "concurrency" else "rate", load), "tuned"
    rate = 0.8 * capacity_req_s
    if not math.isfinite(rate) or rate <= 0:
        rate = 0.1
    return Load("rate", rate), "0.8x the measured capacity: no tuned load given"
