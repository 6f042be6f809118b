"""The report's fixes from the bug hunt: `-o` never overwrites measured data, runs against
two servers are two configs, the §16 table aligns runs whose rows differ, a simulated twin
shares the real run's workload and GPU, the verdict ranks by each run's own load and each
config's own SLO, lower-bound capacities are said, tok/s is binned by chunk arrival, SLO
lines only when the runs share one, `--image-format` alone is refused, and a simulated
run's KV pool is its own."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cli_run import run_cli
from servetune.engines.config import EngineConfig
from servetune.measure.result import PointResult
from servetune.metrics.compute import compute_metrics
from servetune.report.charts import latency_vs_load, sim_vs_real
from servetune.report.data import ReportData, load_report_data
from servetune.report.html import render_html
from servetune.report.memory import picture
from servetune.report.telemetry_section import _client_series
from servetune.report.tuning import NOT_REACHED, binding, capacity
from servetune.report.verdict import verdict
from servetune.results.schema import Load, RequestRecord
from servetune.slo import SLO
from servetune.store import Store
from servetune.tune.trial import TrialResult, TrialStatus
from synthetic_runs import synthetic_run, synthetic_sweep


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SERVETUNE_DB", raising=False)


def _save(store: Store, runs: list, study: str, suffix: str = "", **edit: Any) -> None:
    """Store synthetic runs under `study`, ids made unique by `suffix`."""
    for r, m in runs:
        r.id = m.id = f"{r.id}{suffix}"
        for key, value in edit.items():
            setattr(r.target, key, value)
        store.save_result(r, m, study=study)


def _one_line_error(code: int, err: str, flag: str) -> None:
    assert code == 2, err
    assert err.strip().startswith(f"error: {flag}:") and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


# 1. -o never overwrites measured data -------------------------------------------------


def test_report_refuses_to_write_over_its_database_or_a_non_html_file(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with Store.open("s.db") as store:
        _save(store, synthetic_sweep((1, 2)), "s")
    code, _, err = run_cli(capsys, "report", "s", "--db", "s.db", "-o", "s.db")
    _one_line_error(code, err, "--output")
    assert "database" in err
    assert sqlite3.connect("s.db").execute("select count(*) from runs").fetchone()[0] == 2
    Path("notes.txt").write_text("measured by hand\n")
    code, _, err = run_cli(capsys, "report", "s", "--db", "s.db", "-o", "notes.txt")
    _one_line_error(code, err, "--output")
    assert Path("notes.txt").read_text() == "measured by hand\n"
    code, _, err = run_cli(capsys, "report", "s", "--db", "s.db", "-o", "r.md")
    _one_line_error(code, err, "--output")  # HTML had been written into r.md
    assert "the .md name says another format than HTML" in err and not Path("r.md").exists()
    Path("old.html").write_text("\n<!doctype HTML><html><p>an earlier report</p></html>")
    code, _, err = run_cli(capsys, "report", "s", "--db", "s.db", "-o", "old.html")
    assert code == 0, err
    assert "an earlier report" not in Path("old.html").read_text()


# 2. runs against two servers are two configs ------------------------------------------


def test_runs_against_two_servers_are_two_configs() -> None:
    with Store.open("s.db") as store:
        _save(store, synthetic_sweep((2, 8)), "benchc", "-a", url="http://127.0.0.1:8001")
        _save(store, synthetic_sweep((2, 8), t0_ms=60.0), "slowsrv", "-b", url="http://10.0.0.2:80")
        data = load_report_data(store, ["benchc", "slowsrv"])
    assert len(data.series) == 2
    assert {len(m) for m in data.series.values()} == {2}
    names = sorted(data.series)
    assert "8001" in names[0] + names[1] and "10.0.0.2" in names[0] + names[1]
    assert latency_vs_load(data).fig is not None
    assert {data.context[n]["server"] for n in names} == {
        "http://127.0.0.1:8001",
        "http://10.0.0.2:80",
    }


# 3. the §16 table aligns runs whose rows differ ---------------------------------------


def _record_rows(text: str) -> list[list[str]]:
    """The §16 table's rows, as [label, value per run]."""
    table = text[text.index('<section id="record">') :]
    rows = re.findall(r"<tr><th>(.*?)</th>((?:<td[^>]*>.*?</td>)+)</tr>", table)
    return [[label, *re.findall(r"<td[^>]*>(.*?)</td>", cells)] for label, cells in rows]


