"""Bad values inside the files a command reads - a --hardware-file, a workload's trace and
dataset, a model's config.json - are one line naming the file's field, exit code 2: never
a traceback, never a run that silently uses them (docs/errors.md).

Each case runs the CLI in a subprocess; they all start at once (a module fixture), so the
file costs about one `simulate` start-up per core, not one per case."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from tests.cli_run import run_cli
from tests.hf_configs import LLAMA_8B as CONFIG

HW = "mygpu:\n  display_name: G\n  vendor: me\n  source: x\n"
HW_OK = {"memory_gib": "80", "memory_bandwidth_gbs": "3000", "tflops": "{bf16: 900}"}
LINE = {"timestamp": 0, "input_length": 10, "output_length": 5}
SIM = ["simulate", "--no-store"]


def _hardware(**fields: str) -> str:
    return HW + "".join(f"  {k}: {v}\n" for k, v in {**HW_OK, **fields}.items())


def _jsonl(*rows: object) -> str:
    """Rows as JSON lines; a str row is written as it is (text json.dumps would quote)."""
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


def _trace(*rows: object) -> dict[str, str]:
    return {"t.jsonl": _jsonl(*rows), "w.yaml": "trace: {path: t.jsonl}\narrival: {kind: trace}\n"}


def _dataset(*rows: object) -> dict[str, str]:
    return {"d.jsonl": _jsonl(*rows), "w.yaml": "count: 3\ndataset: {path: d.jsonl}\n"}


def _config(**changes: object) -> dict[str, str]:
    return {"config.json": json.dumps({**CONFIG, **changes})}


PLAN_HW = ["plan", "-g", "mygpu", "--hardware-file", "hw.yaml"]
PLAN_CONFIG = ["plan", "-m", "config.json"]
SIM_W = [*SIM, "-w", "w.yaml", "--rate", "2"]

# (case, files to write, argv, what the one stderr line names). `plan` and `gpus` start in
# 0.3 s, `simulate` in 1.5 s: one file per kind of bad simulate input runs in a subprocess
# (SUBPROCESS), its variants in this process (IN_PROCESS, the same CLI `main`).
SUBPROCESS = [
    ("hw memory .inf", {"hw.yaml": _hardware(memory_gib=".inf")}, PLAN_HW, "mygpu.memory_gib: "),
    ("hw memory 1e300", {"hw.yaml": _hardware(memory_gib="1.0e+300")}, PLAN_HW, "memory_gib: "),
    (
        "hw bandwidth .inf",
        {"hw.yaml": _hardware(memory_bandwidth_gbs=".inf")},
        PLAN_HW,
        "mygpu.memory_bandwidth_gbs: ",
    ),
    ("hw tflops .inf", {"hw.yaml": _hardware(tflops="{bf16: .inf}")}, PLAN_HW, "tflops.bf16: "),
    (
        "hw devices_per_node 1e23",  # planning walked every count up to it: a hang
        {"hw.yaml": _hardware(devices_per_node="100000000000000000000000")},
        PLAN_HW,
        "mygpu.devices_per_node: ",
    ),
    (
        "gpus --json memory .inf",  # printed `Infinity`: not JSON
        {"hw.yaml": _hardware(memory_gib=".inf")},
        ["gpus", "--hardware-file", "hw.yaml", "--json"],
        "mygpu.memory_gib: ",
    ),
    ("config torch_dtype int3", _config(torch_dtype="int3"), PLAN_CONFIG, ": torch_dtype: 'int3'"),
    (
        "config kv heads 64 > 32",
        _config(num_key_value_heads=64),
        PLAN_CONFIG,
        "num_key_value_heads: 64 does not divide num_attention_heads 32",
    ),
    (
        "trace timestamp 'abc'",
        _trace(LINE, {**LINE, "timestamp": "abc"}),
        SIM_W,
        "line 2.timestamp: ",
    ),
    (
        "dataset output -5",  # said "request 0 has no output length"
        _dataset({"prompt": "hi", "output_tokens": -5}),
        SIM_W,
        "line 1.output_tokens: -5 is negative",
    ),
]
IN_PROCESS = [
    (
        "trace timestamp NaN",
        _trace('{"timestamp": NaN, "input_length": 10, "output_length": 5}'),
        SIM_W,
        "line 1.timestamp: ",
    ),
    ("trace hash_ids 'x'", _trace({**LINE, "hash_ids": "x"}), SIM_W, "line 1.hash_ids: "),
    (
        "trace spanning 1e297 s",  # the bench would wait for ever (the sim warned, then ran)
        _trace(LINE, {**LINE, "timestamp": 1e300}),
        [*SIM, "-w", "w.yaml"],  # replayed at its timestamps (--rate would ignore them)
        "t.jsonl span 1e+297 s of replay",
    ),
    (
        "trace span overflowing",  # 3.4e308 ms: a traceback (arrival_s inf)
        _trace({**LINE, "timestamp": -1.7e308}, {**LINE, "timestamp": 1.7e308}),
        [*SIM, "-w", "w.yaml"],
        "t.jsonl span over 1e308 ms",
    ),
    ("trace line a list", _trace(LINE, [1, 2]), SIM_W, "workload.trace line 2: is a JSON list"),
    ("dataset prompt 12345", _dataset({"prompt": 12345}), SIM_W, "line 1.prompt: "),
    ("dataset prompt a list", _dataset({"prompt": ["a", "b"]}), SIM_W, "line 1.prompt: "),
    ("dataset messages 'hello'", _dataset({"messages": "hello"}), SIM_W, "line 1.messages: "),
    ("dataset messages [1, 2]", _dataset({"messages": [1, 2]}), SIM_W, "line 1.messages: "),
    (
        "dataset output 'abc'",
        _dataset({"prompt": "hi", "output_tokens": "abc"}),
        SIM_W,
        "line 1.output_tokens: ",
    ),
    (
        "dataset output 1e30",
        _dataset({"prompt": "hi"}, {"prompt": "hi", "output_tokens": 1e30}),
        SIM_W,
        "line 2.output_tokens: 1e+30 is over",
    ),
    (
        "session trace hash_ids 'x'",  # the sessions' reader took it as the ids ('x',)
        {
            "t.jsonl": _jsonl({**LINE, "hash_ids": "x"}),
            "w.yaml": "count: 1\narrival: {kind: closed, concurrency: 1}\n"
            "sessions: {kind: chat, dataset: {path: t.jsonl, format: mooncake}}\n",
        },
        [*SIM, "-w", "w.yaml"],
        "workload.sessions.dataset line 1.hash_ids: ",
    ),
]

EMPIRICAL = (
    "count: 5\n"
    "input_tokens: {dist: empirical, values: [10, 20], weights: [1.0e+308, 1.0e+308]}\n"
    "output_tokens: {dist: fixed, value: 10}\n"
)
MISSING = "count: 5\ndataset: {path: nowhere.jsonl}\n"
RUNS = {
    **{case: (files, argv) for case, files, argv, _ in SUBPROCESS},
    "empirical weights 1e308": ({"w.yaml": EMPIRICAL}, [*SIM_W, "--json"]),
    "dataset missing": ({"w.yaml": MISSING}, SIM_W),
}


def _write(where: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (where / name).write_text(text)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess]:
    """Every subprocess case's CLI run, started together, each in a folder of its files."""

    def run(case: str) -> subprocess.CompletedProcess:
        files, argv = RUNS[case]
        where = tmp_path_factory.mktemp("case")
        _write(where, files)
        env = {**os.environ, "SERVETUNE_DB": str(where / "st.db")}
        return subprocess.run(
            [sys.executable, "-m", "servetune.cli.app", *argv],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=where,
            env=env,
        )

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        return dict(zip(RUNS, pool.map(run, RUNS), strict=True))


