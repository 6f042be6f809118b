"""`validate --published`'s median / mean TTFT of closed loops: public vLLM runs that print
both, loaded with their provenance, set per load band beside the simulated loops' own."""

from __future__ import annotations

import pytest

from servetune.errors import InputError
from servetune.validate import published as pub
from servetune.validate import spread as sp

HEADER = (
    "id,source_url,source_title,engine_version,accelerator,model,tp,isl,osl,concurrency,"
    "requests,ttft_mean_ms,ttft_median_ms,note"
)


def test_every_public_row_is_a_loop_with_its_source():
    rows = sp.load_spread()
    assert len(rows) >= 15
    assert len({r.id for r in rows}) == len(rows)
    for r in rows:
        assert r.source_title and r.accelerator and r.model
        assert r.requests > r.concurrency  # a loop, not one burst
        assert 0.1 < r.ratio < 2
    bands = sp.published_spread(rows)
    assert bands["all"].runs == len(rows)
    # every band past 8 users has runs to compare with
    assert all(bands[b].runs >= 3 for b in ("9-32 users", "33-128 users", "129+ users"))


@pytest.mark.parametrize(
    ("row", "field", "words"),
    [
        ("a,,t,,h200,m,1,1024,128,32,32,900,500,", ".requests", "one burst"),
        ("a,,t,,h200,m,1,1024,128,32,320,900,,", ".ttft_median_ms", "missing"),
        ("a,,t,,h200,m,1,1024,128,32,320,900,-5,", ".ttft_median_ms", "greater than 0"),
    ],
)
def test_a_bad_row_is_one_line_naming_its_line_and_field(row, field, words):
    with pytest.raises(InputError) as exc:
        sp.parse_spread(f"{HEADER}\n{row}\n", "x.csv")
    msg = str(exc.value)
    assert f"x.csv line 2{field}" in msg and words in msg and "\n" not in msg


def test_a_repeated_id_is_refused():
    row = "a,,t,,h200,m,1,1024,128,32,320,900,500,"
    with pytest.raises(InputError) as exc:
        sp.parse_spread(f"{HEADER}\n{row}\n{row}\n", "x.csv")
    assert "x.csv line 3.id" in str(exc.value)


def test_ratios_are_summed_up_per_load_band():
    bands = sp.by_band([(4, 0.9, 10), (16, 0.5, 2), (20, 0.7, 4), (200, 0.2, 5)])
    assert list(bands) == ["all", "1-8 users", "9-32 users", "33-128 users", "129+ users"]
    assert bands["all"] == sp.Spread(4, pytest.approx(0.6), 0.2, 0.9, 4.5)
    assert bands["9-32 users"] == sp.Spread(2, pytest.approx(0.6), 0.5, 0.7, 3)
    assert bands["33-128 users"] == sp.Spread(0, None, None, None, None)


def test_the_simulated_side_reads_loops_only_and_each_tiers_own_spread():
    """The issue's Qwen3-32B TP2 loop of 8 users: the roofline tier keeps it in lock-step
    (every TTFT the same, median = mean); the gpu tier de-synchronises it, so most prompts
    prefill alone and the median sits under the mean. A burst (GPUStack's all-at-once run)
    is no loop and is left out."""
    runs = {r.id: r for r in pub.load_runs()}
    loop, burst = runs["issue15-qwen3-32b-tp2-c8"], runs["gpustack-qwen3-32b-h100-2k"]
    got = {t: sp.simulated_spread([loop, burst], t)["1-8 users"] for t in pub.TIERS}
    assert got["roofline"].runs == 1 and got["roofline"].median == pytest.approx(1.0)
    assert got["roofline"].rounds == 10  # the held-out measure's 10 x concurrency requests
    rep = pub.replayed(loop, "gpu")
    assert got["gpu"].median == pytest.approx(rep.ttft_p50 / rep.ttft_mean)
    assert got["gpu"].median < 0.9
    assert sp.simulated_spread([burst], "gpu")["all"].runs == 0


def test_the_report_says_what_an_exact_median_reads_under_the_held_out_measure():
    public = sp.by_band([(16, 0.6, 5), (16, 0.8, 5), (64, 0.5, 2)])
    text = sp.format_spread(public, {"gpu": sp.by_band([(16, 0.7, 10)])})
    lines = {line.split("  ")[0]: line for line in text.splitlines()}
    assert lines["9-32 users"].rstrip().endswith("-30%")  # median 0.7 - 1
    assert lines["33-128 users"].rstrip().endswith("-50%")
    assert "0.70  0.60..0.80     5.0" in lines["9-32 users"]
    assert lines["1-8 users"].rstrip().endswith("-")  # no public runs: no figure
