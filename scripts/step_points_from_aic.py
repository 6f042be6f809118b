"""Build servetune's real-vLLM step points (src/servetune/data/published/vllm_steps.csv)
from NVIDIA AIConfigurator's published forward-pass measurements.

Source: github.com/ai-dynamo/aiconfigurator (Apache-2.0), commit abbac647 (branch
simonec/dev-layerwise-collector-clean-base), fpm_golden_runs/
fpm_upfront_qwen32_full_once_20260613_194007/tp<N>_ep1_past4096/fpm_metrics_phase.csv:
the wall time of every vLLM 0.20.1 forward pass (vLLM's forward-pass metrics, through
NVIDIA Dynamo) of Qwen/Qwen3-32B in bf16 on B300 GPUs at TP 1, 2, 4 and 8, defaults
otherwise (CUDA graphs, async scheduling). The GPU is named in the same commit's
.agents/skills/close-layerwise-fpm-gap/references/today-learnings.md ("B300/vLLM 0.20.1
Qwen3-32B"). Only the median of each clean group of passes is carried: lone prefills of
128, 1024 and 4096 tokens, and decode-only passes of 1-12 sequences at ~4,100 tokens of
context each.

    python scripts/step_points_from_aic.py RUN_DIR > src/servetune/data/published/vllm_steps.csv
"""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

RUN = "fpm_golden_runs/fpm_upfront_qwen32_full_once_20260613_194007"
SOURCE = f"https://github.com/ai-dynamo/aiconfigurator/blob/abbac647cd87e18557a8cb398b347db2257a6a9a/{RUN}"
FIELDS = [
    "id",
    "source",
    "engine",
    "version",
    "model",
    "gpu",
    "tp",
    "kind",
    "prefill_tokens",
    "decode_seqs",
    "context_per_seq",
    "passes",
    "measured_ms",
]


def groups(rows: list[dict]) -> dict[tuple, list[dict]]:
    """Clean passes keyed by what they ran: a lone prefill without cache, or decodes only."""
    out: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["workload_segment"] != "sweep":
            continue
        ctx, ctx_req, dec = int(r["ctx_tokens"]), int(r["ctx_requests"]), int(r["decode_requests"])
        if r["phase"] == "context" and ctx_req == 1 and int(r["ctx_kv_tokens"]) == 0 and dec == 0:
            out.setdefault(("prefill", ctx, 0), []).append(r)
        elif r["phase"] == "decode" and ctx == 0 and dec in (1, 4, 8, 12):
            out.setdefault(("decode", 0, dec), []).append(r)
    return out


def main() -> None:
    run_dir = Path(sys.argv[1])
    w = csv.DictWriter(sys.stdout, FIELDS, lineterminator="\n")
    w.writeheader()
    for tp in (1, 2, 4, 8):
        path = run_dir / f"tp{tp}_ep1_past4096" / "fpm_metrics_phase.csv"
        with path.open() as f:
            rows = list(csv.DictReader(f))
        for (kind, ctx, dec), g in sorted(groups(rows).items()):
            context = round(statistics.median(float(r["mean_decode_kv_tokens"]) for r in g))
            w.writerow(
                {
                    "id": f"aic-fpm-qwen3-32b-b300-tp{tp}-{kind}-{ctx or dec}",
                    "source": f"{SOURCE}/tp{tp}_ep1_past4096/fpm_metrics_phase.csv",
                    "engine": "vllm",
                    "version": "0.20.1",
                    "model": "qwen3-32b",
                    "gpu": "b300",
                    "tp": tp,
                    "kind": kind,
                    "prefill_tokens": ctx,
                    "decode_seqs": dec,
                    "context_per_seq": context if kind == "decode" else 0,
                    "passes": len(g),
                    "measured_ms": round(statistics.median(float(r["latency_ms"]) for r in g), 3),
                }
            )


if __name__ == "__main__":
    main()
