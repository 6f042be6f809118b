"""ONNX models for `onnx-genai serve`: a Hugging Face directory converted by
onnxruntime-genai's model builder, then made loadable by the server; cached by the
source's content hash, so a second `engine make-model --kind onnx` only reads a marker.

The builder (`python -m onnxruntime_genai.models.builder -i HF_DIR -o OUT -p fp32 -e cpu`)
writes model.onnx + model.onnx.data + genai_config.json + tokenizer files. It runs in the
ONNX engine's venv (engines/install.py, recipe "onnx"), which has torch, transformers and
onnx-ir. Measured here (2026-12): about 14 s for the 8-layer test Llama, 400 MB in fp32.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from servetune.engines import install
from servetune.engines.testmodel import models_dir
from servetune.errors import InputError

BUILDER = "onnxruntime_genai.models.builder"
# fp32: the CPU execution provider's reference precision; the builder's int4 would be
# smaller, but this is the test model's job: a real decode loop, not a small file.
PRECISIONS = ("fp32", "fp16", "int4")
_MARKER = "servetune_onnx.json"
_WHOLE_FILE_BYTES = 64 << 20  # files up to this size are hashed whole
_EDGE_BYTES = 1 << 20  # bigger ones: size + first and last MiB (weights of a cached model)

# The builder declares the last dim of every KV input/output (`past_key_values.N.key`,
# `present.N.value`, ...) as a symbol (`kv_cache_dim` in onnxruntime-genai 0.18), and
# onnx-genai-server 0.1.0.dev6 refuses to load such a model ("cannot infer KV head_dim
# from 'present.0.key'"). This rewrites that symbol to genai_config.json's head_size in
# the graph's inputs, outputs and value_info, and saves model.onnx only: the weights stay
# in model.onnx.data, which the graph references by name. Run in the ONNX venv (onnx).
_CONCRETE_KV = """\
import json, sys
import onnx
d = sys.argv[1]
head = json.load(open(d + "/genai_config.json"))["model"]["decoder"]["head_size"]
m = onnx.load(d + "/model.onnx", load_external_data=False)
n = 0
for v in [*m.graph.input, *m.graph.output, *m.graph.value_info]:
    dims = v.type.tensor_type.shape.dim
    if v.name.startswith(("past_key_values.", "present.")) and dims and dims[-1].dim_param:
        dims[-1].dim_value = head
        n += 1
onnx.save(m, d + "/model.onnx")
print(n)
"""

Say = Callable[[str], None]


def source_hash(src: Path) -> str:
    """Content hash of an HF directory: every file's relative name and size, and its bytes
    (whole up to 64 MiB; for bigger weight files the first and last MiB)."""
    h = hashlib.sha256()
    for f in sorted(p for p in src.rglob("*") if p.is_file()):
        size = f.stat().st_size
        h.update(f"{f.relative_to(src)}\0{size}\0".encode())
        with f.open("rb") as fh:
            if size <= _WHOLE_FILE_BYTES:
                h.update(fh.read())
            else:
                h.update(fh.read(_EDGE_BYTES))
                fh.seek(size - _EDGE_BYTES)
                h.update(fh.read(_EDGE_BYTES))
    return h.hexdigest()[:12]


def onnx_dir(src: Path, precision: str) -> Path:
    """Where the conversion of `src` at `precision` is cached."""
    return models_dir() / "onnx" / f"{src.name}-{source_hash(src)}-{precision}"


def convert(
    src: Path, *, precision: str = "fp32", python: str | None = None, say: Say = print
) -> Path:
    """The ONNX model of HF directory `src` for onnx-genai-server (cached: a converted
    model is returned as is). `python`: the builder's interpreter (default: the ONNX
    engine's venv, installed when missing)."""
    src = Path(src)
    if not (src / "config.json").is_file():
        raise InputError("--source", f"{src} has no config.json", "give a Hugging Face model dir")
    if precision not in PRECISIONS:
        raise InputError("precision", f"unknown {precision!r}", f"one of {', '.join(PRECISIONS)}")
    target = onnx_dir(src, precision)
    if (target / _MARKER).is_file():
        return target
    py = python or install.install("onnx", say=say).prefix[0]
    with install.dir_lock(target.parent):  # one conversion at a time
        if (target / _MARKER).is_file():  # converted while we waited
            return target
        part = target.with_name(target.name + ".part")
        shutil.rmtree(part, ignore_errors=True)
        part.mkdir(parents=True)
        log = target.with_name(target.name + ".log")
        log.write_text("")
        say(f"onnx: converting {src} ({precision}, CPU) with {BUILDER}")
        hf_cache = part / ".hf-cache"
        builder = [py, "-m", BUILDER, "-i", str(src), "-o", str(part), "-p", precision]
        _run([*builder, "-e", "cpu", "-c", str(hf_cache)], log, "model builder")
        shutil.rmtree(hf_cache, ignore_errors=True)
        made_concrete = int(_run([py, "-c", _CONCRETE_KV, str(part)], log, "KV dims") or 0)
        marker = {
            "source": str(src),
            "precision": precision,
            "kv_dims_made_concrete": made_concrete,
        }
        (part / _MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        shutil.rmtree(target, ignore_errors=True)  # a stale one without its marker
        part.replace(target)
    say(f"onnx: {target}")
    return target


def _run(cmd: list[str], log: Path, step: str) -> str:
    """Run one conversion step, its output appended to `log`; its stdout's last line."""
    done = subprocess.run(cmd, capture_output=True, text=True)
    with log.open("a") as fh:
        fh.write(f"$ {' '.join(cmd[:3])} ...\n{done.stdout}{done.stderr}")
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise InputError("onnx", f"{step} failed (exit {done.returncode}): {last}", f"log: {log}")
    return (done.stdout.strip().splitlines() or [""])[-1]
