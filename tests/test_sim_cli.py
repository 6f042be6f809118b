"""`servetune simulate` / `calibrate` through the real entry point."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from servetune.sim.confidence import REPLAY_LOW

WL = {
    "count": 120,
    "arrival": {"kind": "poisson", "rate": 10},
    "input_tokens": {"dist": "fixed", "value": 256},
    "output_tokens": {"dist": "fixed", "value": 32},
}


def cli(*args: str) -> subprocess.CompletedProcess:
    code = "from servetune.cli.app import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120
    )


def test_simulate_json_and_files(tmp_path: Path):
    w = tmp_path / "w.yaml"
    w.write_text(yaml.safe_dump(WL))
    out, tr = tmp_path / "r.json", tmp_path / "t.csv"
    p = cli(
        "simulate",
        "--model",
        "llama-3.1-8b",
        "--gpu",
        "h100-sxm",
        "--set",
        "max_num_seqs=32",
        "--set",
        "max_model_len=4096",
        "--workload",
        str(w),
        "--json",
        "-o",
        str(out),
        "--trace",
        str(tr),
    )
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s["completed"] == 120 and s["tier"] == "gpu"
    assert json.loads(out.read_text())["backend"] == "sim"
    assert tr.read_text().startswith("step,steps,")
    # calibrate from that result (as if measured), then simulate with the profile
    prof = tmp_path / "p.json"
    p = cli("calibrate", str(out), "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "-o", str(prof))
    assert p.returncode == 0, p.stderr

    def with_profile(model: str) -> subprocess.CompletedProcess:
        return cli(
            "simulate", "--model", model, "--gpu", "h100-sxm", "--set", "max_model_len=4096",
            "--workload", str(w), "--profile", str(prof), "--json",
        )  # fmt: skip

    p = with_profile("llama-3.1-8b")
    assert p.returncode == 0 and json.loads(p.stdout)["tier"] == "calibrated"
    p = with_profile("qwen3-8b")  # a profile for another model
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "profile is for" in p.stderr


def test_bad_config_is_one_line(tmp_path: Path):
    w = tmp_path / "w.yaml"
    w.write_text(yaml.safe_dump(WL))
    p = cli(
        "simulate", "--gpu", "cpu-host", "--set", "kv_cache_space_gib=0.001", "--workload", str(w)
    )
    assert p.returncode == 2 and p.stderr.count("\n") == 1
    p = cli(
        "simulate",
        "--set",
        "max_num_seqs=512",
        "--set",
        "max_num_batched_tokens=256",
        "--workload",
        str(w),
    )
    assert p.returncode == 2 and "max_num_batched_tokens" in p.stderr
    # a release written as a number (0.10 would read as 0.1) or not as a release
    for bad, says in (("0.18", "e.g. 0.18.0"), ('"latest"', "such as 0.15.1")):
        p = cli("simulate", "--set", f"engine_version={bad}", "--workload", str(w))
        assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
        assert "engine_version" in p.stderr and says in p.stderr


def test_validate_one_line_errors(tmp_path: Path):
    r = cli("validate")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "exactly one of --runs" in r.stderr
    r = cli("validate", "--runs", str(tmp_path / "nope"))
    assert r.returncode == 2 and "is not a directory" in r.stderr
    r = cli("validate", "--runs", str(tmp_path))
    assert r.returncode == 2 and "no .json files" in r.stderr
    r = cli("validate", "--live", "--engine", "tgi")
    assert r.returncode == 2 and "no fidelity harness for tgi" in r.stderr


def test_validate_on_saved_runs_of_a_known_profile_has_zero_error(tmp_path: Path):
    """Runs produced by the simulator itself under profile P, validated against P: every
    figure must match (the harness plumbing adds no error of its own), in --json."""
    from servetune.engines.testmodel import VLLM_TEST_CONFIG, make_llama_dir
    from servetune.hardware import get_hardware
    from servetune.model import get_model
    from servetune.sim.engine import simulate
    from servetune.sim.profile import Profile, save_profile
    from servetune.workload.spec import parse_workload

    model_dir = str(make_llama_dir())
    m = get_model(model_dir)
    coef = {"const": 0.03, "prefill_tokens": 3e-4, "decode_seqs": 1e-4, "prefill_sq": 4e-7}
    prof = Profile(
        engine="vllm",
        model=m.name,
        hardware="cpu-host",
        coefficients=coef,
        api_overhead_s=0.003,
        ingress_s=0.004,
    )
    save_profile(prof, tmp_path / "p.json")
    runs = tmp_path / "runs"
    runs.mkdir()
    for name, conc in (("cal-c2", 2), ("held-c3", 3)):
        w = parse_workload(
            {
                "api": "completions",
                "name": name,
                "count": 8,
                "arrival": {"kind": "closed", "concurrency": conc},
                "input_tokens": {"dist": "uniform", "low": 50, "high": 400},
                "output_tokens": {"dist": "fixed", "value": 12},
            }
        )
        res, _ = simulate(
            m, get_hardware("cpu-host"), VLLM_TEST_CONFIG, w, profile=prof, keep_requests=True
        )
        (runs / f"{name}.json").write_text(res.model_dump_json())
    r = cli("validate", "--runs", str(runs), "--profile", str(tmp_path / "p.json"), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [x["workload"] for x in out["heldout"]] == ["held-c3"]
    assert all(v < 1e-6 for v in out["medians_err_pct"].values()), out["medians_err_pct"]
    assert all(out["targets_met"].values())
    assert out["noise_floor"] == [] and out["noise_floor_pct"] is None  # one run: no floor
    assert out["verdict"] == {"result": "met", "figures": []}


@pytest.mark.paced  # its profile is fitted to the mock's live timings
def test_calibrate_live_sweeps_a_running_server_and_keeps_its_runs(tmp_path: Path):
    """`calibrate --url` against a server whose timing is known (the mock: TTFT 30 ms, 6 ms
    between tokens, for any batch): the sweep's runs are kept, the profile is refined by
    replay, and the simulator with it reproduces the server's TPOT and TTFT."""
    from servetune.mock.server import MockConfig, mock_in_thread

    prof, runs = tmp_path / "p.json", tmp_path / "runs"
    with mock_in_thread(MockConfig(ttft_ms=30, itl_ms=6)) as srv:
        p = cli(
            "calibrate",
            "--url",
            f"http://127.0.0.1:{srv.port}",
            "--model",
            "llama-3.2-1b",
            "--gpu",
            "cpu-host",
            "--set",
            "max_num_seqs=4",
            "--repeats",
            "1",  # the mock's timing does not drift: one run of each is enough
            "--runs-dir",
            str(runs),
            "-o",
            str(prof),
        )
    assert p.returncode == 0, p.stderr
    from servetune.validate import calibration_cases

    sweep = calibration_cases()
    assert len(list(runs.glob("cal-*.json"))) == len(sweep)  # one of each sweep workload
    fit = json.loads(prof.read_text())["fit"]
    assert fit["method"] == "least squares + replay"
    # the mock's timing is the step model's own shape (a constant step, a constant latency
    # to the first chunk): its profile replays its runs and is fit for use. Under the
    # "low" line, not the "high" one (15%): on a quiet host it reads 5-10%, but CI's busy
    # host once stretched the mock's own timing to 22.5% ("medium", still fit for use)
    assert fit["confidence"] != "low" and fit["rel_rmse"] < REPLAY_LOW, fit
    w = tmp_path / "w.yaml"
    w.write_text(
        yaml.safe_dump({**WL, "count": 40, "arrival": {"kind": "closed", "concurrency": 2}})
    )
    s = cli(
        "simulate", "--model", "llama-3.2-1b", "--gpu", "cpu-host", "--set", "max_num_seqs=4",
        "--workload", str(w), "--profile", str(prof), "--json",
    )  # fmt: skip
    assert s.returncode == 0, s.stderr
    m = json.loads(s.stdout)
    assert 5.0 < m["tpot_ms"]["p50"] < 7.5 and 25 < m["ttft_ms"]["p50"] < 45, m
    assert cli("calibrate", "--model", "x", "--gpu", "cpu-host", "-o", str(prof)).returncode == 2


