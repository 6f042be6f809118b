"""One self-contained HTML file: plotly.js inlined once (works offline, no CDN), each
figure as JSON rendered by a small script, the §16 records and config differences as
tables. Every chart div gets `data-rendered="1"` once plotly has drawn it and any script
error is written into `#st-errors`, so a headless browser can check the page."""

from __future__ import annotations

import html
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from servetune.build import version_line
from servetune.metrics.compute import tpot_note
from servetune.report.charts import Chart
from servetune.report.data import ReportData
from servetune.report.experiment import experiment_record, side_by_side
from servetune.report.labels import changes
from servetune.report.verdict import verdict

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#222}
header{background:#1d2733;color:#fff;padding:18px 28px}header h1{margin:0;font-size:22px}
header p{margin:4px 0 0;color:#c9d3de}main{padding:8px 28px 40px;max-width:1500px}
nav{margin:12px 0}nav a{margin-right:14px;color:#1f5fa8;text-decoration:none}
section{margin:26px 0;border-top:1px solid #e3e6ea;padding-top:6px}h2{font-size:18px}
.note{color:#555;margin:4px 0 8px}.skipped{color:#8a6d3b;background:#fcf8e3;padding:8px 12px}
table{border-collapse:collapse;margin:8px 0;font-size:13px}
th,td{border:1px solid #dde1e6;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f3f5f7}tr.sec th{background:#e6ebf1;text-align:left}
td.diff{background:#fff3cd;font-weight:600}.warn{color:#a94442;font-weight:600}
#st-errors{color:#a94442;white-space:pre-wrap}.chart{min-height:200px}
.verdict{border:2px solid #2ca02c;border-radius:6px;padding:4px 16px 10px;margin:14px 0;
background:#f6fbf5}.verdict h2{margin:8px 0}.verdict table{margin:4px 0}
.verdict th{background:none;border:0;padding:2px 12px 2px 0;white-space:nowrap}
.verdict td{border:0;padding:2px 0}.verdict pre{background:#1d2733;color:#e8edf2;
padding:8px 12px;margin:6px 0 0;white-space:pre-wrap;word-break:break-all;font-size:12px}
td.role{font-weight:600}
"""

# Installed before plotly.js so errors while loading it are caught too.
ERROR_HOOK = """
window.__stErrors = [];
function __stFail(msg){window.__stErrors.push(String(msg));
  var el=document.getElementById('st-errors'); if(el){el.textContent=window.__stErrors.join('\\n');}
  document.documentElement.setAttribute('data-errors', String(window.__stErrors.length));}
window.addEventListener('error', function(e){__stFail(e.message||e);});
window.addEventListener('unhandledrejection', function(e){__stFail(e.reason||'rejection');});
"""

RENDER = """
(function(){
  var nodes=document.querySelectorAll('script[type="application/json"][data-fig]');
  var pending=[];
  nodes.forEach(function(node){
    var id=node.getAttribute('data-fig'); var div=document.getElementById(id);
    try{
      var fig=JSON.parse(node.textContent);
      pending.push(Plotly.newPlot(div, fig.data, fig.layout,
        {responsive:true, displaylogo:false}).then(function(){
          div.setAttribute('data-rendered', div.querySelectorAll('.main-svg').length>0?'1':'0');
        }));
    }catch(err){__stFail(id+': '+err);}
  });
  Promise.all(pending).then(function(){
    document.body.setAttribute('data-charts-rendered', String(
      document.querySelectorAll('.chart[data-rendered="1"]').length));
    var box=document.getElementById('verdict');
    if(box){var r=box.getBoundingClientRect();
      document.body.setAttribute('data-verdict-box', [Math.round(r.top),
        Math.round(r.bottom), window.innerHeight].join(','));}
  }, function(err){__stFail(err);});
})();
"""


MAX_CONFIG_ROWS = 12  # configs listed before the rest are folded into <details>


def _e(s: Any) -> str:
    return html.escape(str(s), quote=True)


def _json_script(key: str, fig: Any) -> str:
    # "</" must not appear inside a <script> element.
    payload = fig.to_json().replace("</", "<\\/")
    return f'<script type="application/json" data-fig="chart-{key}">{payload}</script>'


def _chart_section(c: Chart) -> str:
    body = (
        f'<div class="chart" id="chart-{c.key}" data-chart="{c.key}"></div>'
        if c.fig is not None
        else f'<p class="skipped">Not drawn: {_e(c.note)}</p>'
    )
    note = f'<p class="note">{_e(c.note)}</p>' if c.fig is not None and c.note else ""
    return f'<section id="{c.key}"><h2>{_e(c.title)}</h2>{note}{body}</section>'


def _verdict_section(data: ReportData) -> str:
    """The answer first: the box a reader sees without scrolling (`report.verdict`)."""
    v = verdict(data)
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(t)}</td></tr>" for k, t in v.rows)
    cmd = f"<pre>{_e(v.command)}</pre>" if v.command else ""
    return (
        f'<section id="verdict" class="verdict"><h2>{_e(v.headline)}</h2>'
        f"<table>{rows}</table>{cmd}</section>"
    )


def _buffered_section(data: ReportData) -> str:
    """A loud line per run whose server buffered its stream (metrics/buffering.py): the
    charts and record leave its TTFT/TPOT/ITL empty, and this says why."""
    runs = [r for r in data.runs if r.result.metrics.stream_buffered]
    if not runs:
        return ""
    items = "".join(
        f"<li>{_e(r.letter)} {_e(r.info.id)}: {r.result.metrics.stream_buffered_requests} "
        "requests got every chunk at the end</li>"
        for r in runs
    )
    return (
        '<section id="stream-buffered"><h2 class="warn">Buffered streaming: TTFT, TPOT and ITL '
        "not measurable</h2><p>The server held each answer and sent all its chunks at once, "
        "so the first chunk arrived when the answer was done. E2E is the latency a user "
        f"sees; no figure here measures token timing for these runs.</p><ul>{items}</ul></section>"
    )


def _at_once_section(data: ReportData) -> str:
    """A line per run whose TPOT leaves out answers that came all at once (`tpot_note`):
    its TPOT figures are over fewer answers than its TTFT, and this says how many."""
    notes = [(r, tpot_note(r.result.metrics)) for r in data.runs]
    items = "".join(f"<li>{_e(r.letter)} {_e(r.info.id)}: {_e(n)}</li>" for r, n in notes if n)
    if not items:
        return ""
    head = "<h2>TPOT over the answers that streamed</h2>"
    return f'<section id="tpot-at-once">{head}<ul>{items}</ul></section>'


def _configs_section(data: ReportData) -> str:
    """One row per config: its name in the charts, what it changes against the baseline
    (a study varies knobs by design: no one-change warning here, `runs compare` has it),
    and its context (engine, real or simulated, model, hardware, CPU)."""
    if len(data.series) < 2 and not data.is_tune:
        return ""
    base = data.series[data.baseline][0].info if data.baseline in data.series else None
    fields = list(dict.fromkeys(k for c in data.context.values() for k in c))
    head = "".join(f"<th>{_e(f)}</th>" for f in fields)
    rows = []
    for name in data.ordered():
        members, role = data.series[name], data.role(name)
        info = members[0].info
        if name == data.baseline or base is None:
            diff = "baseline" if name == data.baseline else "-"
        else:
            diff = ", ".join(changes(info, base, data.knobs))
        ctx = "".join(f"<td>{_e(data.context[name].get(f, '-'))}</td>" for f in fields)
        rows.append(
            f'<tr><th>{_e(name)}</th><td class="role">{_e(role)}</td>'
            f"<td>{_e(diff or 'same knobs')}</td>{ctx}<td>{len(members)}</td></tr>"
        )
    header = f"<tr><th>config</th><th>role</th><th>vs baseline</th>{head}<th>runs</th></tr>"
    more = ""
    if len(rows) > MAX_CONFIG_ROWS:  # a whole study's sim trials: folded, one click away
        more = (
            f"<details><summary>{len(rows) - MAX_CONFIG_ROWS} more configs</summary>"
            f"<table>{header}{''.join(rows[MAX_CONFIG_ROWS:])}</table></details>"
        )
    return (
        '<section id="configs"><h2>Configs: what each changes against the baseline</h2>'
        f"<table>{header}{''.join(rows[:MAX_CONFIG_ROWS])}</table>{more}</section>"
    )


def _record_section(data: ReportData, per_table: int = 6) -> str:
    """The §16 record, runs as columns (tables of at most `per_table` runs)."""
    legend = ", ".join(f"{r.letter} = {r.info.id} ({r.info.load_label()})" for r in data.runs)
    parts = [
        '<section id="record"><h2>Experiment record (seed 003 §16)</h2>',
        f'<p class="note">{_e(legend)}</p>',
    ]
    for start in range(0, len(data.runs), per_table):
        runs = data.runs[start : start + per_table]
        records = [experiment_record(r.info, r.metrics) for r in runs]
        head = "".join(f"<th>{_e(r.letter)}</th>" for r in runs)
        rows = [f"<tr><th>field</th>{head}</tr>"]
        for title, fields in side_by_side(records):
            rows.append(f'<tr class="sec"><th colspan="{len(runs) + 1}">{_e(title)}</th></tr>')
            for label, vals in fields:
                cls = ' class="diff"' if len(set(vals)) > 1 and len(runs) > 1 else ""
                cells = "".join(f"<td{cls}>{_e(v)}</td>" for v in vals)
                rows.append(f"<tr><th>{_e(label)}</th>{cells}</tr>")
        parts.append(f"<table>{''.join(rows)}</table>")
    parts.append("</section>")
    return "".join(parts)


def _plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def render_html(data: ReportData, charts: Sequence[Chart]) -> str:
    """The whole report as one string."""
    drawn = [c for c in charts if c.fig is not None]
    nav = "".join(f'<a href="#{c.key}">{_e(c.title)}</a>' for c in charts)
    nav += '<a href="#record">§16 record</a>'
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return "".join(
        [
            '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
            f"<title>{_e(data.title)}</title><style>{CSS}</style>",
            f"<script>{ERROR_HOOK}</script>",
            f'<script type="text/javascript">{_plotly_js()}</script>',
            "</head><body>",
            f"<header><h1>{_e(data.title)}</h1><p>{len(data.runs)} run(s) from "
            f"{_e(data.where)} · {version_line()} · {now}</p></header><main>",
            _verdict_section(data),
            _buffered_section(data),
            _at_once_section(data),
            '<pre id="st-errors"></pre>',
            _configs_section(data),
            f"<nav>{nav}</nav>",
            *(_chart_section(c) for c in charts),
            _record_section(data),
            "</main>",
            *(_json_script(c.key, c.fig) for c in drawn),
            f"<script>{RENDER}</script>",
            "</body></html>",
        ]
    )