def _one_error_line(res: subprocess.CompletedProcess) -> str:
    lines = res.stderr.splitlines()
    assert "Traceback" not in res.stderr, res.stderr
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    return lines[0]


def _names(line: str, files: dict[str, str], needle: str) -> None:
    """The line names the field, and the file to fix (a workload's: its .jsonl)."""
    assert needle in line, line
    if "hw.yaml" in files:
        assert "hw.yaml" in line, line
    elif "w.yaml" in files:
        assert ".jsonl" in line, line


@pytest.mark.parametrize(
    "case,needle", [(c[0], c[3]) for c in SUBPROCESS], ids=[c[0] for c in SUBPROCESS]
)
def test_a_bad_value_in_a_file_is_one_line_naming_it(
    runs: dict[str, subprocess.CompletedProcess], case: str, needle: str
) -> None:
    _names(_one_error_line(runs[case]), RUNS[case][0], needle)


@pytest.mark.parametrize(
    "files,args,needle", [c[1:] for c in IN_PROCESS], ids=[c[0] for c in IN_PROCESS]
)
def test_a_bad_line_in_a_trace_or_dataset_is_one_line_naming_it(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    files: dict[str, str],
    args: list[str],
    needle: str,
) -> None:
    _write(tmp_path, files)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SERVETUNE_DB", str(tmp_path / "st.db"))
    code, out, err = run_cli(capsys, *args)
    res = subprocess.CompletedProcess(args, code, out, err)
    _names(_one_error_line(res), files, needle)
    assert out == ""  # refused when the workload is read, before the run starts


def test_empirical_weights_whose_sum_overflows_are_normalised(
    runs: dict[str, subprocess.CompletedProcess],
) -> None:
    res = runs["empirical weights 1e308"]
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["completed"] == 5


def test_a_missing_dataset_is_refused_before_the_run_starts(
    runs: dict[str, subprocess.CompletedProcess],
) -> None:
    res = runs["dataset missing"]
    line = _one_error_line(res)
    assert line.startswith("error: workload.dataset.path: cannot read "), line
    assert "nowhere.jsonl" in line
    assert res.stdout == ""  # not after the simulator's preamble


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("prompt_tokens", -5, "requests.0.prompt_tokens: Input should be greater than or equal"),
        ("output_tokens", 10**12, "requests.0.output_tokens: Input should be less than or equal"),
    ],
)
def test_a_replayed_file_with_impossible_lengths_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, key: str, value: int, needle: str
) -> None:
    """A replayed bench file's requests are bounded as a workload's lengths are: -5 used to
    simulate (and 1e12 printed numpy cast warnings and 0 req/s)."""
    run = tmp_path / "run.json"
    chat = str(Path(__file__).resolve().parents[1] / "examples" / "workloads" / "chat.yaml")
    code, _, err = run_cli(
        capsys, "simulate", "-w", chat, "--count", "4", "--no-store", "-o", str(run)
    )
    assert code == 0, err
    data = json.loads(run.read_text())
    data["requests"] = [{"index": 0, "sub": "main", "prompt_tokens": 16, "output_tokens": 4}]
    data["requests"][0][key] = value
    run.write_text(json.dumps(data))
    code, out, err = run_cli(capsys, "simulate", "--replay", str(run), "--no-store")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and out == "", err
    assert lines[0].startswith("error: --replay: ") and needle in lines[0]
