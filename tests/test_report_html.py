"""The HTML report, opened in headless Chromium (Debian's package, installed by
scripts/services.sh): every chart renders, no console errors, the screenshot is not
blank, nothing is fetched from the network; PNG/SVG export through kaleido."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from servetune.engines.config import EngineConfig
from servetune.report import build_report, export_images
from servetune.report.charts import Chart
from servetune.store import Store
from synthetic_runs import synthetic_run, synthetic_sweep

ROOT = Path(__file__).resolve().parents[1]
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--virtual-time-budget=20000",
]
ALL_CHARTS = ["latency-vs-load", "sweet-spot", "pareto", "cdf", "server", "sim-vs-real", "memory"]


@pytest.fixture(scope="module")
def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:  # install it the way CI does; never skip
        subprocess.run([str(ROOT / "scripts" / "services.sh"), "chromium"], check=True, timeout=900)
        path = shutil.which("chromium")
    assert path, "chromium not installed"
    return path


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    tmp = tmp_path_factory.mktemp("report")
    with Store.open(str(tmp / "r.db")) as store:
        for backend in ("real", "sim"):
            for r, m in synthetic_sweep((1, 2, 4, 8, 16, 32, 64), seed=3, backend=backend):
                store.save_result(r, m, study=f"sweep-{backend}")
        r, m = synthetic_run(16, seed=3, config=EngineConfig(max_num_seqs=32))
        r.id = m.id = "bench-variant-c16"
        store.save_result(r, m, study="variant")
        out = build_report(store, ["sweep-real", "sweep-sim", "variant"], tmp / "report.html")
    return tmp / "report.html", out


def _chromium(chromium: str, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp / f"profile-{len(list(tmp.iterdir()))}"
    return subprocess.run(
        [chromium, *FLAGS, f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_report_is_self_contained(report: tuple[Path, object]) -> None:
    path, out = report
    text = path.read_text()
    assert out.charts == ALL_CHARTS and out.skipped == {}  # type: ignore[attr-defined]
    assert text.count("Plotly=") + text.count("plotly.js v") >= 1
    assert len(re.findall(r"<script[^>]+src=", text)) == 0  # plotly.js inlined, no CDN
    assert not re.search(r"<link[^>]+href=.https?:", text)
    assert text.count('data-fig="chart-') == len(ALL_CHARTS)
    assert "Experiment record (seed 003 §16)" in text and "What differs between the runs" in text


def test_every_chart_renders_in_headless_chromium(
    chromium: str, report: tuple[Path, object], tmp_path: Path
) -> None:
    path, _ = report
    res = _chromium(chromium, tmp_path, "--dump-dom", path.as_uri())
    dom = res.stdout
    assert res.returncode == 0, res.stderr[-2000:]
    for key in ALL_CHARTS:
        div = re.search(rf'<div[^>]* id="chart-{key}"[^>]*>', dom)
        assert div and 'data-rendered="1"' in div.group(0), key
    assert f'data-charts-rendered="{len(ALL_CHARTS)}"' in dom
    assert dom.count('class="main-svg"') >= len(ALL_CHARTS)
    errors = re.search(r'<pre id="st-errors">(.*?)</pre>', dom, re.S)
    assert errors is not None and errors.group(1).strip() == ""
    assert not re.search(r"<html[^>]*data-errors", dom)
    console = [ln for ln in res.stderr.splitlines() if "CONSOLE" in ln]
    assert console == []


def test_screenshot_is_not_blank(
    chromium: str, report: tuple[Path, object], tmp_path: Path
) -> None:
    from PIL import Image

    path, _ = report
    shot = tmp_path / "shot.png"
    res = _chromium(
        chromium, tmp_path, "--window-size=1400,3000", f"--screenshot={shot}", path.as_uri()
    )
    assert shot.exists(), res.stderr[-2000:]
    img = Image.open(shot).convert("RGB").resize((350, 750))
    pixels = [img.getpixel((x, y)) for x in range(350) for y in range(750)]
    non_white = sum(1 for p in pixels if sum(p) < 720) / len(pixels)
    assert non_white > 0.05  # header, lines, shaded regions
    assert len(set(pixels)) > 200  # charts, not a flat page


def test_png_and_svg_export(chromium: str, report: tuple[Path, object], tmp_path: Path) -> None:
    import plotly.graph_objects as go

    fig = go.Figure(go.Scatter(x=[1, 2, 3], y=[3, 1, 2]))
    charts = [Chart("a", "A", fig), Chart("skipped", "S", None, "no data")]
    png, svg = export_images(charts, tmp_path, "png", "svg")  # one browser session
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert "<svg" in svg.read_text()[:500]


def test_a_broken_chart_is_caught(
    chromium: str, report: tuple[Path, object], tmp_path: Path
) -> None:
    """Negative control: the checks above would see a chart that fails to draw."""
    path, _ = report
    broken = tmp_path / "broken.html"
    text = path.read_text()
    start = text.index('data-fig="chart-pareto">') + len('data-fig="chart-pareto">')
    broken.write_text(text[:start] + "{not json" + text[start:])
    dom = _chromium(chromium, tmp_path, "--dump-dom", broken.as_uri()).stdout
    assert re.search(r'<pre id="st-errors">chart-pareto: SyntaxError', dom)
    assert re.search(r'<div[^>]* id="chart-pareto"[^>]*>', dom).group(0).count("data-rendered") == 0
    assert f'data-charts-rendered="{len(ALL_CHARTS) - 1}"' in dom


def test_report_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    import sys

    from servetune.cli.app import main

    db = tmp_path / "one.db"
    with Store.open(str(db)) as store:
        r, m = synthetic_run(4, n_requests=40)
        store.save_result(r, m)

    def cli(*args: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["servetune", "report", *args, "--db", str(db)])
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    out_file = tmp_path / "one.html"
    code, out, _ = cli(r.id, "-o", str(out_file))
    assert code == 0 and out_file.stat().st_size > 1_000_000
    assert "not drawn: latency-vs-load: Needs a sweep" in out  # one run: says what is missing
    code, _, err = cli("nope", "-o", str(tmp_path / "x.html"))
    assert code == 2 and err.count("\n") == 1 and "no run or study 'nope'" in err
    assert not (tmp_path / "x.html").exists()


def test_the_empty_server_chart_names_only_options_bench_has(tmp_path: Path) -> None:
    """Runs without scraped server metrics: the chart's note says why, naming bench's own
    option (an option it does not have would send the reader nowhere)."""
    from servetune.report.charts import server_metrics
    from servetune.report.data import load_report_data

    with Store.open(str(tmp_path / "r.db")) as store:
        run, meta = synthetic_run(2, n_requests=20)
        store.save_result(run.model_copy(update={"server": None}), meta, study="bare")
        note = server_metrics(load_report_data(store, ["bare"])).note
    named = re.findall(r"--[a-z][a-z-]*", note)
    usage = subprocess.run(
        [sys.executable, "-m", "servetune.cli.app", "bench", "--help"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"},
    ).stdout  # fmt: skip
    assert named == ["--no-scrape"] and all(f in usage.split() for f in named), note
