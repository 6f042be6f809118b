"""The predicted effect of an action, where the planner can say it without a model file:
KV blocks gained by a smaller KV dtype (the planner's bytes per element), how many
sequences the pool holds, and TTFT once a queue drains (TTFT = queue + the rest)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from servetune.diagnose.evidence import Evidence
from servetune.diagnose.knobs import knobs
from servetune.plan.quant import kv_dtype_bytes


def kv_blocks_factor(cur: str, new: str, dtype: str = "auto") -> float | None:
    """How many times more KV blocks the same pool holds with `new` than with `cur`:
    KV bytes per token are linear in the bytes per element (seed 000 §2.2:
    2 x layers x kv_heads x head_dim x dtype_bytes), so the ratio is the bytes ratio."""
    weights: Any = SimpleNamespace(name="fp32" if dtype in ("fp32", "float32") else dtype)
    b_cur, b_new = kv_dtype_bytes(cur, weights), kv_dtype_bytes(new, weights)
    return b_cur / b_new if b_new else None


def fp8_kv_gain(ev: Evidence) -> tuple[str, float | None]:
    """The KV cache dtype the engine runs (`Evidence.effective`: what it reported at start,
    else its config) and how many times the blocks the engine's 8-bit KV cache (FP8; q8_0
    on llama.cpp) would hold (`kv_blocks_factor`; 1.0 when the pool already runs 8-bit)."""
    cur = ev.effective("kv_cache_dtype", "auto")
    return cur, kv_blocks_factor(cur, knobs(ev.engine).kv8, ev.effective("dtype", "auto"))


def fits_in_kv(ev: Evidence) -> int | None:
    """Sequences the KV pool holds at P99 input + P99 output tokens each (`kv_pool_tokens`:
    the configured pool first). On llama.cpp without kv_unified each slot gets pool / slots,
    so this is also the most slots that leave a request room."""
    pool = ev.kv_pool_tokens
    per = (ev.input_tokens.get("p99") or 0) + (ev.output_tokens.get("p99") or 0)
    if not pool or per <= 0:
        return None
    return max(1, int(pool // per))


def queue_free_ttft_ms(ev: Evidence, queue_share: float) -> float | None:
    """TTFT P50 without its queueing part (the queue share measured on this run)."""
    t = ev.ttft.get("p50")
    return None if t is None else t * (1.0 - queue_share)
