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
    """`expected |error| on published vllm GPU runs: TTFT 20%, TPOT 11% as means (median of
    423); the TTFT p50 reads 41% under a measured mean ...`, or '' for a tier the set does
    not cover (the calibrated tier is judged by `validate`). The figures are means against
    measured means; the p50 offset says how far the simulated median sits from those
    means (`validate --published --measure median`), so a p50 is not read as that close."""
    e = expected_errors().get(tier)
    if not e:
        return ""
    note = (
        f"expected |error| on published {e['engine']} GPU runs: TTFT {e['ttft_pct']:.0f}%, "
        f"TPOT {e['tpot_pct']:.0f}% as means (median of {int(e['rows'])})"
    )
    p50 = e.get("ttft_p50_bias")
    if p50 is not None:
        side = "under" if float(p50) < 0 else "over"
        note += (
            f"; the TTFT p50 reads {abs(float(p50)):.0f}% {side} a measured mean "
            "(it leaves out the first round's burst)"
        )
    return note
