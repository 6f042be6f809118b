"""What each step-time tier is expected to miss by: the median |error| of TTFT and TPOT on
the visible set's published runs of the engine it simulates (vLLM; `servetune validate
--published`), recorded in data/published/expected_error.yaml and checked against a fresh
run by the tests, so every prediction can state its tier's track record."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

from servetune.yamlfile import parse_yaml


@lru_cache(maxsize=1)
def expected_errors() -> dict[str, dict[str, float | str]]:
    """tier -> {ttft_pct, tpot_pct, rows, engine}."""
    path = resources.files("servetune") / "data" / "published" / "expected_error.yaml"
    return dict(parse_yaml(path.read_text("utf-8"))["tiers"])


def expected_error_note(tier: str) -> str:
    """`expected |error| on published vllm GPU runs: TTFT 18%, TPOT 9% (median of 20)`, or
    '' for a tier the set does not cover (the calibrated tier is judged by `validate`)."""
    e = expected_errors().get(tier)
    if not e:
        return ""
    return (
        f"expected |error| on published {e['engine']} GPU runs: TTFT {e['ttft_pct']:.0f}%, "
        f"TPOT {e['tpot_pct']:.0f}% (median of {int(e['rows'])})"
    )
