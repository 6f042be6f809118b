"""Assemble a report: read the runs, draw the charts, write the HTML (and images)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servetune.errors import InputError
from servetune.plan.service import PlanArgs, plan_to_json, run_plan
from servetune.report import charts as ch
from servetune.report.data import ReportData, load_report_data
from servetune.report.html import render_html
from servetune.store import Store

IMAGE_FORMATS = ("png", "svg")


@dataclass
class ReportOutput:
    path: Path
    bytes: int
    charts: list[str]  # drawn
    skipped: dict[str, str]  # key -> why
    images: list[Path] = field(default_factory=list)


def _plan_args(info: Any) -> Any:
    cfg = info.engine_config
    hw = info.meta.get("hardware") or {}
    return PlanArgs(
        model=info.model,
        gpu=hw.get("catalog") or hw.get("gpu") or hw.get("cpu"),
        gpus=int(hw.get("gpu_count") or info.gpu_count or 1),
        scenario=None,
        dtype=cfg.get("dtype") or "auto",
        quant=cfg.get("quantization"),
        kv_dtype=cfg.get("kv_cache_dtype"),
        max_model_len=cfg.get("max_model_len"),
        gpu_memory_utilization=cfg.get("gpu_memory_utilization"),
        kv_cache_space=cfg.get("kv_cache_space_gib"),
        block_size=cfg.get("block_size") or 16,
        max_num_seqs=cfg.get("max_num_seqs"),
        max_num_batched_tokens=cfg.get("max_num_batched_tokens"),
        tp=cfg.get("tensor_parallel_size"),
        pp=cfg.get("pipeline_parallel_size") or 1,
        enforce_eager=bool(cfg.get("enforce_eager")),
        engine=cfg.get("engine") or "vllm",
    )


def plans_for(data: ReportData) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The plan of each series: stored with the run (meta.plan) or recomputed from its
    model, GPU and engine config when the catalog knows them."""
    plans: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    for name, members in data.series.items():
        info = members[0].info
        if info.meta.get("plan"):
            plans[name] = info.meta["plan"]
            continue
        hw = info.meta.get("hardware") or {}
        if not info.model or not hw.get("gpu"):
            notes.append(f"{name}: model or GPU not recorded")
            continue
        try:
            plans[name] = plan_to_json(run_plan(_plan_args(info)))
        except InputError as exc:
            notes.append(f"{name}: {exc.one_line()}")
        if len(plans) >= 8:
            break
    return plans, notes


def build_charts(data: ReportData) -> list[ch.Chart]:
    plans, notes = plans_for(data)
    return [
        ch.latency_vs_load(data),
        ch.sweet_spot(data),
        ch.pareto(data),
        ch.cdfs(data),
        ch.server_metrics(data),
        ch.sim_vs_real(data),
        ch.memory(data, plans, notes),
    ]


def _need_plotly() -> None:
    try:
        import plotly  # noqa: F401
    except ImportError as exc:
        raise InputError(
            "report", "plotly is not installed", "pip install 'servetune[report]'"
        ) from exc


def build_report(
    store: Store,
    refs: Sequence[str],
    out: Path,
    *,
    title: str | None = None,
    images: Path | None = None,
    image_format: str = "png",
) -> ReportOutput:
    """Write the HTML report for `refs` to `out` (atomically) and, with `images`, each
    chart as PNG or SVG into that folder."""
    _need_plotly()
    if not out.parent.is_dir():
        raise InputError("--output", f"folder {out.parent} does not exist")
    formats = [f.strip().lower() for f in image_format.split(",") if f.strip()]
    if images is not None and (not formats or set(formats) - set(IMAGE_FORMATS)):
        raise InputError("--image-format", f"{image_format!r}: use png, svg or png,svg")
    data = load_report_data(store, refs, title)
    charts = build_charts(data)
    text = render_html(data, charts)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(out)
    result = ReportOutput(
        path=out,
        bytes=out.stat().st_size,
        charts=[c.key for c in charts if c.fig is not None],
        skipped={c.key: c.note for c in charts if c.fig is None},
    )
    if images is not None:
        result.images = export_images(charts, images, *formats)
    return result


def export_images(charts: Sequence[ch.Chart], folder: Path, *formats: str) -> list[Path]:
    """Each drawn chart as `<key>.<fmt>` for each format (default png), in one browser
    session (kaleido + Chromium).
    kaleido finds Chrome/Chromium itself; Debian's `chromium` is pointed at explicitly."""
    try:
        import kaleido
    except ImportError as exc:
        raise InputError(
            "--images", "PNG/SVG export needs kaleido", "pip install 'servetune[report]'"
        ) from exc
    if "BROWSER_PATH" not in os.environ:
        found = shutil.which("chromium") or shutil.which("chromium-browser")
        if found:
            os.environ["BROWSER_PATH"] = found
    folder.mkdir(parents=True, exist_ok=True)
    jobs = [
        {
            "fig": c.fig,
            "path": str(folder / f"{c.key}.{fmt}"),
            "opts": {"format": fmt, "width": 1200, "height": c.fig.layout.height or 500},
        }
        for c in charts
        if c.fig is not None
        for fmt in formats or ("png",)
    ]
    try:
        kaleido.write_fig_from_object_sync(jobs)
    except Exception as exc:  # kaleido/choreographer raise their own types
        if "Chrome" in type(exc).__name__ or "browser" in str(exc).lower():
            raise InputError(
                "--images",
                f"no usable Chrome/Chromium for the export ({type(exc).__name__})",
                "apt-get install chromium (scripts/services.sh chromium) or set BROWSER_PATH",
            ) from exc
        raise
    return [Path(j["path"]) for j in jobs]
