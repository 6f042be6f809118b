"""`local`: this machine measured as the best of several samples, with their spread, then
read from the cache until it is old, noisy, for another CPU, or marked for re-measuring."""

from __future__ import annotations

import json
import os

import pytest
from typer.testing import CliRunner

from servetune.errors import InputError
from servetune.hardware import local
from servetune.hardware.catalog import get_hardware
from servetune.hardware.local import Spread

DAY_S = 86400.0
T0 = 1_700_000_000.0
QUIET = (Spread.of([28.0, 29.6, 29.0]), Spread.of([0.26, 0.27, 0.27]), 0.1)
FACTS = {"cores": 2, "model": "x", "flags": [], "memory_gib": 8}


class FakeHost:
    """An injected `measure`: returns the given samples and counts the calls."""

    def __init__(self, sampled=QUIET) -> None:
        self.sampled, self.calls = sampled, 0

    def __call__(self, cores: int):
        self.calls += 1
        return self.sampled


@pytest.fixture(autouse=True)
def _no_remeasure_env(monkeypatch) -> None:
    monkeypatch.delenv(local.REMEASURE_ENV, raising=False)


@pytest.fixture
def fake_cpu(monkeypatch) -> dict:
    facts = dict(FACTS)
    monkeypatch.setattr(local, "cpu_facts", lambda: facts)
    return facts


def lookup(tmp_path, host: FakeHost, now: float, **kw):
    return local.local_hardware(tmp_path, measure=host, now=lambda: now, **kw)


def cache(tmp_path) -> dict:
    return json.loads((tmp_path / "hardware-local.json").read_text())


# --------------------------------------------------------------------------- sampling


def test_best_of_n_keeps_the_max_and_records_the_spread() -> None:
    values = iter([19.3, 29.6, 24.0, 27.5, 21.0])
    spread = local.sample_best(lambda: next(values), max_n=5, budget_s=60, clock=lambda: 0.0)
    assert spread == Spread(min=19.3, median=24.0, max=29.6, n=5)
    assert spread.best == 29.6 and spread.ratio == pytest.approx(29.6 / 24.0)


def test_sampling_stops_at_the_budget_but_takes_the_minimum() -> None:
    ticks = iter(range(0, 1000, 10))  # every clock read is 10 s later: a very slow host
    spread = local.sample_best(lambda: 1.0, max_n=8, budget_s=1.0, clock=lambda: next(ticks))
    assert spread.n == 3
    ticks = iter(range(0, 1000, 1))  # 1 s per sample: the 2.5 s budget allows 3, not 8
    spread = local.sample_best(
        lambda: 1.0, max_n=8, budget_s=2.5, min_n=1, clock=lambda: next(ticks)
    )
    assert spread.n == 3


def test_real_host_is_measured_with_its_spread(tmp_path) -> None:
    spec = local.local_hardware(tmp_path, remeasure=True)
    cores = len(os.sched_getaffinity(0))
    assert spec.kind == "cpu" and f"({cores} cores)" in spec.display_name
    # a 2-core VM is nowhere near the catalog's 16-core cpu-host
    assert 0.5 < spec.memory_bandwidth_gbs < 1000
    assert 0.001 < spec.tflops["fp32"] < 50
    assert "measured on this host" in spec.source and "best of" in spec.source
    cached = cache(tmp_path)
    assert cached["bandwidth_gbs"] == spec.memory_bandwidth_gbs
    bw = cached["bandwidth_gbs_spread"]
    assert bw["n"] >= 3 and bw["min"] <= bw["median"] <= bw["max"] == spec.memory_bandwidth_gbs
    assert cached["fp32_tflops_spread"]["max"] == spec.tflops["fp32"]


# --------------------------------------------------------------------------- cache trust


