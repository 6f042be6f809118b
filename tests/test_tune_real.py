"""The tuner against real engines (short: a few trials, short closed-loop benches).

- llama.cpp + Gemma 3 270M: a two-config study completes, its points are runs in the
  store, and the winner beats the default (a KV pool too small for the prompts) on
  goodput, with repetitions and a CI.
- a config whose KV pool cannot be allocated is recorded infeasible with the engine's
  own log lines (read as out of memory), and the study goes on to the next config. On
  llama.cpp, which fails in seconds; vLLM's own out-of-memory launch error is tested at
  the engine layer (tests/test_engine_vllm.py): a vLLM launch that loads the model and
  then fails costs ~30 s, and a study of two vLLM configs twice that.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from servetune.cli.tune_cmd import write_report
from servetune.engines.testmodel import LLAMACPP_TEST_CONFIG
from servetune.measure import BackendSpec
from servetune.paths import cache_root
from servetune.slo import parse_slo
from servetune.status import RunStatus, TrialStatus
from servetune.store import Store
from servetune.tune.capacity import concurrency_lattice
from servetune.tune.objective import Objective
from servetune.tune.space import parse_space
from servetune.tune.trial import SearchSettings
from servetune.tune.tuner import Tuner, TuneSettings
from servetune.workload.spec import parse_workload

# Bound per test, engine starts included: each study here took 80-90 s on a busy 2-core
# host; the CLI runs are bounded at 600 s by `_tune` itself.
pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]


def _settings(
    tmp: Path,
    space: dict,
    *,
    engine: str,
    model: str,
    model_path: str,
    workload: dict,
    slo: dict,
    max_load: int,
    repeats: int,
) -> TuneSettings:
    wl = parse_workload(workload)
    spec = BackendSpec(
        kind="real",
        engine=engine,
        model=model,
        hardware="cpu-host",
        workload=wl.model_dump(mode="json"),
        slo=parse_slo(slo).model_dump(mode="json", exclude_none=True),
        model_path=model_path,
        device="cpu",
        per_user=2,
        request_timeout_s=60,
        launch_timeout_s=240,
    )
    return TuneSettings(
        space=parse_space(space),
        mode="real",
        objective=Objective("goodput"),
        search=SearchSettings("concurrency", concurrency_lattice(max_load), max_probes=4),
        real=spec,
        strategy="grid",
        finalists=1 if repeats else 0,
        repeats=repeats,
        db=str(tmp / "real.db"),
        study="real",
        edge=False,
        verbose=True,
    )


def test_llamacpp_study_winner_beats_the_default(llamacpp_install, gemma_gguf, tmp_path) -> None:
    # The default pool of 512 tokens over 4 slots leaves 256 tokens per request (the
    # server's minimum slot): these prompts do not fit and llama-server refuses them
    # (errors are goodput misses); 2048 gives 512 per slot.
    # A structural difference, so the verdict holds on a busy shared machine too.
    space = {
        "engine": "llamacpp",
        "fixed": {"threads": 1, "parallel_slots": 4, "quantization": "q4_k_m"},
        "baseline": {"kv_cache_tokens": 512},
        "knobs": {"kv_cache_tokens": [512, 2048]},
    }
    workload = {
        "api": "completions",
        "count": 4,
        "input_tokens": {"dist": "uniform", "low": 300, "high": 400},
        "output_tokens": {"dist": "fixed", "value": 12},
        "arrival": {"kind": "closed", "concurrency": 1},
    }
    slo = {"ttft_ms": {"p95": 15000}, "tpot_ms": {"p95": 2000}, "error_rate": 0.05}
    s = _settings(tmp_path, space, engine="llamacpp", model="gemma-3-270m",
                  model_path=str(gemma_gguf), workload=workload, slo=slo, max_load=2,
                  repeats=3)  # fmt: skip
    tuner = Tuner(s)
    out = tuner.run()
    assert len(out.ranked) == 2  # the baseline is not run twice
    by_kv = {t.config["kv_cache_tokens"]: t for t in out.ranked}
    default, big = by_kv[512], by_kv[2048]
    assert out.baseline is default and default.status == TrialStatus.NO_SLO
    assert any(c["metric"] == "error_rate" for p in default.points for c in p.missed())
    assert out.winner is big and big.status == TrialStatus.OK
    best_default = max(p.goodput_req_s or 0.0 for p in default.points)
    assert big.best.goodput_req_s > best_default
    assert "-c 2048" in big.launch_command and "-np 4" in big.launch_command
    ci = big.ci
    assert ci is not None and ci["n"] == 3 and ci["low"] <= ci["mean"] <= ci["high"]
    with Store.open(str(tmp_path / "real.db")) as st:
        runs = st.list_runs(study="real")
        assert all(r.backend == "real" and r.n_records > 0 for r in runs)
        assert sum("rep" in r.tags for r in runs) == 3
        kept = [r for r in runs if r.conclusion == "keep"]
        assert len(kept) == 1 and kept[0].engine_config["kv_cache_tokens"] == 2048
    write_report(tuner.store, out, tmp_path / "report.html")  # what `servetune tune` does
    assert out.report_path is not None and out.report_path.exists()


@pytest.mark.untimed  # its SLO (20 s TTFT) is no bound on this model
def test_kv_that_cannot_be_allocated_is_infeasible_and_the_study_goes_on(
    llamacpp_install, gemma_gguf, tmp_path
) -> None:
    # Gemma 3 270M keeps ~3 KiB of KV per token: the baseline asks for a pool 4x the
    # machine's RAM (the planner's generic 64 GiB host may not object; this box cannot)
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    too_big = 4 * ram // 3072
    base = LLAMACPP_TEST_CONFIG.model_dump(mode="json", exclude_defaults=True)
    base.pop("engine", None)
    space = {"engine": "llamacpp", "fixed": {**base, "parallel_slots": 1},
             "baseline": {"kv_cache_tokens": too_big},
             "knobs": {"kv_cache_tokens": [2048]}}  # fmt: skip
    workload = {
        "api": "completions",
        "count": 3,
        "input_tokens": {"dist": "fixed", "value": 32},
        "output_tokens": {"dist": "fixed", "value": 8},
        "arrival": {"kind": "closed", "concurrency": 1},
    }
    slo = {"ttft_ms": {"p95": 20000}, "tpot_ms": {"p95": 5000}}
    s = _settings(tmp_path, space, engine="llamacpp", model="gemma-3-270m",
                  model_path=str(gemma_gguf), workload=workload, slo=slo, max_load=1,
                  repeats=0)  # fmt: skip
    out = Tuner(s).run()
    by_kv = {t.config["kv_cache_tokens"]: t for t in out.ranked}
    bad, good = by_kv[too_big], by_kv[2048]
    assert bad.status == TrialStatus.INFEASIBLE
    assert "insufficient memory" in bad.reason or "failed to allocate" in bad.reason
    assert bad.log_tail  # the engine's own lines
    assert good.status == TrialStatus.OK and out.winner is good  # the study went on
    with Store.open(str(tmp_path / "real.db")) as st:
        failed = [r for r in st.list_runs(study="real") if r.status == RunStatus.FAILED]
    assert len(failed) == 1 and "engine log" in (failed[0].stop_reason or "")
    # the launch error it came from, as the engine layer read the engine's log: out of
    # memory (also what `servetune engine launch` says, exit code 2)
    tag = failed[0].tune
    assert tag is not None and tag.failure is not None and tag.failure.kind == "oom"


def _private_cache(tmp: Path) -> Path:
    """servetune's cache for one `servetune tune` run: the session's installed engines, the
    model files and the host's measurement shared from the user's cache, the rest (the
    calibration profiles above all, engine logs, detached state) its own. A hybrid study
    calibrates into the cache, and the main job read a profile this suite had fitted on a
    host it kept busy: reused within its stated 19%, it then missed P50 TPOT by 40%. Nor
    may a profile the user's own runs left decide which path this test takes."""
    real, private = cache_root(), tmp / "cache"
    private.mkdir()
    for name in ("engines", "models", "hardware-local.json"):
        if (real / name).exists():
            (private / name).symlink_to(real / name)
    return private


