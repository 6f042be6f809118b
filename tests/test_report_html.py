"""The HTML report, opened in headless Chromium (Debian's package, installed by
scripts/services.sh): every chart renders, no console errors, the screenshot is not
blank, nothing is fetched from the network; PNG/SVG export through kaleido. A tune report
(from the simulator) and a bench-sweep report read at a glance: no "None" in a legend, no
empty plot panel, every percentile with its sample count, the verdict in the first screen."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from servetune.build import version_line
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
    assert out.charts == ALL_CHARTS  # type: ignore[attr-defined]
    assert set(out.skipped) <= {"telemetry"}  # type: ignore[attr-defined]  # synthetic: none
    assert text.count("Plotly=") + text.count("plotly.js v") >= 1
    assert len(re.findall(r"<script[^>]+src=", text)) == 0  # plotly.js inlined, no CDN
    assert not re.search(r"<link[^>]+href=.https?:", text)
    assert text.count('data-fig="chart-') == len(ALL_CHARTS)
    assert "Experiment record (seed 003 §16)" in text
    assert version_line() in text  # which servetune wrote it: version and build
    assert "Configs: what each changes against the baseline" in text
    assert "change one at a time" not in text  # that warning is `runs compare`'s


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


# --- reading at a glance -------------------------------------------------------------

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}  # fmt: skip
# A measured percentile: "P95 812 ms", "P95 TTFT of the later half 344 ms" (a target
# reads "P95 <= 800 ms"; a title "TTFT P50/P99 ms" shows none). Percentile names are
# masked first so that "P99" is not read as the number 99.
PCT_NAME = re.compile(r"\bP(?:50|90|95|99)\b")
_VALUE = re.compile(r"P_[^<>=\d\n]{0,40}\d[\d,.]*\s*ms")


def shows_percentile(text: str) -> bool:
    return _VALUE.search(PCT_NAME.sub("P_", text)) is not None


class Page(HTMLParser):
    """The dumped DOM, read for what a person sees: text nodes, table rows, legend
    entries, and how many drawn marks (lines, markers, bars) each plot panel holds."""

    def __init__(self, dom: str) -> None:
        super().__init__()
        self.stack: list[tuple[str, str]] = []  # (tag, class)
        self.texts: list[str] = []
        self.legend: list[str] = []
        self.rows: list[list[tuple[str, str]]] = []  # [(th|td, text)]
        # Drawn marks per panel: (figure, x axis) - an overlaid secondary y axis (`xy2`
        # over `xy`) draws into the same panel, so panels are told apart by their x axis.
        self._marks: dict[tuple[int, str], int] = {}
        self._figure = 0
        self._cell: list[str] | None = None
        self.feed(dom)

    @property
    def panels(self) -> list[int]:
        return list(self._marks.values())

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        cls = a.get("class") or ""
        if tag == "tr":
            self.rows.append([])
        if tag in ("td", "th"):
            self._cell = []
        if "js-plotly-plot" in cls.split() or tag == "svg" and not self._figure:
            self._figure += 1
        if tag == "g" and cls.startswith("subplot "):
            self._marks.setdefault(self._panel(cls), 0)
        drawn = tag == "path" and (a.get("d") or "").startswith("M")
        marks = "js-line" in cls or "point" in cls or any("point" in c for _, c in self.stack[-1:])
        subplot = next((c for _, c in reversed(self.stack) if c.startswith("subplot ")), None)
        if drawn and marks and subplot:
            self._marks[self._panel(subplot)] += 1
        if tag not in VOID:
            self.stack.append((tag, cls))

    def _panel(self, subplot_cls: str) -> tuple[int, str]:
        """`subplot x2y2` -> (figure, "x2")."""
        return self._figure, subplot_cls.split()[1].split("y")[0]

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self.rows:
            self.rows[-1].append((tag, " ".join(self._cell).strip()))
            self._cell = None
        while self.stack:
            if self.stack.pop()[0] == tag:
                break

    def handle_data(self, data: str) -> None:
        if not data.strip() or any(t in ("script", "style") for t, _ in self.stack):
            return
        self.texts.append(data.strip())
        if self._cell is not None:
            self._cell.append(data.strip())
        if self.stack and "legendtext" in self.stack[-1][1]:
            self.legend.append(data.strip())


def percentiles_without_n(page: Page) -> list[str]:
    """Shown percentiles that do not say how many requests they rest on: a text with a
    measured percentile value and no `n=`, or a table row / column about percentiles
    with a number but no `n=`."""
    bad = [t for t in page.texts if shows_percentile(t) and "n=" not in t]
    for row in page.rows:
        if row and row[0][0] == "th" and PCT_NAME.search(row[0][1]):
            bad += [v for k, v in row[1:] if k == "td" and re.search(r"\d", v) and "n=" not in v]
    return bad


@pytest.fixture(scope="module")
def tune_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tune study on the simulator (the vLLM what-if, a few seconds), its report as
    `tune` writes it."""
    tmp = tmp_path_factory.mktemp("tune")
    out = tmp / "tune.html"
    res = subprocess.run(
        [sys.executable, "-m", "servetune.cli.app", "tune", "--backend", "sim",
         "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--trials", "6", "--db",
         str(tmp / "t.db"), "--study", "glance", "-o", str(out), "-q"],
        capture_output=True, text=True, timeout=300, cwd=tmp,
    )  # fmt: skip
    assert res.returncode == 0 and out.exists(), res.stderr[-2000:]
    return out


