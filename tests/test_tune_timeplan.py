"""The real trials' time plan (`tune.timeplan`): on a budget that cannot pay for full
capacity searches, every verified config of the top k is still measured (each within its
share, its capacity then a lower bound, said in the notes), and the finalists' repetitions
still run. The "real" engine here is the simulator behind a real backend's name, so the
plan is exercised without an engine."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from servetune.tune import timeplan
from servetune.tune.space import parse_space
from servetune.tune.tuner import Tuner, TuneSettings
from sim_as_real import SimAsReal, hybrid_settings, serve_real_with


def test_shares_split_what_is_left_after_the_reserve() -> None:
    assert timeplan.reserve_s(1, 3, 10.0) == 30.0
    assert timeplan.reserve_s(2, 1, 10.0) == 0.0  # one repeat has no interval: none kept
    assert timeplan.share_s(120.0, 30.0, 3) == pytest.approx(30.0)
    assert timeplan.share_s(50.0, 30.0, 1) == pytest.approx(20.0)  # the last takes the rest
    assert timeplan.share_s(10.0, 30.0, 2) == 0.0  # overdrawn: one point each, never < 0
    assert timeplan.share_s(None, 30.0, 2) is None  # no budget, no bound
    note = timeplan.cut_note("slots=8", 12.4, 2, 4.0)
    assert "slots=8" in note and "2 load points" in note and "12s" in note
    assert "capacity 4 is a lower bound" in note
    spent = timeplan.cut_note("slots=8", 0.0, 1, 1.0)  # share_s's 0: nothing was left
    assert "1 load point: the budget was spent before its turn" in spent and "0s" not in spent


def _settings(tmp_path: Path, budget_s: float | None) -> TuneSettings:
    space = parse_space({"engine": "vllm", "knobs": {"max_num_seqs": [2, 4, 8, 16, 32]}})
    return hybrid_settings(tmp_path, f"plan-{budget_s}", space, ttft_p95_ms=400, max_load=32,
                           max_probes=6, top_k=3, finalists=1, repeats=2,
                           time_budget_s=budget_s)  # fmt: skip


@pytest.fixture
def sim_as_real(monkeypatch):
    yield from serve_real_with(monkeypatch, SimAsReal)


def test_a_skipped_step_says_the_time_left_or_how_far_the_budget_is_overrun() -> None:
    """A slow host can overrun the budget before the plan's next step: the note says by
    how much, never a negative time left (the main job on a busy AVX2 host printed
    "-258s left")."""
    what = "threads=1 on the real engine"
    left = timeplan.skipped_note(what, 40.0, 63.0)
    assert left == f"time budget: {what} skipped (40s left, a trial takes ~63s)"
    over = timeplan.skipped_note(what, -258.4, 63.0)
    assert "-" not in over.split("(")[1] and "258s over" in over and "~63s" in over


def test_a_spent_budget_still_verifies_the_whole_top_k_then_repeats(
    tmp_path: Path, sim_as_real
) -> None:
    free = Tuner(_settings(tmp_path, None)).run()
    tight = Tuner(_settings(tmp_path, 1e-3)).run()
    for out in (free, tight):
        assert len(out.ranked) == 4  # the baseline and the simulator's top 3, all measured
        assert out.winner is not None and out.winner.ci is not None  # the repetitions ran
        assert out.winner.ci["n"] == 2
    # unbounded, a search probes until the SLO breaks; with the budget spent, each
    # verified config measures its first load point only, and the notes say so per config
    assert all(len(t.points) > 1 for t in free.ranked)
    assert all(len(t.points) == 1 for t in tight.ranked)
    cut = [n for n in tight.notes if "stopped after 1 load point: the budget was spent" in n]
    assert len(cut) == 4 and not any("stopped" in n for n in free.notes)
    assert {t.label for t in tight.ranked} == {t.label for t in free.ranked}


def test_the_baseline_is_repeated_beside_the_finalists(tmp_path: Path, sim_as_real) -> None:
    """One finalist asked for, two configs re-run: the best trial and the baseline, so the
    margin over the default rests on repetitions of both; without finalists, none."""
    knobs = {"max_num_seqs": [2, 4, 8, 16, 32]}
    space = parse_space({"engine": "vllm", "baseline": {"max_num_seqs": 2}, "knobs": knobs})
    out = Tuner(replace(_settings(tmp_path, None), space=space)).run()
    assert out.ranked[0].key != out.baseline.key  # type: ignore[union-attr]
    repeated = [t for t in out.ranked if t.ci is not None]
    assert out.baseline is not None and out.baseline.ci is not None
    assert len(repeated) == 2 and out.ranked[0] in repeated
    assert all(t.ci["n"] == 2 and len(t.reps) == 2 for t in repeated)  # type: ignore[index]
    assert out.winner in repeated
    none = Tuner(replace(_settings(tmp_path, 0.5), finalists=0, repeats=0)).run()
    assert not any(t.ci for t in none.ranked)


def test_a_baseline_ranked_first_is_repeated_beside_the_best_other(
    tmp_path: Path, sim_as_real
) -> None:
    """The baseline ranked first and one finalist asked for: the best other config takes
    the baseline's reserved place, so "keep the default" rests on repetitions of both (the
    idle main job's baseline won on a trial 1% above the runner-up's, then its own
    repetitions' mean fell 16% below that trial, with the runner-up never re-run)."""
    knobs = {"max_num_seqs": [2, 4, 8, 16, 32]}
    space = parse_space({"engine": "vllm", "baseline": {"max_num_seqs": 32}, "knobs": knobs})
    out = Tuner(replace(_settings(tmp_path, None), space=space)).run()
    assert out.baseline is not None and out.ranked[0].key == out.baseline.key
    repeated = [t for t in out.ranked if t.ci is not None]
    assert repeated == out.ranked[:2]  # the baseline and the runner-up, no third
    assert all(t.ci["n"] == 2 and len(t.reps) == 2 for t in repeated)  # type: ignore[index]
    said = "\n".join(out.explanation)
    assert "on both configs' repetitions" in said, said
