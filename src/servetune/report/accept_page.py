"""The acceptance checklist as one HTML page in the report's style (its CSS and header):
the verdict, then one row per seed 003 §15 item with its status, evidence and runs."""

from __future__ import annotations

import html
from datetime import datetime, timezone
from typing import Any

from servetune.build import version_line
from servetune.report.html import CSS

STATUS_CSS = """
td.st{font-weight:600;white-space:nowrap}td.pass{color:#2e7d32}td.fail{color:#a94442}
td.na{color:#777}td.unchecked{color:#8a6d3b}td.pending{color:#777}
.outcome{font-size:16px;font-weight:600;margin:14px 0;padding:8px 14px;border-radius:6px}
.outcome.ok{color:#2e7d32;border:2px solid #2e7d32}
.outcome.bad{color:#a94442;border:2px solid #a94442}td ul{margin:0;padding-left:16px}
"""
_CLASS = {"pass": "pass", "fail": "fail", "n/a": "na", "cannot check here": "unchecked"}


def _e(s: Any) -> str:
    return html.escape(str(s), quote=True)


def _row(n: int, it: dict[str, Any]) -> str:
    ev = "".join(f"<li>{_e(e)}</li>" for e in it["evidence"])
    if it.get("fix"):
        ev += (
            f"<li><b>{'to check' if it['status'] == 'cannot check here' else 'fix'}:</b> "
            f"{_e(it['fix'])}</li>"
        )
    runs = "<br>".join(_e(r) for r in it["runs"]) or "-"
    cls = _CLASS.get(it["status"], "pending")
    return (
        f'<tr id="{_e(it["id"])}"><td>{n}</td><td><b>{_e(it["title"])}</b><br>'
        f'<span class="note">{_e(it["seed"])}</span></td><td class="st {cls}">'
        f"{_e(it['status'])}</td><td><ul>{ev}</ul></td><td>{runs}</td></tr>"
    )


def render_checklist(data: dict[str, Any]) -> str:
    """`Checklist.to_json()` as a whole page."""
    ctx = data.get("context") or {}
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    title = f"Go-live acceptance: {ctx.get('served_model') or ''} on {ctx.get('engine') or ''}"
    counts = ", ".join(f"{v} {k}" for k, v in (data.get("counts") or {}).items() if v)
    rows = "".join(_row(n, it) for n, it in enumerate(data["items"], 1))
    notes = "".join(f'<p class="warn">{_e(n)}</p>' for n in data.get("notes") or [])
    ok = "ok" if data.get("accepted") else "bad"
    return "".join(
        [
            '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
            f"<title>{_e(title)}</title><style>{CSS}{STATUS_CSS}</style></head><body>",
            f"<header><h1>{_e(title)}</h1><p>{_e(', '.join(ctx.get('urls') or []))} · study "
            f"{_e(ctx.get('study'))} · {version_line()} · {now}</p></header><main>",
            f'<p class="outcome {ok}">{_e(data["verdict"])}</p><p class="note">{_e(counts)}</p>',
            notes,
            '<section id="checklist"><h2>Seed 003 §15 go-live checklist</h2><table>',
            "<tr><th>#</th><th>item</th><th>status</th><th>evidence</th><th>runs</th></tr>",
            rows,
            "</table></section></main></body></html>",
        ]
    )
