"""The report's screenshot for docs/report.md: a tune study on the simulator (the vLLM
what-if, seconds), its HTML report as `tune` writes it, the top of the page taken by
headless Chromium (Debian's package: `scripts/services.sh chromium`), shrunk to a
palette PNG under 300 KB.

    .venv/bin/python scripts/report_screenshot.py [docs/img/report.png]
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
WINDOW = (1280, 2000)  # the verdict, the configs table and the first charts
WIDTH = 1000  # pixels of the PNG in the docs
MAX_BYTES = 300_000


def tune_report(tmp: Path) -> Path:
    out = tmp / "report.html"
    subprocess.run(
        [sys.executable, "-m", "servetune.cli.app", "tune", "--backend", "sim",
         "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--trials", "6",
         "--db", str(tmp / "t.db"), "--study", "what-if", "-o", str(out), "-q"],
        check=True, cwd=tmp, stdout=subprocess.DEVNULL, timeout=600,
    )  # fmt: skip
    return out


def screenshot(page: Path, png: Path, tmp: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("no chromium: scripts/services.sh chromium")
    subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--user-data-dir={tmp / 'profile'}", f"--window-size={WINDOW[0]},{WINDOW[1]}",
         "--virtual-time-budget=20000", f"--screenshot={png}", page.as_uri()],
        check=True, capture_output=True, timeout=180,
    )  # fmt: skip


def shrink(src: Path, dst: Path) -> int:
    """Scale to WIDTH and quantize to 64 colours (charts are flat colours)."""
    img = Image.open(src).convert("RGB")
    img = img.resize((WIDTH, round(img.height * WIDTH / img.width)), Image.LANCZOS)
    img.quantize(colors=64, method=Image.Quantize.MEDIANCUT).save(dst, optimize=True)
    return dst.stat().st_size


def main() -> None:
    dst = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "img" / "report.png"
    dst.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        raw = tmp / "raw.png"
        screenshot(tune_report(tmp), raw, tmp)
        size = shrink(raw, dst)
    print(f"wrote {dst} ({size / 1000:.0f} KB)")
    if size > MAX_BYTES:
        sys.exit(f"{dst} is over {MAX_BYTES / 1000:.0f} KB: lower WIDTH or the colours")


if __name__ == "__main__":
    main()
