"""`servetune quality` without an engine: the figures, the noise bound, the §2 rule, the
corpus, random-weight refusal, bad input, and the store/`runs show` round trip."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from cli_run import run_cli
from servetune.accept.static import quality as accept_quality
from servetune.errors import InputError
from servetune.quality.corpus import load_corpus
from servetune.quality.endpoint import random_weights
from servetune.quality.scoring import (
    agreement,
    first_word,
    mean_ci,
    pooled_perplexity,
    ppl_ratio_ci,
)
from servetune.quality.stored import perf
from servetune.quality.verdict import FAIL, PASS, UNMEASURED, Perf, judge
from servetune.store import Store
from synthetic_runs import synthetic_run


def _passages(seed: int, shift: float = 0.0, n: int = 12) -> list[list[float]]:
    rng = np.random.default_rng(seed)
    return [list(-rng.gamma(2.0, 1.5, size=30) - shift) for _ in range(n)]


def test_perplexity_is_exp_of_mean_nll() -> None:
    assert pooled_perplexity([[-1.0, -1.0], [-1.0]]) == pytest.approx(math.e)
    assert pooled_perplexity([[math.log(0.5)] * 4]) == pytest.approx(2.0)


def test_the_same_model_against_itself_is_inside_the_noise_bound() -> None:
    base = _passages(1)
    r = ppl_ratio_ci(base, base)
    assert r.value == pytest.approx(1.0) and not r.excludes(1.0)


def test_a_worse_model_is_a_measurable_regression_and_noise_is_not() -> None:
    base = _passages(1)
    worse = [[x - 0.2 for x in p] for p in base]  # every token 0.2 nats less likely
    r = ppl_ratio_ci(base, worse)
    assert r.value == pytest.approx(math.exp(0.2)) and r.low > 1.0
    # Per-token noise with zero mean: the interval covers 1.
    rng = np.random.default_rng(5)
    noisy = [[x + rng.normal(0, 0.3) for x in p] for p in base]
    n = ppl_ratio_ci(base, noisy)
    assert n.low < 1.0 < n.high and n.high - n.low < 0.2


def test_agreement_and_exact_match_extraction() -> None:
    assert agreement([1, 2, 3, 4], [1, 2, 3, 4]) == 1.0
    assert agreement([1, 2, 3, 4], [1, 2, 9, 4]) == 0.75
    assert agreement([1, 2, 3, 4], [1, 2]) == 0.5  # a shorter answer misses the rest
    ci = mean_ci([1.0, 0.5, 0.75, 1.0])
    assert ci.low <= ci.value <= ci.high and ci.value == pytest.approx(0.8125)
    assert first_word(" Tokyo.\nQ: next") == "Tokyo" and first_word("  ") == ""


def test_section_2_rule() -> None:
    base = Perf(output_tok_s=100.0, p99_e2e_ms=1000.0, error_rate=0.01, gpu_count=1)
    good = Perf(output_tok_s=125.0, p99_e2e_ms=980.0, error_rate=0.01, gpu_count=1)
    v = judge(0.02, 0.05, base, good)
    assert v.verdict == "accepted" and all(c.status == PASS for c in v.checks)
    assert judge(0.08, 0.05, base, good).verdict == "rejected"  # quality over the threshold
    small = Perf(output_tok_s=110.0, p99_e2e_ms=980.0, error_rate=0.01, gpu_count=1)
    v = judge(0.02, 0.05, base, small)  # +10% < the seed's 15%
    assert v.verdict == "rejected" and {c.name for c in v.checks if c.status == FAIL} == {
        "throughput"
    }
    slow = Perf(output_tok_s=125.0, p99_e2e_ms=1100.0, error_rate=0.03, gpu_count=1)
    failed = {c.name for c in judge(0.0, 0.05, base, slow).checks if c.status == FAIL}
    assert failed == {"p99", "errors"}
    # Twice the GPUs for 25% more tokens: the cost per token rises.
    two = Perf(output_tok_s=125.0, p99_e2e_ms=980.0, error_rate=0.01, gpu_count=2)
    assert {c.name for c in judge(0.0, 0.05, base, two).checks if c.status == FAIL} == {"cost"}
    v = judge(0.02, 0.05, None, None)
    assert v.verdict == "incomplete" and v.quality == PASS
    assert [c.status for c in v.checks[1:]] == [UNMEASURED] * 4


def test_a_baseline_that_served_nothing_was_measured_at_zero(tmp_path: Path) -> None:
    """Every baseline request failed: 0 tok/s is a measurement, not a missing figure, but
    nothing to compare a candidate with: the checks stay unjudged (a dead baseline must not
    accept a candidate), and say why. A candidate that served nothing fails."""
    with Store.open(str(tmp_path / "q.db")) as s:
        dead, m1 = synthetic_run(4, seed=1, n_requests=30, error_rate=1.0)
        live, m2 = synthetic_run(4, seed=2, n_requests=30)
        s.save_result(dead, m1)
        s.save_result(live, m2)
        b, c = perf(s, dead.id, "--baseline-run"), perf(s, live.id, "--candidate-run")
    assert b.output_tok_s == 0 and c.output_tok_s > 0
    checks = {ch.name: ch for ch in judge(0.01, 0.05, b, c).checks}
    assert checks["throughput"].status == UNMEASURED == checks["cost"].status
    assert checks["throughput"].evidence.startswith("output tok/s 0 -> ")
    assert "no tokens served" in checks["cost"].evidence
    assert all(
        "baseline run served no tokens" in checks[k].evidence for k in ("throughput", "cost")
    )
    # the other way round the candidate served nothing: measured, and it fails
    checks = {ch.name: ch for ch in judge(0.01, 0.05, c, b).checks}
    assert checks["throughput"].status == FAIL and checks["cost"].status == FAIL
    assert "missing" not in checks["throughput"].evidence + checks["cost"].evidence


def test_builtin_corpus_names_its_sources() -> None:
    c = load_corpus()
    assert len(c.passages) >= 10 and len(c.tasks) >= 8
    assert all(p.source and len(p.text.split()) >= 30 for p in c.passages)
    assert len({p.id for p in c.passages}) == len(c.passages)
    assert c.limit(3, 2).passages == c.passages[:3]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("passages:\n  - text: no id here\n", "(no 'id')"),
        ("passages:\n  - abc\n", "(an entry is no mapping)"),
        # an empty file leaked "'NoneType' object has no attribute 'get'"; `foo: 1` read as
        # a corpus of 0 passages
        ("", "holds no mapping of passages and tasks"),
        ("foo: 1\n", "unknown key 'foo'"),
    ],
)
def test_bad_corpus_is_one_line(tmp_path: Path, text: str, problem: str) -> None:
    bad = tmp_path / "c.yaml"
    bad.write_text(text)
    with pytest.raises(InputError, match="--corpus") as e:
        load_corpus(bad)
    assert problem in e.value.problem and "NoneType" not in e.value.one_line(), e.value


def test_random_weights_are_refused(llama_test_model: Path, gemma_gguf: Path) -> None:
    """The generated test Llama (served with --load-format dummy) has no weight files."""
    why = random_weights(str(llama_test_model))
    assert why and "random weights" in why
    assert random_weights(str(gemma_gguf)) is None
    assert random_weights("meta-llama/Llama-3.1-8B") is None  # a hub name: real weights


def test_unreachable_url_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(
        capsys, "quality", "--baseline", "http://127.0.0.1:9", "--candidate", "http://127.0.0.1:9"
    )
    assert code == 2 and err.count("\n") == 1 and "--baseline" in err and "unreachable" in err
    code, _, err = run_cli(capsys, "quality", "--baseline", "nohost", "--candidate", "x")
    assert code == 2 and "not a URL" in err


def test_result_goes_to_the_run_and_runs_show(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "q.db")
    with Store.open(db) as s:
        slow, m1 = synthetic_run(4, seed=1, n_requests=60, t0_ms=12.0)
        fast, m2 = synthetic_run(4, seed=1, n_requests=60, t0_ms=8.0)
        slow.id = m1.id = "bench-bf16"
        fast.id = m2.id = "bench-q4"
        s.save_result(slow, m1)
        s.save_result(fast, m2)
        b, c = perf(s, "bench-bf16", "--baseline-run"), perf(s, "bench-q4", "--candidate-run")
        assert c.output_tok_s > 1.15 * b.output_tok_s  # 12 ms -> 8 ms per token
        v = judge(0.01, 0.05, b, c)
        s.set_quality(
            "bench-q4", {**v.to_json(), "quality_check": v.quality, "perplexity_ratio": 1.01}
        )
    code, out, _ = run_cli(capsys, "runs", "show", "bench-q4", "--db", db)
    assert code == 0 and "perplexity_ratio" in out and "1.01" in out
    code, out, _ = run_cli(capsys, "runs", "show", "bench-q4", "--db", db, "--json")
    assert json.loads(out)["quality"]["verdict"] == v.verdict
    code, out, _ = run_cli(capsys, "runs", "compare", "bench-bf16", "bench-q4", "--db", db)
    assert code == 0 and "Quality" in out and "perplexity_ratio" in out
    code, out, _ = run_cli(capsys, "runs", "compare", "bench-bf16,bench-q4", "--db", db, "--json")
    assert list(json.loads(out)["quality"]) == ["bench-q4"]
    with Store.open(db) as s:
        finding = accept_quality([s.get("bench-q4")])
    assert finding.status == "pass" and "bench-q4" in " ".join(finding.evidence)


def test_bad_runs_and_threshold_fail_before_any_scoring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "empty.db")
    Store.open(db).close()
    urls = ("--baseline", "http://127.0.0.1:9", "--candidate", "http://127.0.0.1:9")
    code, _, err = run_cli(capsys, "quality", *urls, "--candidate-run", "nope", "--db", db)
    assert code == 2 and "nope" in err and "unreachable" not in err
    code, _, err = run_cli(capsys, "quality", *urls, "--baseline-run", "x")
    assert code == 2 and "--candidate-run" in err
    code, _, err = run_cli(capsys, "quality", *urls, "--threshold", "-1")
    assert code == 2 and "--threshold" in err


def test_runs_at_other_loads_are_refused_before_any_scoring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same build at twice the users shows more throughput: that is the load's, so
    §2's throughput check needs both runs at one load (and one workload)."""
    db = str(tmp_path / "q.db")
    with Store.open(db) as s:
        for conc, run_id in ((1, "bench-c1"), (2, "bench-c2"), (2, "bench-c2b")):
            res, meta = synthetic_run(conc, seed=1, n_requests=20)
            res.id = meta.id = run_id
            s.save_result(res, meta)
    urls = ("--baseline", "http://127.0.0.1:9", "--candidate", "http://127.0.0.1:9")
    runs = ("--baseline-run", "bench-c1", "--candidate-run", "bench-c2", "--db", db)
    code, _, err = run_cli(capsys, "quality", *urls, *runs)
    assert code == 2 and err.count("\n") == 1, err
    assert "--candidate-run: measured at c=2, the baseline run at c=1" in err
    itself = ("--baseline-run", "bench-c2", "--candidate-run", "bench-c2", "--db", db)
    code, _, err = run_cli(capsys, "quality", *urls, *itself)  # one build against itself
    assert code == 2 and "--candidate-run: is the baseline run itself (bench-c2)" in err, err
    same = ("--baseline-run", "bench-c2", "--candidate-run", "bench-c2b", "--db", db)
    code, _, err = run_cli(capsys, "quality", *urls, *same)
    assert code == 2 and "unreachable" in err  # comparable runs: on to the endpoints
    for gain in ("-0.9", "nan"):
        code, _, err = run_cli(capsys, "quality", *urls, "--min-gain", gain)
        assert code == 2 and err.startswith("error: --min-gain"), err