def test_the_record_table_aligns_runs_whose_rows_differ() -> None:
    with Store.open("s.db") as store:
        (a, am), (b, bm) = synthetic_run(4, backend="sim"), synthetic_run(8)
        bm.engine_config, bm.launch_command = {}, None  # a bench run: no config recorded
        store.save_result(a, am, study="s")
        store.save_result(b, bm, study="s")
        store.set_quality(a.id, {"mmlu": 0.61})
        store.set_quality(b.id, {"gsm8k": 0.82})
        data = load_report_data(store, ["s"])
    rows = {r[0]: r[1:] for r in _record_rows(render_html(data, []))}
    assert rows["mmlu"] == ["0.61", "-"]
    assert rows["gsm8k"] == ["-", "0.82"]
    assert rows["batching"][1] == "-" and "max_num_seqs=64" in rows["batching"][0]
    assert rows["-"][1] == "no engine config recorded"


# 4. a simulated twin shares the real run's workload and GPU ---------------------------


def test_a_simulation_of_another_workload_or_gpu_is_no_twin() -> None:
    with Store.open("s.db") as store:
        _save(store, synthetic_sweep((1, 2, 4)), "real")
        sims = synthetic_sweep((1, 2, 4), backend="sim", gpu="a100-sxm")
        for r, _ in sims:
            r.workload = {**r.workload, "name": "long-context"}
        _save(store, sims, "sim")
        data = load_report_data(store, ["real", "sim"])
    chart = sim_vs_real(data)
    assert chart.fig is None and "workload and GPU" in chart.note


def test_a_real_config_keeps_every_simulated_twin() -> None:
    with Store.open("s.db") as store:
        _save(store, synthetic_sweep((1, 2, 4)), "real")
        for version in ("0.6", "0.7"):  # two simulator profiles of one config
            sims = synthetic_sweep((1, 2, 4), backend="sim")
            for _, m in sims:
                m.software = {"engine_version": version}
            _save(store, sims, f"sim-{version}", f"-{version}")
        data = load_report_data(store, ["real", "sim-0.6", "sim-0.7"])
    chart = sim_vs_real(data)
    assert chart.fig is not None
    names = {t.name for t in chart.fig.data}
    sim_names = [n for n, m in data.series.items() if m[0].info.backend == "sim"]
    assert len(sim_names) == 2 and set(sim_names) <= names


# 5. the verdict ranks by each run's own load, and each config's own SLO ----------------


def _open_loop(rate: float, seed: int) -> tuple:
    r, m = synthetic_run(4, seed=seed)
    r.id = m.id = f"bench-open-{rate:g}"
    r.load = Load(kind="poisson", rate=rate)
    r.workload = {**r.workload, "arrival": {"kind": "poisson", "rate": rate}}
    return r, m


def _without_slo(runs: list) -> list:
    for r, _ in runs:
        r.slo = None
        r.metrics = compute_metrics(r.records)
    return runs