def test_best_sample_is_used_then_read_from_the_cache(tmp_path, fake_cpu) -> None:
    host = FakeHost()
    spec = lookup(tmp_path, host, T0)
    assert spec.memory_bandwidth_gbs == 29.6 and spec.tflops["fp32"] == 0.27
    cached = cache(tmp_path)
    assert cached["bandwidth_gbs_spread"] == {"min": 28.0, "median": 29.0, "max": 29.6, "n": 3}
    assert cached["measured_at"] == T0 and cached["noisy"] is False
    again = lookup(tmp_path, host, T0 + DAY_S)
    assert again == spec and host.calls == 1
    # another CPU (other key) is measured afresh
    fake_cpu["model"] = "some other cpu"
    lookup(tmp_path, host, T0 + DAY_S)
    assert host.calls == 2


def test_an_old_cache_is_measured_again(tmp_path, fake_cpu) -> None:
    host = FakeHost()
    lookup(tmp_path, host, T0)
    lookup(tmp_path, host, T0 + 6.9 * DAY_S)
    assert host.calls == 1
    lookup(tmp_path, host, T0 + 7.1 * DAY_S)
    assert host.calls == 2
    assert cache(tmp_path)["measured_at"] == T0 + 7.1 * DAY_S
    assert cache(tmp_path)["because"] == "measured 7.1 days ago (limit 7)"


@pytest.mark.parametrize(
    ("sampled", "reason"),
    [
        ((Spread.of([19.3, 12.0, 11.0]), QUIET[1], 0.1), "bandwidth best/median 1.61 > 1.5"),
        ((QUIET[0], Spread.of([0.27, 0.086, 0.09]), 0.1), "sgemm best/median 3.00 > 1.5"),
        ((QUIET[0], QUIET[1], 4.75), "host busy: load 4.75 per CPU"),
    ],
)
def test_a_noisy_measurement_is_marked_and_not_trusted_next_run(
    tmp_path, fake_cpu, sampled, reason
) -> None:
    noisy = FakeHost(sampled)
    spec = lookup(tmp_path, noisy, T0)
    assert spec.memory_bandwidth_gbs == sampled[0].best  # still the best it saw, for now
    assert cache(tmp_path)["noisy"] is True
    quiet = FakeHost()
    lookup(tmp_path, quiet, T0 + 60)
    assert quiet.calls == 1
    assert cache(tmp_path)["because"] == f"the last measurement was noisy ({reason})"
    assert cache(tmp_path)["noisy"] is False
    lookup(tmp_path, quiet, T0 + 120)
    assert quiet.calls == 1


def test_a_single_sample_cache_from_before_is_measured_again(tmp_path, fake_cpu) -> None:
    old = {"key": "x|2", "bandwidth_gbs": 9.0, "fp32_tflops": 0.025, "facts": FACTS}
    (tmp_path / "hardware-local.json").write_text(json.dumps(old))
    host = FakeHost()
    assert lookup(tmp_path, host, T0).memory_bandwidth_gbs == 29.6
    assert host.calls == 1 and "older servetune" in cache(tmp_path)["because"]


def test_remeasure_when_asked_or_marked(tmp_path, fake_cpu, monkeypatch) -> None:
    host = FakeHost()
    lookup(tmp_path, host, T0)
    lookup(tmp_path, host, T0 + 1, remeasure=True)
    assert host.calls == 2
    local.mark_for_remeasure("a real decode step beat the bound", tmp_path)
    lookup(tmp_path, host, T0 + 2)
    assert host.calls == 3 and cache(tmp_path)["because"] == "a real decode step beat the bound"
    monkeypatch.setenv(local.REMEASURE_ENV, "1")
    lookup(tmp_path, host, T0 + 3)
    assert host.calls == 4


def test_vnni_and_bf16_scale_from_fp32(tmp_path, fake_cpu) -> None:
    fake_cpu["flags"] = ["avx512_bf16", "avx512_vnni"]
    spec = lookup(tmp_path, FakeHost(), T0)
    assert spec.tflops == {"fp32": 0.27, "bf16": 0.54, "int8": 1.08}
    fake_cpu["flags"], fake_cpu["model"] = [], "y"
    plain = lookup(tmp_path, FakeHost(), T0)
    assert plain.tflops == {"fp32": 0.27, "bf16": 0.27, "int8": 0.27}


