"""A study always ends with an answer (simulator backend; the real engine's end-to-end
runs are in test_tune_real.py):

- an SLO no config meets gives the closest config as a best effort (every check as value
  vs target, the binding one, its launch command, a `next` conclusion), exit 0;
- nothing measurable at all (every config skipped) is the one error, exit 2;
- an SLO derived from the host: k x an idle probe of the baseline, stored as a run of the
  study, and the same SLO when the study resumes;
- a start that timed out is tried once more before the config is infeasible.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from servetune.engines.config import EngineConfig
from servetune.measure import BackendSpec
from servetune.measure.backends import SimBackend
from servetune.measure.result import Infeasible, PointResult
from servetune.slo import HostRule, derive_slo, parse_slo
from servetune.status import TrialStatus
from servetune.store import Store
from servetune.tune import executors
from servetune.tune.capacity import concurrency_lattice
from servetune.tune.hostslo import from_probe, slowed_since
from servetune.tune.objective import Objective
from servetune.tune.shortfall import closest
from servetune.tune.study import Recorder
from servetune.tune.trial import SearchSettings, TrialResult, run_trial
from servetune.tune.tuner import NothingMeasured, Tuner
from servetune.workload.spec import parse_workload
from test_tune_sim import sim_settings

SPACE = {"engine": "vllm", "knobs": {"max_num_seqs": [16, 64]}}
IMPOSSIBLE = {"ttft_ms": {"p95": 1}, "tpot_ms": {"p95": 1000}}


def test_an_impossible_slo_gives_the_closest_config_as_a_best_effort(tmp_path: Path) -> None:
    s = sim_settings(tmp_path, SPACE, strategy="grid", slo=IMPOSSIBLE, study="imp")
    out = Tuner(s).run()
    assert not out.slo_met and out.winner is not None
    assert all(t.status == TrialStatus.NO_SLO for t in out.ranked)
    # the winner is the config whose worst check is the smallest multiple of its target
    assert out.winner is closest(out.ranked)[0][0]
    # (the SLO's own checks: the steady-state ones repeat its targets over half a window)
    worst = {t.key: min(max(c["value"] / c["target"] for c in p.missed()
                            if c["metric"] != "steady_state") for p in t.points)
             for t in out.ranked}  # fmt: skip
    assert worst[out.winner.key] == min(worst.values())
    sf = out.shortfall
    assert sf is not None and sf.binding is not None
    assert (sf.binding["metric"], sf.binding["stat"]) == ("ttft_ms", "p95")
    assert sf.binding["value"] > 1 and sf.binding["ratio"] == pytest.approx(sf.binding["value"])
    assert sf.worst == pytest.approx(worst[out.winner.key])
    tpot = next(c for c in sf.checks if c["metric"] == "tpot_ms")
    assert tpot["ok"] and tpot["ratio"] < 1  # a met check is listed with its ratio too
    assert out.explanation[1].startswith("binding SLO: P95 TTFT")
    assert "vllm.entrypoints.openai.api_server" in out.winner.launch_command
    with Store.open(str(tmp_path / "tune.db")) as st:
        concluded = [r for r in st.list_runs(study="imp") if r.conclusion]
        assert [r.conclusion for r in concluded] == ["next"]
        assert concluded[0].tune.key == out.winner.key
        assert "no config met the SLO" in concluded[0].conclusion_note
        summary = st.study_meta("imp")["summary"]
    assert summary["slo_met"] is False and summary["shortfall"]["binding"]["metric"] == "ttft_ms"


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "servetune.cli.app", "tune", "--backend", "sim", "--model",
         "llama-3.1-8b", "--gpu", "h100-sxm", "--trials", "3", "--db", str(cwd / "x.db"),
         "-o", str(cwd / "r.html"), *args],
        capture_output=True, text=True, cwd=cwd, timeout=300,
    )  # fmt: skip


def test_cli_best_effort_is_exit_0_with_headline_and_launch_command(tmp_path: Path) -> None:
    (tmp_path / "slo.yaml").write_text("ttft_ms: {p95: 1}\n")
    p = _cli("--slo", "slo.yaml", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    head = lines.index(next(x for x in lines if x.startswith("== NO CONFIG MEETS THE SLO")))
    assert lines[head].startswith("== NO CONFIG MEETS THE SLO - best effort: max_num_seqs=")
    assert lines[head + 1] == "launch command:"
    assert "vllm.entrypoints.openai.api_server" in lines[head + 2]
    # the binding check is a TTFT one (the whole run's, or its steady-state later half)
    assert any(
        x.startswith("  - binding SLO: ") and "P95 TTFT" in x and "x the target" in x for x in lines
    )
    # a ratio is how far a check missed: a met check (the steady-state rule's achieved share,
    # a flat queue) says "met", never a ratio that reads like a miss ("0.07x the target")
    first = lines.index("how far it missed (value vs target at its closest load):") + 2
    missed = lines[first : lines.index(next(x for x in lines if "- bottleneck:" in x))]
    for x in missed:
        met = " <= " in x or " >= " in x
        assert x.endswith("(met)") if met else "x the target" in x, x
    assert any(x.endswith("(met)") for x in missed)
    assert not any("-0.000" in x for x in lines)
    j = _cli("--slo", "slo.yaml", "--json", cwd=tmp_path)
    assert j.returncode == 0, j.stderr
    out = json.loads(j.stdout)
    assert out["slo_met"] is False and out["winner"]["status"] == "no_slo"
    assert out["slo"] == {"ttft_ms": {"p95": 1.0}}
    assert out["shortfall"]["binding"]["ratio"] > 1
    assert Path(out["report"]).exists()  # the best effort's runs are reported too


def test_nothing_measurable_is_the_one_error(tmp_path: Path) -> None:
    # Llama-3.1-70B bf16 (141 GB of weights) on one L4: every config skipped by the planner.
    s = sim_settings(tmp_path, SPACE, strategy="grid", model="llama-3.1-70b", gpu="l4")
    with pytest.raises(NothingMeasured) as err:
        Tuner(s).run()
    assert err.value.exit_code == 2
    assert "no config could be measured (3 skipped or infeasible" in err.value.one_line()


def test_derive_slo_multiplies_the_probe_and_keeps_the_rest() -> None:
    base = parse_slo({"ttft_ms": {"p95": 2000, "p99": 3000}, "tpot_ms": {"p95": 150},
                      "error_rate": 0.05, "goodput": {"ttft_ms": 900, "e2e_ms": 9000}})  # fmt: skip
    got = derive_slo(base, HostRule(ttft_x=4, tpot_x=3), 412.4, 61.2)
    assert got.ttft_ms.items() == [("p95", 1650.0)]  # 4 x 412.4 to the whole ms
    assert got.tpot_ms.items() == [("p95", 184.0)]
    assert got.error_rate == 0.05
    assert got.per_request() == {"ttft_ms": 1650.0, "tpot_ms": 184.0, "e2e_ms": 9000.0}
    partial = derive_slo(base, HostRule(), None, 50.0)  # no TTFT measured: the base's stays
    assert partial.ttft_ms == base.ttft_ms and partial.tpot_ms.p95 == 150.0


def _block(ttft: float | None, tpot: float | None, run_id: str) -> PointResult:
    return PointResult("concurrency", 1.0, True, ttft_p95_ms=ttft, tpot_p95_ms=tpot,
                       completed=6, run_id=run_id)  # fmt: skip


def test_host_slo_takes_each_figure_from_the_slower_probe_block() -> None:
    """A busy host's quiet spell can hold one probe block: the main job beside a CPU hog
    probed P95 TTFT 128 ms (so 513 ms), and the same baseline at one user gave 535 ms a few
    seconds later. Each figure is the slower block's, so one quiet block does not set it."""
    base = parse_slo({"ttft_ms": {"p95": 2000}, "tpot_ms": {"p95": 150}, "error_rate": 0.05})
    blocks = [_block(128.0, 132.0, "a"), _block(535.0, 118.0, "b")]
    h = from_probe(base, HostRule(ttft_x=4, tpot_x=3), blocks, "baseline", "real")
    assert (h.probe_ttft_ms, h.probe_tpot_ms) == (535.0, 132.0)
    assert (h.slo.ttft_ms.p95, h.slo.tpot_ms.p95) == (2140.0, 396.0)
    assert h.samples == 6 and h.blocks == 2 and h.run_ids == ("a", "b")
    one = from_probe(
        base, HostRule(), [_block(None, 50.0, "a"), _block(None, 40.0, "b")], "b", "sim"
    )
    assert one.probe_ttft_ms is None and one.slo.ttft_ms == base.ttft_ms  # none measured: kept