def test_the_verdict_ranks_by_each_runs_own_load() -> None:
    cfg = EngineConfig(max_num_seqs=32)
    with Store.open("s.db") as store:
        _save(store, [_open_loop(2.0, 1), _open_loop(4.0, 2)], "open")  # the axis: rate
        _save(store, synthetic_sweep((1, 2, 4), config=cfg, error_rate=0.0), "closed", "-32")
        no_slo = _without_slo(synthetic_sweep((1, 2), config=EngineConfig(max_num_seqs=8)))
        _save(store, no_slo, "x", "-8")
        data = load_report_data(store, ["open", "closed", "x"])
    assert data.x_kind == "rate"
    v = dict(verdict(data).rows)
    closed = next(n for n, m in data.series.items() if m[0].info.concurrency == 1)
    passing = [r for r in data.series[closed] if r.result.metrics.slo_pass]
    assert len(passing) >= 2
    best = max(passing, key=lambda r: r.info.concurrency or 0)
    assert v[closed].startswith(f"{best.info.load_label()} within the SLO"), v[closed]
    assert v["max_num_seqs=8"].startswith("best throughput at c="), v["max_num_seqs=8"]


# 6. a capacity search that never broke the SLO: a lower bound, said -------------------


def _trial(key: str, seqs: int, loads: list[float], fail: float | None) -> TrialResult:
    points = [PointResult("concurrency", x, True, ttft_p95_ms=100.0, completed=300) for x in loads]
    if fail is not None:
        p = PointResult("concurrency", fail, False, ttft_p95_ms=1200.0, completed=300)
        p.checks = [{"metric": "ttft_ms", "stat": "p95", "target": 800.0, "value": 1200.0}]
        points.append(p)
    return TrialResult(
        key=key, config={"max_num_seqs": seqs}, label=key, backend="sim",
        status=TrialStatus.OK, points=points, capacity=loads[-1], first_fail=fail,
        score=loads[-1] / 2, best=points[len(loads) - 1],
    )  # fmt: skip


def _tune_report(ranked: list[TrialResult]) -> ReportData:
    summary = {
        "study": "s", "mode": "sim", "objective": "goodput", "slo_met": True,
        "slo": {"ttft_ms": {"p95": 800.0}}, "winner": ranked[0].to_json(),
        "baseline": ranked[-1].to_json(), "ranked": [t.to_json() for t in ranked],
    }  # fmt: skip
    return ReportData("t", "w", [], "concurrency", knobs=["max_num_seqs"], tune=summary)


def test_a_capacity_never_broken_is_a_lower_bound() -> None:
    top = _trial("a", 64, [1, 2, 4, 8], None)  # the lattice's top passed
    base = _trial("b", 8, [1, 2], 4)
    data = _tune_report([top, base])
    bind = binding(data).fig
    assert [list(t.y) for t in bind.data] == [["max_num_seqs=8"], ["max_num_seqs=64"]]
    assert list(bind.data[1].text) == [NOT_REACHED]
    assert list(bind.layout.yaxis.categoryarray) == ["max_num_seqs=64", "max_num_seqs=8"]
    bars = capacity(data).fig.data[0]
    assert "capacity ≥8 users" in bars.text[0] and "≥" not in bars.text[1]
    assert "capacity ≥8 users" in bars.customdata[0]
    rows = dict(verdict(data).rows)
    assert rows["capacity"].startswith("at least 8 users within the SLO"), rows["capacity"]
    assert rows["vs baseline"].startswith("at least 300% more goodput"), rows["vs baseline"]
    rows = dict(verdict(_tune_report([base, top])).rows)  # the baseline's is the bound
    assert rows["vs baseline"].startswith("at most "), rows["vs baseline"]


def test_a_baseline_that_won_within_the_noise_says_so_in_the_verdict() -> None:
    """The report's verdict words a baseline's win as the CLI does (`explain.baseline_won`):
    repetitions that cannot tell it from the runner-up's at 95% carry the caveat."""
    base = _trial("b", 8, [1, 2, 4], 8)
    other = _trial("a", 64, [1, 2, 4], 8)
    base.ci = {"n": 3, "mean": 2.0, "low": 1.0, "high": 3.0, "passed": 3}
    other.ci = {"n": 3, "mean": 1.8, "low": 1.2, "high": 2.4, "passed": 3}
    data = _tune_report([base, other, base])  # the winner, the runner-up, the baseline
    said = dict(verdict(data).rows)["vs baseline"]
    assert said.startswith("the baseline itself won: no knob in the space beat it"), said
    assert said.endswith("though not by more than this host's noise over the runner-up"), said
    other.ci = {"n": 3, "mean": 0.5, "low": 0.4, "high": 0.6, "passed": 3}
    said = dict(verdict(_tune_report([base, other, base])).rows)["vs baseline"]
    assert "noise" not in said, said


