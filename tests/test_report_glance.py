"""What makes the report (and the CLI tables) read at a glance, without a browser:
percentiles with their sample sizes, configs named by what differs, the memory picture by
each engine's own rule (vLLM: `servetune plan` itself; llama.cpp: -c over its slots),
no panel an engine has no data for, warm-up left out of the curves."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from servetune.engines.config import EngineConfig
from servetune.metrics.compute import compute_metrics
from servetune.metrics.pct import dist_text, is_max_only, min_samples, pct_cell, pct_text
from servetune.model import get_model
from servetune.plan.kv import kv_bytes_per_token
from servetune.report.charts import cdfs, server_metrics
from servetune.report.data import load_report_data
from servetune.report.memory import picture
from servetune.report.verdict import verdict
from servetune.store import Store
from synthetic_runs import synthetic_run, synthetic_sweep


def test_percentile_sample_rule() -> None:
    # n (1 - q) >= 1: P90 from 10 requests, P95 from 20, P99 from 100
    assert [min_samples(s) for s in ("p90", "p95", "p99")] == [10, 20, 100]
    assert is_max_only("p95", 16) and not is_max_only("p95", 20)
    assert is_max_only("p99", 99) and not is_max_only("p99", 100)
    assert not is_max_only("p50", 16) and not is_max_only("p99", None)
    assert pct_text("p95", 812.4, 16) == "P95 812 ms (n=16, ~max)"
    assert pct_text("p50", 12.34, 1_200) == "P50 12.3 ms (n=1,200)"
    d = {"count": 40, "p50": 10.0, "p95": 20.0, "p99": 31.0}
    assert dist_text(d) == "10 / 20 / 31 (n=40; P99 ~max)"
    assert dist_text({"p50": 1.0, "p95": 2.0, "p99": 3.0}, n=500) == "1 / 2 / 3 (n=500)"
    assert pct_cell("p99", 31.04, 40, ".1f") == "31.0 ~max" and pct_cell("p99", None, 4) == "-"


def _store(tmp_path: Path) -> Store:
    return Store.open(str(tmp_path / "r.db"))


def test_configs_are_named_by_the_knobs_that_differ(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        for cfg in (EngineConfig(), EngineConfig(max_num_seqs=32)):
            for r, m in synthetic_sweep((1, 2), config=cfg):
                r.id = m.id = f"{r.id}-{cfg.max_num_seqs}"
                store.save_result(r, m, study="s")
        data = load_report_data(store, ["s"])
    assert sorted(data.series) == ["max_num_seqs=32", "max_num_seqs=default"]
    assert data.knobs == ["max_num_seqs"]
    ctx = data.context["max_num_seqs=32"]
    assert ctx["engine"] == "vllm" and ctx["backend"] == "real" and ctx["model"] == "llama-3.1-8b"
    assert data.baseline == next(iter(data.series))  # not a tune study: the first config


def _plan_json(*args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "servetune.cli.app", "plan", *args, "--scenario", "none", "--json"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    return json.loads(out)


def test_vllm_memory_is_the_plan_commands(tmp_path: Path) -> None:
    cfg = EngineConfig(max_num_seqs=48, gpu_memory_utilization=0.85, max_model_len=8192)
    with _store(tmp_path) as store:
        r, m = synthetic_run(4, config=cfg)
        store.save_result(r, m)
        info = store.get(r.id)
    pic = picture(info, "c")
    plan = _plan_json("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--max-num-seqs", "48",
                      "--gpu-memory-utilization", "0.85", "--max-model-len", "8192")  # fmt: skip
    assert pic.parts["KV cache pool"] == plan["kv_pool_bytes"]
    assert pic.parts["weights"] == plan["weights_per_gpu_bytes"]
    assert pic.kv_tokens == plan["kv_capacity_tokens"] and pic.device_bytes == plan["device_bytes"]
    assert pic.max_concurrency == plan["max_concurrency"]


LLAMA = dict(engine="llamacpp", quantization="q4_k_m")


@pytest.mark.parametrize(
    ("knobs", "launch", "tokens", "slots", "split"),
    [
        (dict(parallel_slots=4, kv_cache_tokens=4096), None, 4096, 4, "1,024 tokens each"),
        (dict(parallel_slots=2, max_model_len=1024), None, 2048, 2, "1,024 tokens each"),
        ({}, None, 32768, 4, "shared by"),  # no -c: the model's context; -np auto: 4, shared
        ({}, "llama-server -m g.gguf -c 8192 -np 2 --kv-unified", 8192, 2, "shared by"),
    ],
)
def test_llamacpp_memory_is_c_tokens_over_its_slots(
    tmp_path: Path, knobs: dict, launch: str | None, tokens: int, slots: int, split: str
) -> None:
    cfg = EngineConfig(**LLAMA, **knobs)
    with _store(tmp_path) as store:
        r, m = synthetic_run(2, config=cfg, model="gemma-3-270m", gpu="cpu-host")
        m.launch_command = launch
        store.save_result(r, m)
        info = store.get(r.id)
    pic = picture(info, "c")
    per_token = kv_bytes_per_token(get_model("gemma-3-270m"), 2)  # f16 K and V
    assert pic.kv_tokens == tokens and pic.max_concurrency == slots
    assert pic.parts["KV cache pool"] == tokens * per_token
    assert split in pic.detail and "activation" not in pic.parts
    assert pic.parts["KV cache pool"] < 0.01 * (pic.device_bytes or 0)  # not a share of memory


def test_memory_notes_say_each_reason_once(tmp_path: Path) -> None:
    from servetune.report.memory import memory

    with _store(tmp_path) as store:
        for c in (1, 2, 4):
            r, m = synthetic_run(c, config=EngineConfig(max_num_seqs=c))
            m.model = r.target.model = None
            store.save_result(r, m)
        data = load_report_data(store, [i.id for i in store.list_runs()])
    chart = memory(data)
    assert chart.fig is None and "3 config(s)" in chart.note
    assert chart.note.count("not recorded") == 1  # said once, not once per run


def test_a_panel_the_engine_has_no_data_for_is_left_out(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        r, m = synthetic_run(4, config=EngineConfig(**LLAMA, parallel_slots=4))
        assert r.server is not None
        for v in r.server.values:  # llama.cpp exports no KV-cache usage
            v.pop("kv_cache_usage")
        store.save_result(r, m)
        chart = server_metrics(load_report_data(store, [r.id]))
    assert chart.fig is not None
    titles = [a.text for a in chart.fig.layout.annotations]
    assert titles == ["requests", "preemptions (cumulative)"]
    assert "Not drawn: KV cache usage (llamacpp exports none)" in chart.note


def test_curves_leave_the_warm_up_out(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        r, m = synthetic_run(4, n_requests=120)
        first = min(x.send_ns for x in r.records)
        warm = (sorted(x.send_ns for x in r.records)[30] - first) / 1e9
        r.metrics = compute_metrics(r.records, warmup_s=warm, slo=r.slo)
        store.save_result(r, m)
        data = load_report_data(store, [r.id])
    kept = data.runs[0].measured_records()
    assert 60 < len(kept) < 100 and min(x.send_ns for x in kept) >= first + warm * 1e9 - 1
    fig = cdfs(data).fig
    ok = sum(1 for x in kept if x.status == "ok")
    assert max(fig.data[0].y) == 1.0 and len(fig.data[0].x) == ok  # TTFT ECDF over them


def test_a_sweep_report_says_the_highest_load_within_the_slo(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        for r, m in synthetic_sweep((1, 4, 16, 64), seed=3):
            store.save_result(r, m, study="sweep")
        data = load_report_data(store, ["sweep"])
    v = verdict(data)
    passing = [r for r in data.runs if r.result.metrics.slo_pass]
    best = max(passing, key=lambda r: r.info.concurrency or 0)
    assert v.rows[0][1].startswith(f"{best.info.load_label()} within the SLO")
    assert "(n=" in v.rows[0][1]


def _hybrid_study(store: Store) -> dict:
    """Three configs measured on the real engine at 1..8 users, stored as `tune` stores
    them, and the summary of a hybrid study that re-ran the winner 3 times."""
    from servetune.measure.result import PointResult
    from servetune.results.schema import TuneTag
    from servetune.tune.trial import TrialResult

    trials = []
    for key, seqs, cap in (("base", None, 2), ("a", 8, 4), ("b", 4, 2)):
        cfg = EngineConfig(max_num_seqs=seqs)
        points = []
        for c in (1, 2, 4, 8):
            r, m = synthetic_run(c, config=cfg, n_requests=16)
            r.id = m.id = f"{key}-c{c}"
            tag = TuneTag(
                pid=f"{key}/probe/{c}", key=key, phase="probe", load_kind="concurrency", load=c
            )
            r.target.tune = tag
            store.save_result(r, m, study="hy")
            p = PointResult.from_metrics(r.metrics, "concurrency", float(c), run_id=r.id)
            p.passed = c <= cap
            if c > cap:  # the SLO that broke just above the capacity
                p.checks = [{"metric": "ttft_ms", "stat": "p95", "target": 800.0,
                             "value": 1200.0, "ok": False}]  # fmt: skip
            points.append(p)
        t = TrialResult(key=key, config=cfg.model_dump(mode="json", exclude_defaults=True),
                        label=key, backend="real", status="ok", points=points,
                        capacity=float(cap), first_fail=float(2 * cap), score=cap * 0.5,
                        best=points[cap.bit_length() - 1],
                        launch_command=f"vllm serve m --max-num-seqs {seqs or 256}")  # fmt: skip
        trials.append(t)
    base, a, b = trials
    a.ci = {"n": 3, "mean": 2.1, "low": 1.9, "high": 2.3, "metric": "goodput", "passed": 3}
    summary = {
        "study": "hy", "mode": "hybrid", "objective": "goodput", "slo_met": True,
        "slo": {"ttft_ms": {"p95": 800.0}},
        "winner": a.to_json(), "baseline": base.to_json(),
        "ranked": [t.to_json() for t in (a, base, b)],
        "sim_vs_real": [{"label": "a", "sim_score": 2.4, "real_score": 2.0, "score_error": 0.2,
                         "req_s_error": 0.1},
                        {"label": "base", "sim_score": 0.9, "real_score": 1.0,
                         "score_error": -0.1, "req_s_error": -0.05}],
    }  # fmt: skip
    store.update_study_meta("hy", {"summary": summary}, "tune")
    return summary


def test_a_tune_report_opens_with_the_verdict_and_the_tuning_charts(tmp_path: Path) -> None:
    from servetune.report.tuning import binding, capacity, sim_vs_measured

    with _store(tmp_path) as store:
        _hybrid_study(store)
        data = load_report_data(store, ["hy"])
    assert data.is_tune and data.knobs == ["max_num_seqs"]
    assert data.baseline == "max_num_seqs=default"
    v = verdict(data)
    rows = dict(v.rows)
    assert v.headline == "Winner: max_num_seqs=8"
    assert rows["vs baseline"].startswith(
        "100% more goodput per GPU in the search (2 req/s/GPU vs 1 req/s/GPU"
    )
    assert rows["how sure"] == "3 repetitions: 2.1 req/s/GPU (95% CI 1.9 .. 2.3), 3/3 met the SLO"
    assert rows["sim vs real"].startswith("simulator +10% on req/s per GPU")
    assert v.command == "vllm serve m --max-num-seqs 8"
    assert "host" not in rows  # an idle host's study: no host check to tell
    bars = capacity(data).fig.data[0]  # winner first, its interval as whiskers
    assert list(bars.y) == ["max_num_seqs=8", "max_num_seqs=default", "max_num_seqs=4"]
    assert list(bars.error_x.array)[0] == pytest.approx(0.2)
    assert bars.marker.color[0] != bars.marker.color[2] != bars.marker.color[1]
    sim = sim_vs_measured(data).fig.data
    assert [t.name for t in sim] == ["simulator", "measured"]
    assert list(sim[0].y) == ["max_num_seqs=8", "max_num_seqs=default"]
    bind = binding(data).fig.data[0]
    assert all("P95 TTFT 1,200 ms > 800 (n=" in t for t in bind.text)
    assert list(bind.x) == [1.5, 1.5, 1.5]


def test_a_busy_hosts_study_says_what_its_host_check_found(tmp_path: Path) -> None:
    from servetune.tune.hostfit import HostCheck

    check = HostCheck(cores=2, others=1.0, threads=1, base_req_s=0.099, fit_req_s=1.53)
    with _store(tmp_path) as store:
        summary = _hybrid_study(store)
        store.update_study_meta("hy", {"summary": {**summary, "host_check": check.to_json()}})
        data = load_report_data(store, ["hy"])
    rows = dict(verdict(data).rows)
    assert rows["host"].startswith("host check: other processes held 1.0 of 2 cores")
    assert "the baseline 0.099 req/s, threads=1 (the cores left free) 1.53 req/s" in rows["host"]


def test_cli_tables_carry_the_sample_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`bench`'s summary and `runs list`: an n column, and a P99 of 40 requests flagged
    as the maximum while one of 400 is not."""
    from rich.console import Console

    from servetune.bench.progress import summary_table
    from servetune.cli.app import main

    small, _ = synthetic_run(2, n_requests=40)
    big, _ = synthetic_run(2, n_requests=400)
    con = Console(width=250, record=True)
    con.print(summary_table([small, big]))
    lines = [ln for ln in con.export_text().splitlines() if "conc 2" in ln]
    assert "~max" in lines[0] and "~max" not in lines[1]
    assert str(small.metrics.ttft_ms.count) in lines[0].split()
    # not streamed: no TTFT, and n is the E2E figures' (it read 0)
    e2e_only = small.model_copy(deep=True)
    e2e_only.metrics.ttft_ms = type(e2e_only.metrics.ttft_ms)()
    con = Console(width=250, record=True)
    con.print(summary_table([e2e_only]))
    row = next(ln for ln in con.export_text().splitlines() if "conc 2" in ln).split("│")
    assert row[5].strip() == str(small.metrics.e2e_ms.count) != "0"

    db = tmp_path / "r.db"
    with Store.open(str(db)) as store:
        for run in (small, big):
            run.id = f"run-{len(run.records)}"
            store.save_result(run, synthetic_run(2)[1].model_copy(update={"id": run.id}))
    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.setattr(sys, "argv", ["servetune", "runs", "list", "--db", str(db)])
    capsys.readouterr()
    main()
    rows = {ln.split()[1]: ln for ln in capsys.readouterr().out.splitlines() if "run-" in ln}
    assert "~max" in rows["run-40"] and "~max" not in rows["run-400"]