def _host_slo_settings(tmp: Path, study: str):
    wl = {"api": "completions", "seed": 0, "count": 6,
          "input_tokens": {"dist": "uniform", "low": 32, "high": 96},
          "output_tokens": {"dist": "fixed", "value": 16},
          "arrival": {"kind": "closed", "concurrency": 1}}  # fmt: skip
    s = sim_settings(tmp, {"engine": "llamacpp", "knobs": {"parallel_slots": [1, 4]}},
                     strategy="grid", model="gemma-3-270m", gpu="cpu-host", workload=wl,
                     slo={"ttft_ms": {"p95": 1}, "error_rate": 0.05}, study=study)  # fmt: skip
    s.search = SearchSettings("concurrency", concurrency_lattice(8), max_probes=5)
    s.host_slo = HostRule(ttft_x=4, tpot_x=3)
    return s


def test_host_slo_is_k_times_the_idle_probe_stored_and_kept_on_resume(tmp_path: Path) -> None:
    out = Tuner(_host_slo_settings(tmp_path, "host")).run()
    h = out.host_slo
    assert h is not None and h.backend == "sim" and h.samples == 6
    assert h.slo.ttft_ms.p95 == round(4 * h.probe_ttft_ms)
    assert h.slo.tpot_ms.p95 == round(3 * h.probe_tpot_ms)
    assert h.slo.error_rate == 0.05  # the preset's other targets stay
    assert out.slo == h.slo.model_dump(mode="json", exclude_none=True)
    assert out.slo_met and out.winner.status == TrialStatus.OK  # not the 1 ms fallback
    assert "SLO derived from the simulated host: P95 TTFT <= 4 x probe" in h.text()
    assert "2 blocks in a row; the slower block's P95s" in h.text()
    with Store.open(str(tmp_path / "tune.db")) as st:
        blocks = [r for r in st.list_runs(study="host") if "slo" in r.tags]
        assert sorted(b.id for b in blocks) == sorted(h.run_ids) and len(blocks) == 2
        assert all(b.tune.load == 1.0 for b in blocks)
        slower = max(b.metrics["ttft_ms"]["p95"] for b in blocks)
        assert slower == pytest.approx(h.probe_ttft_ms)
        assert st.study_meta("host")["summary"]["slo_derived"]["ttft_x"] == 4
    executors._BACKENDS.clear()  # as in a new process
    executors._RECORDERS.clear()
    again = Tuner(_host_slo_settings(tmp_path, "host")).run()
    assert again.host_slo.slo == h.slo


