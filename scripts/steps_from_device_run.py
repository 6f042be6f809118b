"""Write data/published/device_steps.csv, the forward passes of servetune's own GPU run
(data/published/h200_device_run.json, made by scripts/measure_gpu_kernels.py), in the
step rows' form that `servetune validate --published` checks (validate.steps).

A row's time is the measured forward pass of one GPU's shard plus its LM head at one row a
sequence (vLLM computes logits for the last token of each sequence; the head was timed
apart, at M = 1-8192): what the step model's kernels price, without the engine's CPU side
and the all-reduces (one GPU ran it). Run once after a device run:
    python scripts/steps_from_device_run.py
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from servetune.sim.gpu_kernels import at_m

PUBLISHED = Path(__file__).resolve().parents[1] / "src/servetune/data/published"
RUN = "h200_device_run.json"
FIELDS = [
    "id", "source", "engine", "version", "model", "gpu", "tp", "quantization", "scope",
    "kind", "prefill_tokens", "decode_seqs", "context_per_seq", "passes", "measured_ms",
]  # fmt: skip


def head_us(heads: dict[int, float], rows: int) -> float:
    """The LM head's time at `rows` rows, read between the timed ones as the gpu tier reads
    its GEMM tables (`gpu_kernels.at_m`: log time against log rows)."""
    ms = sorted(heads)
    return at_m(np.array(ms, dtype=float), np.array([heads[m] for m in ms]), rows)


def rows(run: dict) -> list[dict]:
    out = []
    steps = run["model_steps"]
    for s in steps:
        if s["kind"] not in ("decode", "prefill", "mixed") or "us" not in s:
            continue
        cfg = (s["model"], s["tp"], s["dtype"])
        heads = {
            h["m"]: h["us"]
            for h in steps
            if h["kind"] == "lm_head" and (h["model"], h["tp"], h["dtype"]) == cfg
        }
        prefill = s.get("prefill_tokens", s.get("tokens", 0))
        seqs = s.get("seqs", 0)
        sampled = seqs + (1 if prefill else 0)
        name = f"{s['kind']}-{prefill}" if s["kind"] == "prefill" else f"{s['kind']}-{seqs}"
        if s["kind"] == "mixed":
            name += f"-{prefill}"
        out.append(
            {
                "id": f"h200-torch-{s['model']}-tp{s['tp']}-{s['dtype']}-{name}",
                "source": f"data/published/{RUN} (scripts/measure_gpu_kernels.py, {run['date']})",
                "engine": "torch",
                "version": run["torch"],
                "model": s["model"],
                "gpu": "h200",
                "tp": s["tp"],
                "quantization": "fp8" if s["dtype"] == "fp8" else "",
                "scope": "kernels",
                "kind": s["kind"],
                "prefill_tokens": prefill,
                "decode_seqs": seqs,
                "context_per_seq": s.get("ctx", 0) if seqs else 0,
                "passes": 3 if s["kind"] == "prefill" else 5,
                "measured_ms": round((s["us"] + head_us(heads, sampled)) / 1e3, 3),
            }
        )
    return out


def main() -> None:
    run = json.loads((PUBLISHED / RUN).read_text())
    with open(PUBLISHED / "device_steps.csv", "w", newline="") as f:
        w = csv.DictWriter(f, FIELDS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows(run))


if __name__ == "__main__":
    main()