# --------------------------------------------------------------------------- real runs


def test_host_disagrees_when_a_real_step_beats_the_roofline_floor() -> None:
    # cached 19.3 GB/s puts a 1 GB decode step at >= 51.8 ms; the quiet host does 33.8 ms
    assert local.host_disagrees(predicted_ms=1000 / 19.3, measured_ms=1000 / 29.6)
    assert not local.host_disagrees(predicted_ms=10.0, measured_ms=9.5)  # within the margin
    assert not local.host_disagrees(predicted_ms=10.0, measured_ms=14.0)  # slower: expected
    assert local.host_disagrees(predicted_ms=10.0, measured_ms=9.5, margin=0.0)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((0.0, 5.0), "predicted_ms"),
        ((5.0, float("nan")), "measured_ms"),
        ((5.0, -1), "measured_ms"),
    ],
)
def test_host_disagrees_rejects_non_times(args, field) -> None:
    with pytest.raises(InputError) as err:
        local.host_disagrees(*args)
    assert err.value.field == field


# --------------------------------------------------------------------------- CLI


@pytest.fixture
def cli_cache(tmp_path, monkeypatch):
    """`plan --gpu local` in-process, on a temporary cache, with a fake host."""
    from servetune.hardware import catalog

    monkeypatch.setenv("SERVETUNE_CACHE", str(tmp_path))
    host = FakeHost((Spread.of([19.3, 12.0, 11.0]), QUIET[1], 0.1))
    monkeypatch.setattr(local, "measure_host", host)
    catalog._local.cache_clear()
    yield host
    catalog._local.cache_clear()


def plan(*args: str):
    from servetune.cli.app import app

    return CliRunner().invoke(app, ["plan", "--model", "llama-3.2-1b", "-s", "cpu-edge", *args])


def test_plan_shows_the_spread_and_says_when_it_is_noisy(cli_cache) -> None:
    out = plan("--gpu", "local", "--json")
    assert out.exit_code == 0, out.output
    shown = json.loads(out.output)["host_measurement"]
    assert shown["bandwidth_gbs"] == {"min": 11.0, "median": 12.0, "max": 19.3, "n": 3}
    assert shown["noisy"] is True and shown["noisy_reasons"] == ["bandwidth best/median 1.61 > 1.5"]
    text = plan("--gpu", "this-host").output
    assert "STREAM-copy 19.3 GB/s, best of 3 (min 11.0, median 12.0)" in text
    assert "NOISY: bandwidth best/median 1.61 > 1.5" in text
    assert "host_measurement" not in json.loads(plan("--gpu", "h100-sxm", "--json").output)


def test_plan_remeasure_measures_again(cli_cache) -> None:
    from servetune.hardware import catalog

    cli_cache.sampled = QUIET
    assert plan("--gpu", "local").exit_code == 0
    catalog._local.cache_clear()  # a new process
    shown = json.loads(plan("--gpu", "Local", "--remeasure", "--json").output)["host_measurement"]
    assert cli_cache.calls == 2 and shown["because"] == "asked with --remeasure"
    out = plan("--gpu", "h100-sxm", "--remeasure")
    assert isinstance(out.exception, InputError) and out.exception.field == "remeasure"


def test_catalog_name_local_uses_the_servetune_cache(tmp_path, monkeypatch) -> None:
    from servetune.hardware import catalog

    monkeypatch.setenv("SERVETUNE_CACHE", str(tmp_path))
    monkeypatch.setattr(local, "measure_host", FakeHost())
    catalog._local.cache_clear()
    try:
        spec = get_hardware("this-host")
        assert spec.name == "local" and (tmp_path / "hardware-local.json").exists()
    finally:
        catalog._local.cache_clear()