def test_calibrate_from_the_store_uses_measured_runs_only(tmp_path: Path):
    """Bench runs recorded in the store (a study of two loads against the mock) calibrate
    a profile by study name, refined by replay when bench recorded the engine's knobs
    (--engine/--set) and by least squares alone when it did not; a study of simulated runs
    is refused (fitting the simulator on its own output proves nothing)."""
    from servetune.mock.server import MockConfig, mock_in_thread

    db, w = str(tmp_path / "st.db"), tmp_path / "w.yaml"
    w.write_text(
        yaml.safe_dump({**WL, "count": 12, "arrival": {"kind": "closed", "concurrency": 1}})
    )
    knobs = ("--engine", "vllm", "--set", "max_num_seqs=4")
    with mock_in_thread(MockConfig(ttft_ms=20, itl_ms=4)) as srv:
        for study, extra in (("measured", knobs), ("bare", ())):
            b = cli(
                "bench", "--url", f"http://127.0.0.1:{srv.port}", "-w", str(w), "--concurrency",
                "1,4", "--tokenizer", "word", "--db", db, "--study", study, *extra,
            )  # fmt: skip
            assert b.returncode == 0, b.stderr
    s = cli(
        "simulate", "--model", "llama-3.2-1b", "--gpu", "cpu-host", "--workload", str(w),
        "--db", db, "--study", "simulated",
    )  # fmt: skip
    assert s.returncode == 0, s.stderr
    base = ("calibrate", "--model", "llama-3.2-1b", "--gpu", "cpu-host", "--db", db, "--json")
    p = cli(*base, "--from-store", "measured", "-o", str(tmp_path / "p.json"))
    assert p.returncode == 0, p.stderr
    prof = json.loads(p.stdout)
    assert prof["fit"]["samples"] > 0 and prof["coefficients"]["const"] > 0
    assert prof["fit"]["method"] == "least squares + replay"
    p = cli(*base, "--from-store", "bare", "-o", str(tmp_path / "b.json"))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["fit"]["method"] == "least squares"
    assert "--set the engine's knobs" in p.stderr
    p = cli(*base, "--from-store", "bare", "--set", "max_num_seqs=4", "-o", str(tmp_path / "c"))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["fit"]["method"] == "least squares + replay"
    p = cli(*base, "--from-store", "measured", "--engine", "llamacpp", "-o", str(tmp_path / "x"))
    assert p.returncode == 2 and "served by vllm" in p.stderr
    p = cli(*base, "--from-store", "simulated", "-o", str(tmp_path / "q.json"))
    assert p.returncode == 2 and "no measured runs" in p.stderr