def _tune(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    """`servetune tune` as a user runs it, bounded: a hung engine fails the test."""
    env = {**os.environ, "SERVETUNE_CACHE": str(_private_cache(tmp))}
    return subprocess.run(
        [sys.executable, "-m", "servetune.cli.app", "tune", "--db", str(tmp / "main.db"),
         "-o", str(tmp / "main.html"), *args],
        capture_output=True, text=True, cwd=tmp, timeout=600, env=env,
    )  # fmt: skip


SMALL_SPACE = """engine: llamacpp
fixed: {quantization: q4_k_m, threads: 1}
knobs:
  parallel_slots: [1, 4]
"""
# The preset's completions, fewer and shorter: each point (the SLO probe too) takes about
# a third of the preset's time.
SHORT_WORKLOAD = """api: completions
count: 4
input_tokens: {dist: uniform, low: 32, high: 96}
output_tokens: {dist: fixed, value: 8}
arrival: {kind: closed, concurrency: 1}
"""


def test_main_job_preset_ends_with_a_recommendation(llamacpp_install, gemma_gguf, tmp_path):
    # The built-in default (hybrid, SLO from this host) on 3 configs with short trials.
    (tmp_path / "space.yaml").write_text(SMALL_SPACE)
    (tmp_path / "wl.yaml").write_text(SHORT_WORKLOAD)
    p = _tune(tmp_path, "--space", "space.yaml", "--workload", "wl.yaml", "--study", "main",
              "--top-k", "1", "--max-load", "2", "--max-probes", "2", "--repeats", "2",
              "--time-budget", "90")  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    assert lines[0].startswith("SLO derived from this host: P95 TTFT <= 4 x probe")
    head = next(i for i, x in enumerate(lines) if x.startswith(("== winner: ", "== NO CONFIG")))
    assert lines[head + 1] == "launch command:"
    assert "llama-server" in lines[head + 2] and "-t 1" in lines[head + 2]
    with Store.open(str(tmp_path / "main.db")) as st:
        summary = st.study_meta("main")["summary"]
        runs = st.list_runs(study="main")
    derived = summary["slo_derived"]
    assert derived["backend"] == "real" and derived["samples"] == 4
    assert summary["slo"]["ttft_ms"]["p95"] == round(4 * derived["probe_ttft_p95_ms"])
    w = summary["winner"]
    assert w["launch_command"] in p.stdout
    blocks = [r for r in runs if "slo" in r.tags]  # the probe's two blocks
    assert sorted(b.id for b in blocks) == sorted(derived["run_ids"]) and len(blocks) == 2
    assert all(b.backend == "real" and b.n_records == 4 for b in blocks)
    real = [r for r in runs if r.backend == "real" and "probe" in r.tags]
    assert real and all(r.status == RunStatus.COMPLETED and r.n_records > 0 for r in real)
    concluded = [r for r in runs if r.conclusion]
    assert len(concluded) == 1 and concluded[0].tune.key == w["key"]
    assert concluded[0].conclusion == ("keep" if summary["slo_met"] else "next")
    assert (tmp_path / "main.html").exists()
    # calibrated into the run's own cache, not the user's
    assert list((tmp_path / "cache" / "calibration").glob("llamacpp-*.profile.json"))


def test_real_engine_slo_nothing_meets_is_a_best_effort(llamacpp_install, gemma_gguf, tmp_path):
    (tmp_path / "space.yaml").write_text(SMALL_SPACE.replace("[1, 4]", "[2]"))
    (tmp_path / "slo.yaml").write_text("ttft_ms: {p95: 1}\n")
    (tmp_path / "wl.yaml").write_text(SHORT_WORKLOAD)
    p = _tune(tmp_path, "--backend", "real", "--space", "space.yaml", "--slo", "slo.yaml",
              "--workload", "wl.yaml", "--study", "imp", "--max-load", "1", "--repeats", "0",
              "--json")  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout)
    assert out["slo_met"] is False and out["slo_derived"] is None  # --slo is used as given
    assert out["shortfall"]["binding"]["metric"] == "ttft_ms"
    assert out["shortfall"]["binding"]["ratio"] > 1
    assert "llama-server" in out["winner"]["launch_command"]
    with Store.open(str(tmp_path / "main.db")) as st:
        kept = [r for r in st.list_runs(study="imp") if r.conclusion]
    assert [r.conclusion for r in kept] == ["next"]
    assert kept[0].id == out["shortfall"]["run_id"]
