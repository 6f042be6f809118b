"""What the CLI prints stays readable in any terminal and through a pipe: no table cuts a
name or a number ("deepse…", "39…"), a table wider than the console is printed in blocks
of columns that each repeat the row labels, output to a pipe is not squeezed to 80
columns, and `simulate` reports on stdout with goodput and the SLO verdict."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table
from typer.testing import CliRunner

from servetune.bench.progress import load_label, summary_table
from servetune.cli.app import app
from servetune.cli.render import (
    PIPED_WIDTH,
    console,
    fit_columns,
    natural_width,
    print_tables,
)
from servetune.cli.sim_report import binding_check, slo_verdict
from servetune.results.schema import Metrics, SLOCheck
from synthetic_runs import synthetic_run

CHAT = str(Path(__file__).resolve().parents[1] / "examples" / "workloads" / "chat.yaml")


def cli(*args: str, columns: int | None = None) -> subprocess.CompletedProcess[str]:
    """The real entry point with stdout piped, and $COLUMNS set or not."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = str(columns)
    cmd = [sys.executable, "-m", "servetune.cli.app", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return out


def table_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln[:1] in "┏┃┡│└"]


def row_with(text: str, *cells: str) -> bool:
    """Some row of a table holds every one of these cells, each whole."""
    return any(all(f" {c} " in ln for c in cells) for ln in table_lines(text))


def catalogs() -> tuple[list[dict], list[dict]]:
    return json.loads(cli("models", "--json").stdout), json.loads(cli("gpus", "--json").stdout)


def test_catalogs_at_80_columns_keep_every_name_and_number() -> None:
    models, gpus = catalogs()
    text = cli("models", columns=80).stdout
    assert "…" not in text and max(map(len, text.splitlines())) <= 80
    for m in models:
        params, context = f"{m['params_total'] / 1e9:.2f}B", f"{m['max_position_embeddings']:,}"
        assert row_with(text, m["name"], params), m["name"]
        assert row_with(text, m["name"], context) and row_with(text, m["name"], m["hf_repo"])
    text = cli("gpus", columns=80).stdout
    assert "…" not in text and max(map(len, text.splitlines())) <= 80
    for g in gpus:
        assert row_with(text, g["name"], f"{g['memory_bandwidth_gbs']:,.0f}"), g["name"]
        assert row_with(text, g["name"], f"{g['interconnect']} {g['interconnect_gbs']:g}")


def test_piped_catalogs_print_one_whole_row_per_line() -> None:
    models, gpus = catalogs()
    lines = table_lines(cli("models").stdout)
    for m in models:
        rows = [ln for ln in lines if f"│ {m['name']} " in ln]
        assert len(rows) == 1 and m["hf_repo"] in rows[0], m["name"]
    lines = table_lines(cli("gpus").stdout)
    for g in gpus:
        rows = [ln for ln in lines if f"│ {g['name']} " in ln]
        assert len(rows) == 1 and f"{g['interconnect']} {g['interconnect_gbs']:g}" in rows[0]


def rendered(width: int, *tables: Table) -> str:
    out = io.StringIO()
    print_tables(*tables, con=Console(file=out, width=width))
    return out.getvalue()


def test_the_bench_summary_at_80_columns_keeps_every_figure() -> None:
    runs = [synthetic_run(c)[0] for c in (1, 8, 64, 256)]
    text = rendered(80, summary_table(runs))
    assert "…" not in text and max(map(len, text.splitlines())) <= 80
    for r in runs:
        m = r.metrics
        figures = [f"{m.completed}/{m.failed}", f"{m.req_s:.2f}", f"{m.output_tok_s:.1f}"]
        figures += [f"{m.ttft_ms.p99:.1f}", f"{m.e2e_ms.p99:.1f}", f"{m.goodput_req_s:.2f}"]
        for f in figures:
            assert row_with(text, load_label(r), f), (load_label(r), f)
    wide = rendered(PIPED_WIDTH, summary_table(runs))
    assert wide.count("servetune bench") == 1 and "continued" not in wide


def test_fit_columns_splits_a_wide_table_into_blocks_led_by_the_labels() -> None:
    con = Console(file=io.StringIO(), width=60)
    t = Table(title="wide")
    t.add_column("label", no_wrap=True)
    for i in range(10):
        t.add_column(f"col {i}", justify="right")
    t.add_row("row-one", *[f"{1234.5 * i:,.1f}" for i in range(10)])
    parts = fit_columns(t, con)
    assert len(parts) > 1
    assert all(p.columns[0].header == "label" and natural_width(p, con) <= 60 for p in parts)
    assert [c.header for p in parts for c in p.columns[1:]] == [f"col {i}" for i in range(10)]
    assert parts[0].title == "wide" and parts[1].title == "wide (continued)"
    narrow = Table("label", "x")
    narrow.add_row("a", "1")
    assert fit_columns(narrow, con) == [narrow]