def test_calibrate_refuses_runs_of_another_engine_or_of_the_simulator(tmp_path: Path):
    """One profile holds one engine's step times. A bench result file now records the
    engine and the --set knobs it was run with, so a file fits by replay without --set and
    a llama.cpp run is not fitted into a vLLM profile (both used to pass silently, in
    files and mixed into --from-store); a simulated result file of another model and GPU
    is refused (one of the profile's own is a self-check, and said so)."""
    from servetune.mock.server import MockConfig, mock_in_thread

    db, w = str(tmp_path / "st.db"), tmp_path / "w.yaml"
    w.write_text(
        yaml.safe_dump({**WL, "count": 12, "arrival": {"kind": "closed", "concurrency": 1}})
    )
    served = {
        "v": ("--engine", "vllm", "--set", "max_num_seqs=4"),
        "l": ("--engine", "llamacpp"),
    }
    with mock_in_thread(MockConfig(ttft_ms=20, itl_ms=4)) as srv:
        for name, extra in served.items():
            b = cli(
                "bench", "--url", f"http://127.0.0.1:{srv.port}", "-w", str(w), "--concurrency",
                "1,4", "--tokenizer", "word", "--db", db, "--study", name,
                "-o", str(tmp_path / f"{name}.json"), *extra,
            )  # fmt: skip
            assert b.returncode == 0, b.stderr
    v_files = sorted(str(p) for p in tmp_path.glob("v-*.json"))
    l_files = sorted(str(p) for p in tmp_path.glob("l-*.json"))
    assert len(v_files) == 2 and len(l_files) == 2, list(tmp_path.iterdir())
    assert json.loads(Path(v_files[0]).read_text())["target"]["engine"] == "vllm"
    base = ("calibrate", "--model", "llama-3.2-1b", "--gpu", "cpu-host", "--db", db, "--json")
    p = cli(*base, *v_files, "-o", str(tmp_path / "p.json"))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["fit"]["method"] == "least squares + replay"  # its knobs
    for source in ([*v_files, *l_files], ["--from-store", "v", "--from-store", "l"]):
        p = cli(*base, *source, "-o", str(tmp_path / "x.json"))
        assert p.returncode == 2 and "2 of the 4 runs were served by llamacpp" in p.stderr
        assert len(p.stderr.strip().splitlines()) == 1 and not (tmp_path / "x.json").exists()
    s = cli(
        "simulate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--workload", str(w),
        "--no-store", "-o", str(tmp_path / "sim.json"),
    )  # fmt: skip
    assert s.returncode == 0, s.stderr
    p = cli(*base, str(tmp_path / "sim.json"), "-o", str(tmp_path / "q.json"))
    assert p.returncode == 2, p.stderr
    assert "sim.json is a simulated run of llama-3.1-8b on h100-sxm, not of --model" in p.stderr