def test_a_host_that_slowed_after_the_probe_is_said_beside_the_best_effort(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe caught a quiet spell (here: its figures read 8x faster than the host then
    served), so the probed config itself misses the SLO at one user and no config meets
    it. The best effort is still the answer, and it says the host slowed, with the probed
    config's own miss and what to do; a probe that held (the test above) says nothing."""
    import servetune.tune.tuner as tuner_mod

    real_probe = tuner_mod.probe_host

    def quiet_spell(*args, **kw):
        h = real_probe(*args, **kw)
        fast = (h.probe_ttft_ms / 8, h.probe_tpot_ms / 8)
        return dataclasses.replace(h, slo=derive_slo(kw["base"], kw["rule"], *fast))

    monkeypatch.setattr(tuner_mod, "probe_host", quiet_spell)
    out = Tuner(_host_slo_settings(tmp_path, "slowed")).run()
    assert out.host_slo is not None and not out.slo_met and out.winner is not None
    said = [line for line in out.explanation if line.startswith("the host slowed")]
    assert len(said) == 1, out.explanation
    assert re.search(r"missed it at 1 user \(P95 T[TP]OT [\d,]+ ms > [\d,]+ \(n=6", said[0])
    assert said[0].endswith("rerun on a quieter host, or give the SLO (--slo)")


def test_slowed_since_reads_only_the_probed_configs_one_user_points() -> None:
    base = parse_slo({"ttft_ms": {"p95": 2000}, "error_rate": 0.05})
    h = from_probe(base, HostRule(ttft_x=4, tpot_x=3), [_block(128.0, 40.0, "a")], "b0", "real")
    miss = [{"metric": "ttft_ms", "stat": "p95", "value": 535.0, "target": 512.0, "ok": False}]
    met = [{"metric": "ttft_ms", "stat": "p95", "value": 300.0, "target": 512.0, "ok": True}]

    def trial(label: str, *points: tuple[float, list, bool]) -> TrialResult:
        pts = [PointResult("concurrency", load, ok, checks=c, completed=6)
               for load, c, ok in points]  # fmt: skip
        return TrialResult("k", {}, label, "real", TrialStatus.NO_SLO, points=pts)

    slowed = slowed_since(h, [trial("other", (1, miss, False)), trial("b0", (1, miss, False))])
    assert slowed is not None and "P95 TTFT 535 ms > 512 (n=6, ~max); 1 of its 1" in slowed
    assert slowed_since(h, [trial("b0", (1, met, True), (2, miss, False))]) is None
    assert slowed_since(h, [trial("b0", (2, miss, False))]) is None  # not measured at 1
    assert slowed_since(h, [trial("other", (1, miss, False))]) is None


class _SlowStart(SimBackend):
    """The simulator, but its first `fails` starts raise `Infeasible(kind)`."""

    def __init__(self, spec: BackendSpec, kind: str, fails: int) -> None:
        super().__init__(spec)
        self.kind, self.fails, self.starts = kind, fails, 0

    @contextlib.contextmanager
    def session(self, cfg: EngineConfig):
        self.starts += 1
        if self.starts <= self.fails:
            raise Infeasible(self.kind, "not ready after 1s")
        with super().session(cfg) as sess:
            yield sess


@pytest.mark.parametrize(("kind", "fails", "starts", "status"), [
    ("timeout", 1, 2, TrialStatus.OK),  # a slow start is retried once
    ("timeout", 2, 2, TrialStatus.INFEASIBLE),  # twice: infeasible
    ("oom", 1, 1, TrialStatus.INFEASIBLE),  # not a timing failure: no retry
])  # fmt: skip
def test_a_start_that_timed_out_is_retried_once(tmp_path: Path, kind, fails, starts, status):
    wl = parse_workload({"count": 20, "input_tokens": {"dist": "fixed", "value": 64},
                         "output_tokens": {"dist": "fixed", "value": 16},
                         "arrival": {"kind": "closed", "concurrency": 1}})  # fmt: skip
    spec = BackendSpec(kind="sim", engine="vllm", model="llama-3.1-8b", hardware="h100-sxm",
                       workload=wl.model_dump(mode="json"),
                       slo={"ttft_ms": {"p95": 5000}})  # fmt: skip
    backend = _SlowStart(spec, kind, fails)
    trial = run_trial(
        backend,
        EngineConfig(engine="vllm", max_num_seqs=8),
        objective=Objective("goodput"),
        search=SearchSettings("concurrency", concurrency_lattice(2), max_probes=2),
        recorder=Recorder(str(tmp_path / "t.db"), "s", "sim"),
        label="flaky",
    )
    assert (backend.starts, trial.status) == (starts, status)