def test_the_console_is_wide_when_piped_unless_columns_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    monkeypatch.delenv("COLUMNS", raising=False)
    assert console().width == PIPED_WIDTH
    monkeypatch.setenv("COLUMNS", "80")
    assert console().width == 80


def test_plan_at_80_columns_cuts_no_cell() -> None:
    args = ("plan", "--model", "deepseek-v3", "--gpu", "h200", "--gpus", "8", "-s", "rag")
    text = cli(*args, columns=80).stdout
    # the fixes table held `gpu_memory_utilizatio…`; the launch commands are left unwrapped
    assert "…" not in text and max(map(len, table_lines(text))) <= 80
    assert "gpu_memory_utilization" in text.replace("│\n", "").replace(" ", "")


def check(metric: str, value: float | None, target: float, ok: bool, note: str | None = None):
    return SLOCheck(metric=metric, stat="p95", target=target, value=value, ok=ok, note=note)


def test_the_binding_check_is_the_highest_value_over_target() -> None:
    ttft, tpot = check("ttft_ms", 400, 800, True), check("tpot_ms", 30, 40, True)
    errors = check("error_rate", 0.0, 0.001, True)
    assert binding_check([ttft, tpot, errors]) == tpot  # nearest its target
    missed = [check("ttft_ms", 1200, 800, False), check("tpot_ms", 50, 40, False)]
    assert binding_check(missed) == missed[0]  # missed by the most: 1.5x vs 1.25x
    nothing = check("ttft_ms", None, 800, False)  # no request completed
    assert binding_check([*missed, nothing]) == nothing
    unmeasured = check("kv_cache_usage", None, 0.9, True, note="not measured")
    assert binding_check([unmeasured, ttft]) == ttft
    assert binding_check([check("error_rate", 0.01, 0.0, False), *missed]).target == 0.0
    assert binding_check([unmeasured]) is None


def test_the_slo_verdict_names_goodput_and_the_binding_check() -> None:
    checks = [check("ttft_ms", 400, 800, True), check("tpot_ms", 30, 40, True)]
    met = Metrics(slo_pass=True, goodput_req_s=3.9, slo_attainment=0.975, slo_checks=checks)
    assert slo_verdict(met) == [
        "SLO pass: goodput 3.90 req/s, 97.5% of requests met it",
        "binding P95 TPOT 30 ms <= 40",
    ]
    missed = [check("ttft_ms", 1200, 800, False), check("tpot_ms", 50, 40, False)]
    failed = met.model_copy(update={"slo_pass": False, "slo_checks": missed})
    assert slo_verdict(failed) == [
        "SLO FAIL: goodput 3.90 req/s, 97.5% of requests met it",
        "binding P95 TTFT 1,200 ms > 800 (2 of 2 checks missed)",
    ]
    assert slo_verdict(Metrics()) == []


@pytest.mark.parametrize(
    ("slo", "verdict"),
    [
        ("ttft_ms: {p95: 1}\ntpot_ms: {p95: 1000}\n", "SLO FAIL: goodput 0.00 req/s"),
        ("ttft_ms: {p95: 100000}\ntpot_ms: {p95: 1000}\n", "SLO pass: goodput"),
    ],
)
def test_simulate_reports_on_stdout_with_the_slo_verdict(
    tmp_path: Path, slo: str, verdict: str
) -> None:
    (tmp_path / "slo.yaml").write_text(slo)
    args = ["simulate", "--workload", CHAT, "--count", "12", "--no-store"]
    res = CliRunner().invoke(app, [*args, "--slo", str(tmp_path / "slo.yaml"), "--rate", "1,2"])
    assert res.exit_code == 0, res.output
    out = res.stdout.splitlines()
    assert out[0].startswith("simulate llama-3.1-8b on h100-sxm [vllm], step times: gpu")
    assert [ln.split(":")[0] for ln in out if ln.startswith("rate ")] == ["rate 1.0", "rate 2.0"]
    verdicts = [ln.strip() for ln in out if ln.strip().startswith("SLO ")]
    assert len(verdicts) == 2 and all(v.startswith(verdict) for v in verdicts)
    binding = "binding P95 TTFT" if "FAIL" in verdict else "binding P95 TPOT"
    assert [ln.strip() for ln in out if ln.strip().startswith(binding)] != []
    assert sum(ln.strip().startswith("binding ") for ln in out) == 2
    assert "SLO" not in res.stderr and "out tok/s" not in res.stderr
    plain = CliRunner().invoke(app, args)  # no SLO: no verdict line
    assert plain.exit_code == 0 and "SLO" not in plain.stdout and "TTFT p50/p95/p99" in plain.stdout