def test_a_gpu_closed_loop_of_many_users_shows_its_mean_ttft_and_why():
    """The gpu tier's median TTFT of a closed loop rests on one seeded draw of phases
    (docs/fidelity-gpu.md#known-misses): from 8 users on, the point also prints the mean
    TTFT and says so. Fewer users, open loops and other tiers print no such line."""
    from servetune.cli.sim_report import PHASE_NOTE_USERS, sim_point
    from servetune.engines.config import EngineConfig
    from servetune.hardware import get_hardware
    from servetune.model import get_model
    from servetune.sim.engine import simulate
    from servetune.workload.spec import parse_workload

    def point(arrival: dict, tier: str | None = None) -> list[str]:
        spec = parse_workload({**WL, "count": 80, "arrival": arrival})
        res, _ = simulate(
            get_model("qwen3-32b"), get_hardware("h100-sxm"),
            EngineConfig(tensor_parallel_size=2), spec, tier=tier,
        )  # fmt: skip
        return [line for line in sim_point(res) if "TTFT mean" in line or "8 draws" in line]

    mean, why = point({"kind": "closed", "concurrency": PHASE_NOTE_USERS})
    assert "one draw of which users collide" in mean and "the median moved" in why
    assert not point({"kind": "closed", "concurrency": PHASE_NOTE_USERS - 1})
    assert not point({"kind": "poisson", "rate": 4})
    assert not point({"kind": "closed", "concurrency": 16}, tier="roofline")


def test_a_point_prints_the_itl_median_beside_the_tpot_median():
    """`vllm bench serve` and GuideLLM print a Median ITL (over every gap between tokens);
    each point prints it beside the TPOT median (over requests), from the same run. Long
    prompts arriving while others decode stall those decodes: each TPOT holds the stalls,
    the ITL median leaves them out, so it reads lower; a lone user has no stalls."""
    from servetune.cli.sim_report import sim_point
    from servetune.engines.config import EngineConfig
    from servetune.hardware import get_hardware
    from servetune.model import get_model
    from servetune.sim.engine import simulate
    from servetune.workload.spec import parse_workload

    def point(users: int) -> tuple[float, float, str]:
        wl = {**WL, "count": 10 * users, "arrival": {"kind": "closed", "concurrency": users}}
        wl["input_tokens"] = {"dist": "fixed", "value": 8192}
        wl["output_tokens"] = {"dist": "fixed", "value": 256}
        res, _ = simulate(
            get_model("llama-3.1-8b"), get_hardware("h100-sxm"), EngineConfig(),
            parse_workload(wl),
        )  # fmt: skip
        line = next(x for x in sim_point(res) if "TPOT p50/p95" in x)
        return res.metrics.tpot_ms.p50, res.metrics.itl_ms.p50, line

    tpot, itl, line = point(16)
    assert f"ITL p50 {itl:,.1f} ms" in line
    assert itl < 0.95 * tpot  # 16 users' 8k prompts stall the decodes
    tpot, itl, line = point(1)
    assert f"ITL p50 {itl:,.1f} ms" in line and abs(itl - tpot) < 0.02 * tpot


