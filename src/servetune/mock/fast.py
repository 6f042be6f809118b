"""The compiled mock (fastmock.c): built on demand with the system C compiler, cached.

Why a compiled mock at all: a Python mock spends about as much CPU per streamed chunk as
the Python client, so on one core it saturates first and the client-ceiling figures would
measure the mock. The C one costs a few microseconds per chunk. It is a measuring tool
for `benchmarks/client_ceiling.py`, not a test fixture: fault modes stay in the Python mock.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from servetune.paths import cache_root

SOURCE = Path(__file__).with_name("fastmock.c")


def build(cache: Path | None = None) -> Path | None:
    """Compile fastmock.c once per source version; None when there is no C compiler
    (Debian: `apt-get install gcc`) or the build fails (its error is printed)."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None or not SOURCE.exists():
        return None
    if cache is None:
        cache = cache_root() / "fastmock"
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    exe = cache / f"fastmock-{digest}"
    if exe.exists():
        return exe
    cache.mkdir(parents=True, exist_ok=True)
    tmp = exe.with_suffix(f".{os.getpid()}.tmp")
    proc = subprocess.run(
        [cc, "-O2", "-std=gnu11", "-Wall", "-o", str(tmp), str(SOURCE)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        print(f"fastmock build failed:\n{proc.stderr[-2000:]}")
        return None
    tmp.replace(exe)  # atomic: a concurrent build never sees half a binary
    return exe


def command(
    exe: Path, *, ttft_ms: float, itl_ms: float, output_tokens: int | None, port: int = 0
) -> list[str]:
    """The argv that starts the compiled mock (it prints its URL on the first line);
    `output_tokens` None: each answer runs to the request's cap, as the Python mock's."""
    argv = [str(exe), "--port", str(port), "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms)]
    return argv + (["--output-tokens", str(output_tokens)] if output_tokens else [])
