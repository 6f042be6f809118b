"""Property: whatever numbers a user writes in a workload, SLO, space or preset YAML, or
gives plan / simulate / tune --backend sim on the command line, servetune either refuses
them in one line (exit 2) or runs what was asked: never a traceback, never a hang, never
exit 0 with a result that ignores the input (docs/errors.md).

Each case runs the CLI (or the file's loader) in this process under a CPU-time bound
(SIGVTALRM: a hang spins, and CPU time is the same on a busy host; pytest-timeout's
SIGALRM is left alone). Derandomized, so CI sees the same cases every run; valid values
are drawn small, so a case that runs is a short one and the file takes well under a minute.
"""

from __future__ import annotations

import json
import math
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from tests.cli_run import run_cli

from servetune.errors import InputError
from servetune.tune.preset import load_preset
from servetune.tune.space import load_space

CPU_BOUND_S = 20  # far above any case here (the slowest, a tiny tune study, takes ~1.5 s)
SETTINGS = dict(
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


class Hang(BaseException):
    """A case ran past CPU_BOUND_S (BaseException: no `except Exception` swallows it)."""


@contextmanager
def cpu_bound(seconds: float) -> Iterator[None]:
    def stop(*_: Any) -> None:
        raise Hang(f"no answer within {seconds} s of CPU")

    old = signal.signal(signal.SIGVTALRM, stop)
    signal.setitimer(signal.ITIMER_VIRTUAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        signal.signal(signal.SIGVTALRM, old)


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """Run servetune; exit 2 must be one line naming a field, anything else exit 0."""
    with cpu_bound(CPU_BOUND_S):
        code, out, err = run_cli(capsys, *args)  # an exception here is the traceback
    event(f"exit {code}")  # --hypothesis-show-statistics: how many cases ran, how many refused
    if code == 2:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ") and ": " in lines[0][7:], err
        assert "validation error" not in err and "pydantic" not in err, err
    else:
        assert code == 0, err
    return code, out


# Values that must be refused wherever a positive number goes, and small valid ones.
BAD = st.sampled_from(
    [0, -1, -1e9, math.nan, math.inf, -math.inf, 1e29, 1e-308, True, False, "1e12", "x", [], {}]
)


def small(lo: float, hi: float, integer: bool = True) -> st.SearchStrategy[Any]:
    return st.integers(int(lo), int(hi)) if integer else st.floats(lo, hi)


def maybe(valid: st.SearchStrategy[Any], bad_in: int = 8) -> st.SearchStrategy[Any]:
    """`valid`, or one in `bad_in` times a BAD value: a spec of several fields is then often
    all valid (it runs, and its result is checked) and often refused."""
    # (hypothesis favours the ends of a range: the middle value picks BAD)
    return st.integers(1, bad_in).flatmap(lambda k: BAD if k == bad_in // 2 else valid)


def dist(lo: int, hi: int) -> st.SearchStrategy[dict[str, Any]]:
    """A length distribution of any kind, its numbers valid or not."""
    n = maybe(small(lo, hi))
    return st.one_of(
        st.fixed_dictionaries({"dist": st.just("fixed"), "value": n}),
        st.fixed_dictionaries({"dist": st.just("uniform"), "low": n, "high": n}),
        st.fixed_dictionaries({"dist": st.just("normal"), "mean": n, "std": maybe(small(0, 50))}),
        st.fixed_dictionaries(
            {"dist": st.just("lognormal"), "mean": n, "sigma": maybe(small(0, 2, False))}
        ),
        st.fixed_dictionaries(
            {"dist": st.just("empirical"), "values": st.lists(n, min_size=0, max_size=4)}
        ),
        st.fixed_dictionaries({"dist": st.just("fixed"), "value": n, "min": n, "max": n}),
    )


WORKLOADS = st.fixed_dictionaries(
    {
        "count": maybe(small(1, 60)),
        "seed": maybe(small(0, 10**6)),
        "input_tokens": dist(1, 2048),
        "output_tokens": dist(1, 256),
        "arrival": st.one_of(
            st.fixed_dictionaries(
                {"kind": st.sampled_from(["poisson", "constant", "gamma"]),
                 "rate": maybe(small(0.5, 50, False)), "burstiness": maybe(small(0.2, 4, False))}
            ),
            st.fixed_dictionaries({"kind": st.just("closed"), "concurrency": maybe(small(1, 32))}),
        ),  # fmt: skip
    },
    optional={"warmup_s": maybe(small(0, 2, False)), "prefix": st.fixed_dictionaries(
        {"groups": maybe(small(1, 4)), "tokens": maybe(small(1, 512))})},
)  # fmt: skip


def _bounds(d: dict[str, Any]) -> tuple[float, float]:
    """The lengths a valid distribution may give (prefix aside): its own range (fixed
    value, uniform low..high, empirical values) clipped to [min, max]."""
    cmin, cmax = d.get("min", 1), d.get("max", math.inf)
    own = {"fixed": ("value", "value"), "uniform": ("low", "high")}.get(d["dist"])
    if own:
        lo, hi = d[own[0]], d[own[1]]
    elif d["dist"] == "empirical":
        lo, hi = min(d["values"]), max(d["values"])
    else:
        lo, hi = cmin, cmax
    return min(max(lo, cmin), cmax), max(min(hi, cmax), cmin)


@settings(max_examples=40, **SETTINGS)
@given(wl=WORKLOADS)
def test_any_workload_is_refused_in_one_line_or_simulated_as_written(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, wl: dict[str, Any]
) -> None:
    w, out = tmp_path / "w.yaml", tmp_path / "r.json"
    w.write_text(yaml.safe_dump(wl))
    out.unlink(missing_ok=True)
    code, _ = cli(capsys, "simulate", "--no-store", "-w", str(w), "-o", str(out))
    if code:
        return
    res = json.loads(out.read_text())
    records = res["records"]
    assert len(records) == wl["count"]  # every request asked for, no more
    lo, hi = _bounds(wl["output_tokens"])
    assert all(lo <= r["max_tokens"] <= hi for r in records)
    if "prefix" not in wl:
        lo, hi = _bounds(wl["input_tokens"])
        assert all(max(lo, 1) <= r["prompt_tokens"] <= max(hi, 1) for r in records)
    if wl["arrival"]["kind"] != "closed":
        assert res["load"]["rate"] == pytest.approx(wl["arrival"]["rate"])
    else:
        assert res["load"]["concurrency"] == wl["arrival"]["concurrency"]


SLOS = st.fixed_dictionaries(
    {},
    optional={
        "ttft_ms": st.fixed_dictionaries({}, optional={"p95": maybe(small(1, 5000, False)),
                                                       "p99": maybe(small(1, 5000, False))}),
        "tpot_ms": st.fixed_dictionaries({"p95": maybe(small(1, 200, False))}),
        "error_rate": maybe(small(0, 1, False)),
        "kv_cache_usage_max": maybe(small(0.05, 1, False)),
        "goodput": st.fixed_dictionaries({"e2e_ms": maybe(small(1, 10**5, False))}),
    },
)  # fmt: skip


@settings(max_examples=15, **SETTINGS)
@given(slo=SLOS)
def test_any_slo_is_refused_in_one_line_or_judged(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, slo: dict[str, Any]
) -> None:
    w, s = tmp_path / "w.yaml", tmp_path / "slo.yaml"
    w.write_text(yaml.safe_dump({"count": 20, "arrival": {"kind": "poisson", "rate": 5},
                                 "input_tokens": {"dist": "fixed", "value": 128},
                                 "output_tokens": {"dist": "fixed", "value": 16}}))  # fmt: skip
    s.write_text(yaml.safe_dump(slo))
    code, out = cli(capsys, "simulate", "--no-store", "-w", str(w), "--slo", str(s), "--json")
    if code == 0:  # the SLO was applied: the run is judged against it
        assert isinstance(json.loads(out)["slo_pass"], bool)


KNOB = st.one_of(
    st.lists(maybe(small(1, 512)), min_size=0, max_size=4),
    st.fixed_dictionaries({"min": maybe(small(1, 64)), "max": maybe(small(1, 10**12)),
                           "step": maybe(small(1, 64))}),
    st.fixed_dictionaries({"min": maybe(small(1, 64)), "max": maybe(small(1, 10**12)),
                           "mult": maybe(small(1, 4, False))}),
)  # fmt: skip
SPACES = st.fixed_dictionaries(
    {"knobs": st.dictionaries(st.sampled_from(["max_num_seqs", "max_num_batched_tokens",
                                               "block_size", "tensor_parallel_size"]),
                              KNOB, min_size=1, max_size=2)},
    optional={"constraints": st.lists(st.sampled_from(
        ["max_num_seqs / 0 > 1", "max_num_batched_tokens >= max_num_seqs", "dtype > 1",
         "max_num_seqs * 1e308 * 10 > 1", "-max_num_seqs < 0"]), max_size=2)},
)  # fmt: skip


@settings(max_examples=40, **SETTINGS)
@given(space=SPACES)
def test_any_space_is_refused_in_one_line_or_holds_exactly_its_values(
    tmp_path: Path, space: dict[str, Any]
) -> None:
    p = tmp_path / "space.yaml"
    p.write_text(yaml.safe_dump(space))
    try:
        with cpu_bound(CPU_BOUND_S):
            sp = load_space(p)
    except InputError as exc:
        assert exc.one_line().startswith("space") and "\n" not in exc.one_line()
        return
    assert sp.valid_points() and sp.size <= 100_000
    for name, spec in space["knobs"].items():
        if isinstance(spec, list):
            assert list(sp.knobs[name]) == list(dict.fromkeys(spec))
        else:
            assert sp.knobs[name][0] == spec["min"] and sp.knobs[name][-1] <= spec["max"]


PRESETS = st.fixed_dictionaries(
    {"tune": st.fixed_dictionaries({}, optional={k: maybe(v) for k, v in {
        "trials": small(1, 20), "seed": small(0, 99), "top_k": small(1, 5),
        "finalists": small(0, 3), "repeats": small(0, 5), "max_load": small(1, 64, False),
        "max_probes": small(1, 12), "time_budget_s": small(1, 600, False)}.items()})},
)  # fmt: skip


@settings(max_examples=30, **SETTINGS)
@given(preset=PRESETS)
def test_any_preset_is_refused_in_one_line_or_keeps_every_option(
    tmp_path: Path, preset: dict[str, Any]
) -> None:
    base = load_preset("vllm-gpu").model_dump()
    p = tmp_path / "preset.yaml"
    p.write_text(yaml.safe_dump({**base, **preset}))
    try:
        with cpu_bound(CPU_BOUND_S):
            got = load_preset(str(p))
    except InputError as exc:
        assert exc.one_line().startswith("preset.tune") and "\n" not in exc.one_line()
        return
    for k, v in preset["tune"].items():  # pydantic reads "1e12" as the number it names
        assert getattr(got.tune, k) == (float(v) if isinstance(v, str) else v)


NUMBER = st.integers(1, 3).flatmap(
    lambda k: (
        st.sampled_from(["0", "-1", "nan", "inf", "-inf", "1e29", "1e-308", "abc", ""])
        if k == 1
        else st.integers(1, 64).map(str)
    )
)
PLAN_FLAGS = ["--gpus", "--block-size", "--max-model-len", "--kv-cache-space",
              "--gpu-memory-utilization", "--max-num-seqs", "--tp", "--avg-context"]  # fmt: skip
JSON_KEY = {"--gpus": "gpus", "--block-size": "block_size", "--max-model-len": "max_model_len",
            "--tp": "tp"}  # fmt: skip


@settings(max_examples=30, **SETTINGS)
@given(flags=st.dictionaries(st.sampled_from(PLAN_FLAGS), NUMBER, min_size=1, max_size=3))
def test_plan_numbers_are_refused_in_one_line_or_planned_as_given(
    capsys: pytest.CaptureFixture[str], flags: dict[str, str]
) -> None:
    args = [a for kv in flags.items() for a in kv]
    code, out = cli(capsys, "plan", "--json", "--scenario", "none", *args)
    if code:
        return
    plan = json.loads(out)
    for flag, key in JSON_KEY.items():
        if flag in flags:
            assert plan[key] == float(flags[flag])


SIM_FLAGS = {"--rate": st.one_of(NUMBER, st.floats(0.5, 40).map(lambda x: f"{x:.3g}")),
             "--concurrency": NUMBER, "--count": NUMBER, "--duration": NUMBER,
             "--gpus": NUMBER}  # fmt: skip


@settings(max_examples=30, **SETTINGS)
@given(flags=st.fixed_dictionaries({}, optional=SIM_FLAGS))
def test_simulate_numbers_are_refused_in_one_line_or_run_as_given(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flags: dict[str, str]
) -> None:
    w = tmp_path / "w.yaml"
    w.write_text(yaml.safe_dump({"count": 20, "arrival": {"kind": "poisson", "rate": 5},
                                 "input_tokens": {"dist": "fixed", "value": 128},
                                 "output_tokens": {"dist": "fixed", "value": 16}}))  # fmt: skip
    args = [a for kv in flags.items() for a in kv]
    code, out = cli(capsys, "simulate", "--no-store", "-w", str(w), "--json", *args)
    if code:
        return
    got = json.loads(out)
    points = got if isinstance(got, list) else [got]  # --rate and --concurrency: two
    rates = [p["load"]["rate"] for p in points if p["load"]["kind"] != "closed"]
    users = [p["load"]["concurrency"] for p in points if p["load"]["kind"] == "closed"]
    if "--rate" in flags:
        assert rates == [pytest.approx(float(flags["--rate"]))]
    if "--concurrency" in flags:
        assert users == [int(flags["--concurrency"])]
    if "--count" in flags and "--concurrency" not in flags:
        assert all(p["completed"] + p["rejected"] == int(flags["--count"]) for p in points)


TUNE_NUMBER = NUMBER.map(lambda v: str(min(int(v), 5)) if v.isdigit() else v)  # short studies
TUNE_FLAGS = {
    f: TUNE_NUMBER
    for f in ("--trials", "--max-load", "--max-probes", "--seed", "--top-k", "--finalists",
              "--repeats", "--time-budget")
}  # fmt: skip
TINY = {
    "engine": "vllm",
    "model": "llama-3.1-8b",
    "hardware": "h100-sxm",
    "backend": "sim",
    "space": {"fixed": {"max_model_len": 4096}, "knobs": {"max_num_seqs": [16, 64]}},
    "workload": {"count": 20, "arrival": {"kind": "poisson", "rate": 1},
                 "input_tokens": {"dist": "fixed", "value": 256},
                 "output_tokens": {"dist": "fixed", "value": 32}},
    "slo": {"ttft_ms": {"p95": 800}},
    "tune": {"finalists": 0, "repeats": 0, "max_probes": 3},
}  # fmt: skip


@settings(max_examples=8, **SETTINGS)
@given(flags=st.fixed_dictionaries({}, optional=TUNE_FLAGS))
def test_tune_numbers_are_refused_in_one_line_or_obeyed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flags: dict[str, str]
) -> None:
    preset = tmp_path / "tiny.yaml"
    preset.write_text(yaml.safe_dump(TINY))
    args = [a for kv in flags.items() for a in kv]
    code, out = cli(
        capsys, "tune", "--preset", str(preset), "--db", str(tmp_path / "t.db"), "--fresh",
        "-q", "--json", "--no-edge", "-o", str(tmp_path / "t.html"), *args,
    )  # fmt: skip
    if code:
        return
    got = json.loads(out)
    if "--trials" in flags:  # the ranking phase's trials, plus the baseline
        assert got["counts"]["sim_trials"] <= int(flags["--trials"]) + 1
    if "--max-load" in flags:
        top = float(flags["--max-load"])
        assert all(t["capacity"] is None or t["capacity"] <= top + 1e-9 for t in got["ranked"])