def _page(chromium: str, path: Path, tmp: Path, size: str = "1280,800") -> tuple[Page, str]:
    res = _chromium(chromium, tmp, f"--window-size={size}", "--dump-dom", path.as_uri())
    assert res.returncode == 0, res.stderr[-2000:]
    return Page(res.stdout), res.stdout


@pytest.mark.parametrize("which", ["tune", "bench-sweep"])
def test_the_report_reads_at_a_glance(
    chromium: str,
    which: str,
    tune_report: Path,
    report: tuple[Path, object],
    tmp_path: Path,
) -> None:
    path = tune_report if which == "tune" else report[0]
    page, dom = _page(chromium, path, tmp_path)
    assert re.search(r'<pre id="st-errors">\s*</pre>', dom)
    assert page.legend and not [t for t in page.legend if "None" in t]
    assert page.panels and all(page.panels), page.panels  # every panel holds a mark
    assert percentiles_without_n(page) == []
    shown = [t for t in page.texts if shows_percentile(t)]
    shown += [r for r in page.rows if r and r[0][0] == "th" and PCT_NAME.search(r[0][1])]
    assert len(shown) >= 3  # the checks above had percentiles to look at
    box = re.search(r'data-verdict-box="(-?\d+),(-?\d+),(\d+)"', dom)
    assert box, "no verdict box"
    top, bottom, height = map(int, box.groups())
    assert 0 <= top < bottom <= height  # all of it in the first screen
    if which == "tune":
        text = " ".join(page.texts)
        assert "Winner:" in text and "vs baseline" in text and "how sure" in text
        assert "vllm.entrypoints.openai.api_server" in text  # the launch command
        for key in ("capacity", "binding", "latency-vs-load", "memory"):
            assert f'id="chart-{key}" data-chart="{key}" data-rendered="1"' in dom or re.search(
                rf'<div[^>]* id="chart-{key}"[^>]*data-rendered="1"', dom
            ), key


def test_the_tune_report_stars_the_sweet_spot_tune_printed(tune_report: Path) -> None:
    """The CLI's "sweet spot N in flight (why)" line and the report's starred point are
    one analysis (audit: the report starred the c=512 run on an achieved req/s axis)."""
    with Store.open(str(tune_report.parent / "t.db"), create=False) as store:
        lines = (store.study_meta("glance") or {})["summary"]["explanation"]
    said = next(ln for ln in lines if ln.startswith("sweet spot "))
    knee, reason = re.match(r"sweet spot (\S+) in flight \(([^)]*)\)", said).groups()  # type: ignore[union-attr]
    html = tune_report.read_text(encoding="utf-8")
    assert f"Sweet spot: {knee} in flight ({reason}) as `tune` named it" in html
    assert "Sweet spot: achieved req/s" not in html


def test_the_checks_catch_what_they_look_for() -> None:
    """Negative control: an empty panel, a "None" legend and a bare percentile are seen."""
    page = Page(
        '<svg><g class="subplot xy"><path class="js-line" d="M0,0L1,1"></path></g>'
        '<g class="subplot x2y2"><path class="js-line" d=""></path></g>'
        '<g class="legend"><text class="legendtext">parallel_slots=None</text></g></svg>'
        "<p>TTFT P95 812 ms</p><p>P95 812 ms (n=16)</p><p>P95 TTFT &lt;= 800 ms</p>"
        "<p>steady state: P95 TTFT of the window's later half 6,337 ms &gt; 800</p>"
        "<table><tr><th>TTFT ms P50/P95/P99</th><td>1 / 2 / 3</td></tr></table>"
    )
    assert page.panels == [1, 0]
    assert page.legend == ["parallel_slots=None"]
    assert percentiles_without_n(page) == [
        "TTFT P95 812 ms",
        "steady state: P95 TTFT of the window's later half 6,337 ms > 800",
        "1 / 2 / 3",
    ]