# 7. output tok/s binned by chunk arrival, the last bin by its real width ----------------


def test_tokens_per_second_counts_each_chunk_when_it_arrived() -> None:
    chunks = [int((0.2 + 0.1 * k) * 1e9) for k in range(25)]  # 0.2 .. 2.6 s, one token each
    rec = RequestRecord(
        index=0, send_ns=0, chunk_ns=chunks, chunk_tokens=[1] * 25, end_ns=chunks[-1] + 200_000
    )
    run = SimpleNamespace(result=SimpleNamespace(records=[rec]))
    xs, ys = _client_series(run)["_tok_s"]  # type: ignore[arg-type]
    end = rec.end_ns / 1e9
    assert xs == pytest.approx([0.5, 1.5, (2 + end) / 2])
    assert ys == pytest.approx([8.0, 10.0, 7 / (end - 2)])


# 8. SLO lines only when the runs share one ---------------------------------------------


def test_slo_lines_only_when_the_runs_share_one() -> None:
    strict = SLO.model_validate({"ttft_ms": {"p95": 100}})
    with Store.open("s.db") as store:
        _save(store, synthetic_sweep((1, 2, 4)), "a")
        data = load_report_data(store, ["a"])
        assert len(latency_vs_load(data).fig.layout.shapes) > 0  # one SLO: drawn
        other = synthetic_sweep((1, 2, 4), config=EngineConfig(max_num_seqs=8))
        for r, _ in other:
            r.slo, r.metrics = strict, compute_metrics(r.records, slo=strict)
        _save(store, other, "b", "-b")
        data = load_report_data(store, ["a", "b"])
    chart = latency_vs_load(data)
    assert len(chart.fig.layout.shapes) == 0
    assert "No SLO lines: these runs were judged by 2 different SLOs." in chart.note


# 9. --image-format alone is refused ----------------------------------------------------


def test_image_format_without_images_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with Store.open("s.db") as store:
        _save(store, synthetic_sweep((1, 2)), "s")
    for fmt in ("jpg", "svg"):
        code, _, err = run_cli(capsys, "report", "s", "--db", "s.db", "--image-format", fmt)
        _one_line_error(code, err, "--image-format")
        assert "needs --images DIR" in err
    assert not Path("report.html").exists()


# 10. a simulated run's KV pool is its own ----------------------------------------------


def test_a_simulated_runs_kv_tokens_are_its_own_pool() -> None:
    with Store.open("s.db") as store:
        r, m = synthetic_run(4, backend="sim")
        r.target.kv_blocks = 28_179
        store.save_result(r, m)
        pic = picture(store.get(r.id), "c")
    assert pic.kv_tokens == 28_179 * 16
    assert pic.detail.startswith("450,864 KV tokens (the simulated pool: 28,179 blocks x 16)")


@pytest.mark.parametrize(
    ("launch", "expect"),
    [
        ("llama-server -m m.gguf -c 8192 -np 2", (8192, 2, False)),
        # llama-server's long spellings read as the short ones (it refuses `--ctx-size=N`)
        ("llama-server -m m.gguf --ctx-size 4096 --parallel 3 --kv-unified", (4096, 3, True)),
        ("llama-server -m m.gguf -c 0", (None, 4, True)),  # the model's context, auto slots
        (["llama-server", "-m", "m.gguf", "-np", "6", "-c"], (None, 6, False)),  # -c unfinished
    ],
)
def test_the_memory_picture_reads_llama_servers_recorded_command(launch, expect) -> None:
    from servetune.report.memory import llamacpp_context

    assert llamacpp_context(EngineConfig(engine="llamacpp"), launch) == expect