def test_a_closed_loop_point_quotes_the_expected_error_of_its_own_load_band(tmp_path):
    """The error grows with load (validate --published, per band): a vLLM closed loop's
    point quotes its band's recorded figures, 64 users those of 33-128 users, 4 users
    those of 1-8; an open loop has no users to place and quotes none (the header's
    all-runs figure stands), nor does an SGLang loop (the bands are vLLM's runs)."""
    from servetune.cli.sim_report import sim_point
    from servetune.engines.config import EngineConfig
    from servetune.hardware import get_hardware
    from servetune.model import get_model
    from servetune.results.schema import RunResult
    from servetune.sim.engine import simulate
    from servetune.sim.expected_error import expected_errors
    from servetune.workload.spec import parse_workload

    def run(arrival: dict, engine: str = "vllm") -> RunResult:
        spec = parse_workload({**WL, "count": 80, "arrival": arrival})
        return simulate(
            get_model("qwen3-32b"), get_hardware("h100-sxm"),
            EngineConfig(engine=engine, tensor_parallel_size=2), spec,
        )[0]  # fmt: skip

    def band_lines(res: RunResult) -> list[str]:
        return [line for line in sim_point(res) if "expected |error|" in line]

    gpu = expected_errors()["gpu"]["bands"]
    busy = run({"kind": "closed", "concurrency": 64})
    (line,) = band_lines(busy)
    band = gpu["33-128 users"]
    assert f"at 33-128 users: TTFT {band['ttft_pct']}%, TPOT {band['tpot_pct']}%" in line
    assert f"(median of {band['rows']})" in line
    # the stored result carries the same note, and so does --json, with the mean beside
    # the percentiles (what a benchmark publishes first)
    assert busy.target.sim is not None and busy.target.sim.expected_error is not None
    assert busy.target.sim.expected_error.startswith(line.strip())
    w = tmp_path / "w.yaml"
    w.write_text(
        yaml.safe_dump({**WL, "count": 80, "arrival": {"kind": "closed", "concurrency": 64}})
    )
    p = cli(
        "simulate", "--model", "qwen3-32b", "--gpu", "h100-sxm", "--gpus", "2",
        "--workload", str(w), "--json", "--no-store",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["expected_error"] == busy.target.sim.expected_error
    assert out["ttft_ms"]["mean"] > out["ttft_ms"]["p50"] > 0 and out["tpot_ms"]["mean"] > 0
    (line,) = band_lines(run({"kind": "closed", "concurrency": 4}))
    assert f"at 1-8 users: TTFT {gpu['1-8 users']['ttft_pct']}%" in line
    # an open loop carries the all-runs figure, which the header prints already
    open_loop = run({"kind": "poisson", "rate": 4})
    assert not band_lines(open_loop)
    assert open_loop.target.sim and open_loop.target.sim.expected_error
    assert " users:" not in open_loop.target.sim.expected_error
    sglang = run({"kind": "closed", "concurrency": 64}, engine="sglang")
    assert not band_lines(sglang)
    # an SGLang prediction quotes SGLang's own published rows, not vLLM's (it quoted 20%)
    own = expected_errors()["gpu"]["engines"]["sglang"]
    assert sglang.target.sim is not None and sglang.target.sim.expected_error is not None
    assert sglang.target.sim.expected_error.startswith(
        f"expected |error| on published sglang GPU runs: TTFT {own['ttft_pct']}%"
    )
    # the track record is of GPU runs: a CPU host's prediction quotes none
    spec = parse_workload({**WL, "count": 8, "arrival": {"kind": "closed", "concurrency": 4}})
    cpu, _ = simulate(get_model("llama-3.2-1b"), get_hardware("cpu-host"), EngineConfig(), spec)
    assert cpu.target.sim is not None and cpu.target.sim.expected_error is None
    assert not band_lines(cpu)


def test_a_kv_bound_point_says_so_and_what_moves_it():
    """64 users of 1,024 + 8,192 tokens hold ~330k tokens of KV on average, over the 230k a
    Llama-3.1-70B FP8 TP2 pool on H100s holds in 16 bits: the point preempts, and its
    report says so with diagnose's first KV action (an FP8 KV cache, twice the blocks).
    With an FP8 pool the first action is a bigger pool; a run that never preempts says
    nothing."""
    from servetune.cli.sim_report import sim_point
    from servetune.engines.config import EngineConfig
    from servetune.hardware import get_hardware
    from servetune.model import get_model
    from servetune.sim.engine import simulate
    from servetune.workload.spec import parse_workload

    def kv_lines(users: int, **knobs: object) -> list[str]:
        spec = parse_workload(
            {"count": 4 * users, "arrival": {"kind": "closed", "concurrency": users},
             "input_tokens": {"dist": "fixed", "value": 1024},
             "output_tokens": {"dist": "fixed", "value": 8192}}
        )  # fmt: skip
        cfg = EngineConfig(tensor_parallel_size=2, quantization="fp8", **knobs)
        res, _ = simulate(get_model("llama-3.1-70b"), get_hardware("h100-sxm"), cfg, spec)
        lines = sim_point(res)
        at = next((i for i, x in enumerate(lines) if x.startswith("  KV-bound: ")), None)
        assert (at is not None) == (res.target.sim.preemptions > 0), lines
        return [] if at is None else lines[at : at + 2]

    bound, action = kv_lines(64)
    assert re.search(r"KV usage peaked at 100% with \d+ preemptions", bound), bound
    assert action.startswith("  try kv_cache_dtype: auto -> fp8  (x2.0 blocks"), action
    fp8 = kv_lines(64, kv_cache_dtype="fp8")  # twice the pool: a few preemptions still
    assert fp8 and fp8[1].startswith("  try gpu_memory_utilization: 0.9 -> 0.93"), fp8
    # at 0.95 already, the memory fraction has no step left: never `0.95 -> 0.95`
    full = kv_lines(64, kv_cache_dtype="fp8", gpu_memory_utilization=0.95)
    assert full and "gpu_memory_utilization" not in full[1], full
    assert kv_lines(8) == []


def test_a_short_run_at_a_rate_reads_the_rate_served():
    """5 requests of the chat example at 2 req/s: none finishes between the first and the
    last send, so counted in the sends' window req/s read 0.00; in the window moved by the
    median latency it reads about the rate (docs/metrics.md), with no 0 req/s note."""
    chat = str(Path(__file__).resolve().parents[1] / "examples" / "workloads" / "chat.yaml")
    p = cli("simulate", "-w", chat, "--count", "5", "--no-store", "--json")
    assert p.returncode == 0, p.stderr
    point = json.loads(p.stdout)
    assert point["completed"] == 5 and 1.0 < point["req_s"] < 4.0, point["req_s"]
    text = cli("simulate", "-w", chat, "--count", "5", "--no-store").stdout
    assert "5 completed" in text and "0 req/s: none" not in text


def test_more_pipeline_stages_than_layers_is_refused():
    p = cli("simulate", "--count", "4", "--no-store", "--set", "pipeline_parallel_size=100")
    assert p.returncode == 2
    assert p.stderr.strip() == (
        "error: pipeline_parallel_size: 100 stages for the model's 32 layers (use at most 32)"
    )


@pytest.mark.parametrize(
    ("knob", "line"),
    [
        # the knob set is named, not vLLM's default it collides with
        ("max_num_seqs=99999999999", "error: max_num_seqs: 99,999,999,999 is above max_num_bat"),
        ("max_num_batched_tokens=8", "error: max_num_batched_tokens: 8 is below max_num_seqs"),
        # a knob of --set is named as a knob, not as plan's --max-model-len flag
        ("max_model_len=999999999", "error: max_model_len: 999999999 exceeds llama-3.1-8b's"),
    ],
)
def test_a_knob_vllm_refuses_is_named_as_set(knob: str, line: str):
    p = cli("simulate", "--count", "4", "--no-store", "--set", knob)
    assert p.returncode == 2
    assert p.stderr.startswith(line) and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_simulate_says_when_a_drawn_schedule_offers_far_from_the_rate_asked(tmp_path: Path):
    """60 gamma arrivals at CV 3 and 1.028 req/s asked: seed 5's schedule offers 2.44 req/s,
    and the text output says so beside the figures measured at it; seed 7's, within 15%
    of the rate asked, is not remarked on."""
    w = tmp_path / "w.yaml"
    said = {}
    for seed in (5, 7):
        arrival = {"kind": "gamma", "rate": 1.028, "burstiness": 1 / 9}
        w.write_text(yaml.safe_dump({**WL, "count": 60, "seed": seed, "arrival": arrival}))
        p = cli("simulate", "--model", "llama-3.2-1b", "--gpu", "cpu-host", "--workload",
                str(w), "--no-store")  # fmt: skip
        assert p.returncode == 0, p.stderr
        said[seed] = p.stdout
    assert "the schedule offered 2.44 req/s, 137% above the 1.03 asked: 60 gamma" in said[5]
    assert "the schedule offered" not in said[7]


def test_simulate_without_a_workload_draws_benchs_default(tmp_path: Path):
    """`simulate` refused to run without --workload while `bench` sent its built-in
    default: both now read the same one (`measure.workload_or_default`); simulate says so."""
    from servetune.measure import DEFAULT_WORKLOAD
    from servetune.measure.commands import workload_or_default
    from servetune.measure.loads import SweepLoads
    from servetune.workload.spec import parse_workload

    out = tmp_path / "r.json"
    p = cli("simulate", "--concurrency", "2", "--count", "12", "--no-store", "-o", str(out))
    assert p.returncode == 0, p.stderr
    assert "workload: the built-in default-chat" in p.stderr
    run = json.loads(out.read_text())
    assert run["workload"]["name"] == "default-chat" and len(run["records"]) == 12
    said: list[str] = []
    spec = workload_or_default(None, SweepLoads(), said.append)
    assert spec == parse_workload(DEFAULT_WORKLOAD) and len(said) == 1
    assert "lognormal prompts of mean 512 tokens and replies of 128, Poisson 1 req/s" in said[0]
    # the flags that replace its lengths, load and size are what is said (it had
    # described the defaults under all four)
    said.clear()
    loads = SweepLoads(users=(1, 2), count=16, input_len=200, output_len=24)
    workload_or_default(None, loads, said.append)
    assert "(prompts of 200 tokens and replies of 24, at the loads given, 16 requests a" in said[0]


def test_simulate_input_and_output_len_are_the_fixed_workload(tmp_path: Path):
    """--input-len / --output-len give what a workload file of fixed lengths gives."""
    w, fixed = tmp_path / "w.yaml", tmp_path / "fixed.yaml"
    lognormal = {"dist": "lognormal", "mean": 200, "sigma": 0.5}
    w.write_text(yaml.safe_dump({**WL, "input_tokens": lognormal}))  # 32 out
    fixed.write_text(yaml.safe_dump({**WL, "input_tokens": 300, "output_tokens": 20}))
    base = ("simulate", "--concurrency", "4", "--count", "24", "--no-store", "--json")
    by_file = cli(*base, "-w", str(fixed))
    by_flags = cli(*base, "-w", str(w), "--input-len", "300", "--output-len", "20")
    other = cli(*base, "-w", str(w), "--input-len", "600")
    assert by_file.returncode == by_flags.returncode == other.returncode == 0, other.stderr
    drop = ("id", "wall_s")
    one, two = (json.loads(p.stdout) for p in (by_file, by_flags))
    assert {k: v for k, v in one.items() if k not in drop} == {
        k: v for k, v in two.items() if k not in drop
    }
    assert json.loads(other.stdout)["ttft_ms"]["p50"] > one["ttft_ms"]["p50"]
    bad = cli("simulate", "--replay", str(w), "--input-len", "9", "--no-store")
    assert bad.returncode == 2 and "--input-len: a replay sends its bench run's own" in bad.stderr
