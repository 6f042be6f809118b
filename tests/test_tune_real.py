"""The tuner against real engines (short: a few trials, short closed-loop benches).

- llama.cpp + Gemma 3 270M: a two-config study completes, its points are runs in the
  store, and the winner beats the default (a KV pool too small for the prompts) on
  goodput, with repetitions and a CI.
- vLLM CPU: a config whose KV space cannot be allocated is recorded infeasible with the
  engine's own log lines, and the study goes on to the next config.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from servetune.engines.testmodel import VLLM_TEST_CONFIG
from servetune.slo import parse_slo
from servetune.store import Store
from servetune.tune.backends import BackendSpec
from servetune.tune.capacity import concurrency_lattice
from servetune.tune.objective import Objective
from servetune.tune.space import parse_space
from servetune.tune.trial import SearchSettings
from servetune.tune.tuner import Tuner, TuneSettings
from servetune.workload.spec import parse_workload

pytestmark = pytest.mark.engine


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
        report=tmp / "report.html",
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
        "fixed": {"threads": 2, "parallel_slots": 4, "quantization": "q4_k_m"},
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
    out = Tuner(s).run()
    assert len(out.ranked) == 2  # the baseline is not run twice
    by_kv = {t.config["kv_cache_tokens"]: t for t in out.ranked}
    default, big = by_kv[512], by_kv[2048]
    assert out.baseline is default and default.status == "no_slo"
    assert any(c["metric"] == "error_rate" for p in default.points for c in p.missed())
    assert out.winner is big and big.status == "ok"
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
    assert out.report_path is not None and out.report_path.exists()


def test_vllm_kv_space_that_cannot_be_allocated_is_infeasible_and_the_study_goes_on(
    vllm_install, llama_test_model, tmp_path
) -> None:
    ram_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    too_big = int(ram_gib * 2)  # the planner's generic 64 GiB host fits it; this box cannot
    base = VLLM_TEST_CONFIG.model_dump(mode="json", exclude_defaults=True)
    base.pop("engine", None)
    space = {"engine": "vllm", "fixed": base, "baseline": {"kv_cache_space_gib": too_big},
             "knobs": {"kv_cache_space_gib": [1]}}  # fmt: skip
    workload = {
        "api": "completions",
        "count": 3,
        "input_tokens": {"dist": "fixed", "value": 32},
        "output_tokens": {"dist": "fixed", "value": 8},
        "arrival": {"kind": "closed", "concurrency": 1},
    }
    slo = {"ttft_ms": {"p95": 20000}, "tpot_ms": {"p95": 5000}}
    s = _settings(tmp_path, space, engine="vllm", model=str(llama_test_model / "config.json"),
                  model_path=str(llama_test_model), workload=workload, slo=slo, max_load=1,
                  repeats=0)  # fmt: skip
    out = Tuner(s).run()
    by_kv = {t.config["kv_cache_space_gib"]: t for t in out.ranked}
    bad, good = by_kv[too_big], by_kv[1]
    assert bad.status == "infeasible"
    assert "less than requested memory for kv" in bad.reason
    assert bad.log_tail  # the engine's own lines
    assert good.status == "ok" and out.winner is good  # the study went on
    with Store.open(str(tmp_path / "real.db")) as st:
        failed = [r for r in st.list_runs(study="real") if r.status == "failed"]
    assert len(failed) == 1 and "engine log" in (failed[0].stop_reason or "")
