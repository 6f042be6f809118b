"""A lower quant of a GGUF, made with llama.cpp's llama-quantize and cached, so a quality
regression can be measured for real (e.g. Q4_K_M re-quantized to Q2_K)."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from servetune.engines.install import engine_dir, llamacpp_quantize
from servetune.errors import InputError


def cache_name(src: Path, qtype: str) -> str:
    """The cached output's file name: the source's stem, for people, and a key of its
    resolved path, size and modification time, so two GGUFs of one file name (or one file
    rewritten in place) never share a cached requantized file."""
    st = src.stat()
    ident = f"{src.resolve()}\0{st.st_size}\0{st.st_mtime_ns}"
    key = hashlib.sha256(ident.encode()).hexdigest()[:12]
    return f"{src.stem}.{key}.requant-{qtype}.gguf"


def requantized(src: Path, qtype: str = "Q2_K", threads: int = 2) -> Path:
    """`src` re-quantized to `qtype` under the llama.cpp engine cache (made once).
    `--allow-requantize` is needed because the source is already quantized; the output
    then carries both rounding errors, which is the point of the test."""
    out = engine_dir("llamacpp") / "models" / cache_name(src, qtype)
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    cmd = [str(llamacpp_quantize()), "--allow-requantize", str(src), str(tmp), qtype, str(threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise InputError("quant type", f"llama-quantize {qtype} failed: {tail[0]}")
    tmp.replace(out)
    return out
