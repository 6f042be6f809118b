"""`servetune models` and `servetune gpus`: what the built-in catalogs hold.

One row per entry with its full name: on a terminal narrower than the table the columns
are printed in blocks that each repeat the name (`cli.render.print_tables`); piped, the
rows stay whole lines, so `servetune models | grep llama` finds them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer


def register(app: typer.Typer) -> None:
    app.command("models", help="List the built-in model catalog.")(models)
    app.command("gpus", help="List the built-in accelerator catalog (and --hardware-file).")(gpus)


def models(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    from servetune.model.catalog import catalog_names, get_model, serving_reference

    rows = []
    for name in catalog_names():
        m = get_model(name)
        rows.append(
            {
                "name": name,
                "hf_repo": serving_reference(name),
                "architecture": m.architecture,
                "params_total": m.params_total,
                "params_active": m.params_active,
                "layers": m.num_layers,
                "kv_heads": m.num_kv_heads,
                "head_dim": m.head_dim,
                "kv_cache": _kv_layout(m),
                "max_position_embeddings": m.max_position_embeddings,
                "attention": _attention(m),
            }
        )
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    from servetune.cli.render import print_tables

    table = _catalog_table(
        "servetune model catalog",
        ("params", "active", "layers", "KV cache / layer", "context"),
        ("attention", "HF repo"),
    )
    for r in rows:
        table.add_row(
            r["name"],
            f"{r['params_total'] / 1e9:.2f}B",
            f"{r['params_active'] / 1e9:.2f}B",
            str(r["layers"]),
            r["kv_cache"],
            f"{r['max_position_embeddings']:,}",
            r["attention"],
            r["hf_repo"] or "",
        )
    print_tables(table)


def _attention(m: Any) -> str:
    """MLA, full, sliding (every layer windowed: Mistral v0.1, Phi-3) or sliding+full
    (Gemma 2/3 and GPT-OSS interleave)."""
    if m.mla:
        return "MLA"
    if not m.sliding_window_layers:
        return "full"
    return "sliding" if m.sliding_window_layers >= m.num_layers else "sliding+full"


def _kv_layout(m: Any) -> str:
    """What one token caches per layer (plan.kv): K and V heads x head_dim, or MLA's
    compressed latent + shared RoPE key (kv_lora_rank + qk_rope_head_dim), not its heads."""
    if m.mla:
        return f"latent {m.mla.kv_lora_rank} + rope {m.mla.qk_rope_head_dim}"
    return f"{m.num_kv_heads} x {m.head_dim}"


def gpus(
    hardware_file: Path | None = typer.Option(None, "--hardware-file"),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    from servetune.hardware.catalog import get_hardware, hardware_names

    specs = [get_hardware(n, hardware_file) for n in hardware_names(hardware_file)]
    if as_json:
        sys.stdout.write(json.dumps([s.model_dump() for s in specs], indent=2) + "\n")
        return
    from servetune.cli.render import print_tables

    table = _catalog_table(
        "servetune accelerator catalog (dense TFLOP/s)",
        ("memory GiB", "GB/s", "bf16", "fp8", "int8", "per node"),
        ("interconnect GB/s",),
    )
    for s in specs:
        tf = s.tflops
        table.add_row(
            s.name,
            f"{s.memory_gib:g}",
            f"{s.memory_bandwidth_gbs:,.0f}",
            f"{tf.get('bf16', tf.get('fp16', 0)):g}",
            f"{tf.get('fp8', 0):g}",
            f"{tf.get('int8', 0):g}",
            str(s.devices_per_node),
            f"{s.interconnect} {s.interconnect_gbs:g}",
        )
    print_tables(table)


def _catalog_table(title: str, numbers: tuple[str, ...], texts: tuple[str, ...]) -> Any:
    """A catalog table: the entry's name (never broken), then number columns
    (right-justified) and text columns; a squeezed cell folds, it is never cut."""
    from rich.table import Table

    table = Table(title=title)
    table.add_column("name", no_wrap=True)
    for col in numbers:
        table.add_column(col, justify="right", overflow="fold")
    for col in texts:
        table.add_column(col, overflow="fold")
    return table
