"""`servetune accept`: the whole go-live checklist against one deployment, in order.

Static items first (nothing sent), then the live probes, warm-up first (it must see the
deployment before anything else warms it), the stability stage last (it is the longest).
After every item the checklist is saved (the JSON file and the store's study meta), so a
probe that fails or a Ctrl-C leaves the partial checklist and every stored run behind.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from servetune.accept import probes, stability, static
from servetune.accept.checklist import Checklist, Finding, Status
from servetune.accept.inputs import Deployment
from servetune.accept.measuring import Prober, Sizes, workload_sample
from servetune.outfile import replaced
from servetune.store import RunInfo, Store
from servetune.workload.tokenizer import Tokenizer

Say = Callable[[str], None]
T = TypeVar("T")
ACCEPT_KIND = "accept"


class ProbeFailed(Exception):
    """A probe broke off (the server went away, a bug, Ctrl-C): the partial checklist is
    saved and carried here."""

    def __init__(self, item: str, reason: str, checklist: Checklist) -> None:
        super().__init__(f"{item}: {reason}")
        self.item, self.reason, self.checklist = item, reason, checklist


@dataclass
class AcceptSettings:
    db: str | None = None
    study: str | None = None  # the accept study its runs go into (default accept-<utc>)
    output: Path | None = None  # the checklist JSON, rewritten after every item
    sizes: Sizes = field(default_factory=Sizes)
    on_gpu: bool = False
    software: dict[str, Any] = field(default_factory=dict)  # versions found (engine, host)


class Acceptance:
    def __init__(
        self, dep: Deployment, s: AcceptSettings, say: Say, tokenizer: Tokenizer | None = None
    ) -> None:
        self.dep, self.s, self.say = dep, s, say
        self.study = s.study or f"accept-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}"
        self.checklist = Checklist({**dep.describe(), "study": self.study, "from_study": dep.study})
        self.prober = Prober(dep, db=s.db, study=self.study, say=say, tokenizer=tokenizer)

    # -- saving -------------------------------------------------------------------------
    def save(self) -> None:
        data = self.checklist.to_json()
        if self.s.output is not None:
            with replaced(self.s.output) as tmp:
                tmp.write_text(json.dumps(data, indent=2, default=str))
        try:
            with Store.open(self.s.db) as store:
                store.update_study_meta(self.study, {"checklist": data}, ACCEPT_KIND)
        except Exception as exc:  # noqa: BLE001 - the JSON file still holds it
            self.checklist.notes.append(f"checklist not stored: {exc}")

    def guard(self, step: str, work: Callable[[], T]) -> T:
        """Run one step of the run (an item's check, or a measurement several items
        share); one that raises (the server went away, a bug, Ctrl-C) saves what is done
        and stops the run with ProbeFailed naming the step."""
        try:
            return work()
        except BaseException as exc:
            reason = (
                "interrupted"
                if isinstance(exc, KeyboardInterrupt)
                else (" ".join(str(exc).split())[:300] or type(exc).__name__)
            )
            self.checklist.notes.append(f"{step} broke off: {reason}")
            self.save()
            raise ProbeFailed(step, reason, self.checklist) from exc

    def item(self, item_id: str, check: Callable[[], Finding]) -> Finding | None:
        """Run one check, record it and save; a check that raises saves what is done and
        stops the run (ProbeFailed)."""
        self.say(f"[{item_id}]")
        t0 = time.monotonic()
        f = self.guard(item_id, check)
        it = self.checklist.record(item_id, f)
        lines = it.evidence[:2] or [it.fix or ""]
        self.say(f"  -> {it.status} ({time.monotonic() - t0:.1f} s): {'; '.join(lines)}"[:300])
        self.save()
        return f

    # -- the run ------------------------------------------------------------------------
    def stored_runs(self) -> list[RunInfo]:
        """What the store knew before this acceptance: the study's runs, else every run of
        this engine (the evidence of the static items)."""
        with Store.open(self.s.db) as store:
            if self.dep.study:
                return store.list_runs(study=self.dep.study)
            return store.list_runs(engine=self.dep.engine)

    def run(self) -> Checklist:
        dep, sz, cfg = self.dep, self.s.sizes, self.dep.config
        before = self.stored_runs()
        self.save()
        # static: nothing sent
        self.item("model-pinned", lambda: static.model_pinned(dep.model_path, dep.served_model))
        self.item(
            "stack-pinned",
            lambda: static.stack_pinned(
                self.s.software, self.s.on_gpu, cfg.world_size if cfg else 1
            ),
        )
        self.item("quality-regression", lambda: static.quality(before))
        self.item("max-num-seqs-tested", lambda: static.knob_tested("max_num_seqs", cfg, before))
        self.item(
            "max-num-batched-tokens-tested",
            lambda: static.knob_tested("max_num_batched_tokens", cfg, before, need_latency=True),
        )
        self.item("autoscaling-signals", lambda: static.autoscaling_signals(dep.autoscaling))
        self.item("oom-step-back", lambda: static.oom_step_back(cfg, dep.study_summary))
        self.item("config-change-linked", lambda: static.config_linked(cfg, before))
        self.item(
            "hardware-monitored", lambda: probes.hardware_monitoring(dep.dcgm_url, self.s.on_gpu)
        )
        # live
        p, spec = self.prober, dep.workload
        self.item("warmup-before-traffic", lambda: probes.warm_up(p, spec, sz))
        # measurements several items share: under the same guard as an item
        mon = self.guard("monitoring", lambda: probes.monitoring(p))
        self.item("latency-monitored", lambda: mon[0])
        self.item("prefix-cache-monitored", lambda: mon[1])
        sample = self.guard("workload-sample", lambda: workload_sample(p, spec))
        self.item("long-short-pools", lambda: static.long_short_pools(sample, dep.pools))
        limit = self.context_limit()
        out_cap = self.item("output-cap", lambda: probes.output_cap(p, spec, dep.max_new_tokens))
        # the stages trust the cap only where the server was seen to hold it
        cap = dep.max_new_tokens if out_cap and out_cap.status == Status.PASS else None
        self.item("input-limit", lambda: probes.input_limit(p, spec, sample, limit))
        users = self.capacity_users()
        capacity = self.guard("capacity", lambda: probes.capacity(p, spec, users, sz))
        self.checklist.context["capacity"] = {
            "req_s": capacity.req_s,
            "users": users,
            "run": capacity.run_id,
        }
        self.item("queue-bound", lambda: probes.queue_bound(p, spec, capacity, sz))
        self.item("cancel-frees-work", lambda: probes.cancellation(p, spec, users, sz))
        self.item("per-user-limits", lambda: probes.per_user(p, spec, capacity, sz))
        tuned, source = stability.tuned_load(dep.load_kind, dep.load, capacity.req_s)
        st = stability.Stability()

        fault, note = self.fault(tuned)

        def stage() -> Finding:
            nonlocal st
            if unsized := stability.unsized(dep.load_kind, dep.load, capacity):
                return unsized
            st = stability.run_stage(p, spec, tuned, sample, limit, cap, sz, fault)
            st.fault_note = note
            return stability.verdict(st, tuned, source)

        self.item("stability-stage", stage)
        mix = next((s for s in st.stages if s.name == "long-short-mix"), None)
        long_in = stability.stage_lengths(sample, limit, cap)[0]
        self.item(
            "chunked-prefill-long-prompts",
            lambda: static.chunked_prefill(
                cfg, dep.engine, mix.line if mix else None, mix.ok if mix else None, long_in
            ),
        )
        self.item(
            "memory-headroom",
            lambda: static.memory_headroom(cfg, st.kv_peak, dep.slo.kv_cache_usage_max),
        )
        self.item("kv-capacity", lambda: static.kv_capacity(dep.engine, st.kv_peak, st.preemptions))
        peak_running = max(
            (
                s.run.server.peak("requests_running") or 0.0
                for s in st.stages
                if s.run.server is not None
            ),
            default=None,
        )
        self.item("cuda-graph-shapes", lambda: static.cuda_graphs(cfg, self.s.on_gpu, peak_running))
        for it in self.checklist.items.values():
            if it.status == Status.PENDING:  # pragma: no cover - every item is checked above
                self.checklist.notes.append(f"{it.spec.id} was not checked")
        self.save()
        return self.checklist

    def fault(self, tuned: stability.Load) -> tuple[stability.Fault | None, str | None]:
        """The fault test, when more than one replica is given and a command to stop one;
        it strikes halfway through the stage's arrivals."""
        n_urls, cmd = len(self.dep.urls), self.dep.fault_cmd
        if n_urls < 2:
            return None, "fault test: n/a (one replica given)"
        if not cmd:
            return None, (
                f"fault test: not run ({n_urls} replicas given, no --fault-cmd to stop one)"
            )
        n = self.s.sizes.stage_requests * stability.BASE
        after = n / 2 / tuned.value if tuned.kind == "rate" else 3.0
        return stability.Fault(cmd, after), None

    def context_limit(self) -> int | None:
        """The context limit: the config's max_model_len, else what the server reports."""
        if self.dep.config is not None and self.dep.config.max_model_len:
            return self.dep.config.max_model_len
        return self.checklist.context.get("server_max_model_len")

    def capacity_users(self) -> int:
        """Users that saturate the deployment: the tuned concurrency, else the engine's
        batch (max_num_seqs / slots), else 4."""
        dep, cfg = self.dep, self.dep.config
        if dep.load_kind == "concurrency" and dep.load:
            return max(1, int(dep.load))
        if cfg is not None:
            n = cfg.parallel_slots if cfg.engine == "llamacpp" else cfg.max_num_seqs
            if n:
                return int(n)
        return 4
