"""What the scripts that carry NVIDIA AIConfigurator's published vLLM measurements into
src/servetune/data/gpu share: where the tables are in its checkout, and writing one JSON
file per GPU (`gemm_table_from_aic.py`, `moe_table_from_aic.py`,
`attention_table_from_aic.py`, `allreduce_table_from_aic.py`)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

DATA = "aic-core/src/aiconfigurator_core/systems/data"  # per GPU, per op, per engine version
OUT = Path(__file__).resolve().parent.parent / "src/servetune/data/gpu"


def write_tables(
    prefix: str, gpus: dict[str, str], table: Callable[[Path, str, str], dict]
) -> None:
    """`table(checkout, gpu_dir, commit)` for each servetune GPU name -> AIConfigurator
    folder, written to data/gpu/<prefix>_<gpu>.json; the checkout and commit from argv."""
    checkout, commit = Path(sys.argv[1]), sys.argv[2]
    for name, gpu_dir in gpus.items():
        out = OUT / f"{prefix}_{name}.json"
        out.write_text(json.dumps(table(checkout, gpu_dir, commit), separators=(",", ":")))
        print(out, out.stat().st_size, "bytes")