def test_result_table_judges_against_the_measured_noise_floor() -> None:
    from servetune.quality.endpoint import Endpoint
    from servetune.quality.run import QualityResult, Scores, Settings

    corpus = load_corpus().limit(12, 2)
    base_lp = _passages(2)
    greedy = [[1, 2, 3, 4]] * 12
    base = Scores(base_lp, greedy, ["Tokyo", "Rome"])
    worse = Scores([[x - 0.1 for x in p] for p in base_lp], [[1, 2, 9, 9]] * 12, ["Tokyo", "x"])
    rng = np.random.default_rng(3)
    jitter = Scores([[x + rng.normal(0, 0.05) for x in p] for p in base_lp], greedy, [])
    ep = Endpoint("http://a:1", "llamacpp", "m", "m.gguf")
    r = QualityResult(ep, ep, corpus, base, worse, Settings(threshold=0.2), again=jitter)
    t = r.table()
    assert t["regression_measurable"] and t["perplexity_ratio"] == pytest.approx(
        math.exp(0.1), rel=1e-3
    )
    assert t["greedy_agreement"] == 0.5 and t["exact_match_candidate"] == "1/2"
    lo, hi = t["noise_floor_ratio_ci95"]
    assert lo < 1.0 < hi and t["perplexity_ratio_ci95"][0] > hi
    # ppl +10.5% is inside a 20% business threshold; no stored runs: incomplete.
    assert t["quality_check"] == "pass" and t["verdict"] == "incomplete"
    same = QualityResult(ep, ep, corpus, base, base, Settings(), again=jitter).table()
    assert not same["regression_measurable"] and same["perplexity_ratio"] == 1.0
    ep.close()
