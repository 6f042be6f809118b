"""What each step-time tier is expected to miss by: the median |error| of TTFT and TPOT on
the visible set's published runs of the engine it simulates (vLLM; `servetune validate
--published`), over all of them and per load band, recorded in
data/published/expected_error.yaml and checked against a fresh run by the tests, so every
prediction can state its tier's track record at its own load."""

from __future__ import annotations

import bisect
from functools import lru_cache
from importlib import resources
from typing import Any

from servetune.yamlfile import parse_yaml

# Upper ends of the load bands, in users of a closed loop: at 8 users the first round's
# burst (every user's first prompt at once) is one step or two; by 128 it is most of a
# 10-round run's mean TTFT (docs/fidelity-gpu.md, "per load band").
LOAD_BANDS = (8, 32, 128)


def band_labels() -> list[str]:
    """The load bands' names, lightest first: "1-8 users" ... "129+ users"."""
    lows = (1, *(high + 1 for high in LOAD_BANDS))
    spans = [f"{low}-{high} users" for low, high in zip(lows, LOAD_BANDS, strict=False)]
    return [*spans, f"{lows[-1]}+ users"]


def band_of(users: int) -> str:
    """The load band a closed loop of `users` falls in."""
    return band_labels()[bisect.bisect_left(LOAD_BANDS, users)]


def band_users(engine: str | None, kind: str | None, concurrency: int | None) -> int | None:
    """The users whose load band a run quotes: a vLLM closed loop's (the bands are vLLM's
    runs), None for any other run, which quotes the all-runs figure."""
    return concurrency if engine == "vllm" and kind == "closed" else None


@lru_cache(maxsize=1)
def expected_errors() -> dict[str, dict[str, Any]]:
    """tier -> {ttft_pct, tpot_pct, ttft_p50_bias, rows, engine, bands: {band: {...}}}."""
    path = resources.files("servetune") / "data" / "published" / "expected_error.yaml"
    return dict(parse_yaml(path.read_text("utf-8"))["tiers"])


def expected_error_note(tier: str, users: int | None = None, engine: str | None = None) -> str:
    """`expected |error| on published vllm GPU runs: TTFT 20%, TPOT 11% as means (median of
    451); the TTFT p50 reads 41% under a measured mean ...`, or '' for a tier the set does
    not cover (the calibrated tier is judged by `validate`). `engine`: an engine whose own
    runs the file records (`engines`: SGLang) quotes those. With `users` (a closed loop),
    the figures of its load band ("... runs at 33-128 users: TTFT 25%, ..."), since the
    error grows with load. The figures are means against measured means; the p50 offset
    says how far the simulated median sits from those means (`validate --published
    --measure median`), so a p50 is not read as that close."""
    e = expected_errors().get(tier)
    if not e:
        return ""
    # another engine's own runs (SGLang's), not vLLM's: its predictions had quoted vLLM's
    # 20%/11% where its own rows read 58%/20%
    if engine is not None and engine != e["engine"] and engine in e.get("engines", {}):
        e, users = e["engines"][engine] | {"engine": engine}, None
    where = ""
    band = band_of(users) if users is not None else None
    if band in e.get("bands", {}):
        where = f" at {band}"
        e = e["bands"][band] | {"engine": e["engine"]}
    note = (
        f"expected |error| on published {e['engine']} GPU runs{where}: "
        f"TTFT {e['ttft_pct']:.0f}%, TPOT {e['tpot_pct']:.0f}% as means "
        f"(median of {int(e['rows'])})"
    )
    p50 = e.get("ttft_p50_bias")
    if p50 is not None:
        side = "under" if float(p50) < 0 else "over"
        note += (
            f"; the TTFT p50 reads {abs(float(p50)):.0f}% {side} a measured mean "
            "(it leaves out the first round's burst)"
        )
    return note
