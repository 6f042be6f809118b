"""Bad input to plan / simulate / tune and their YAML files: one line naming the flag or
field, exit code 2, within seconds - never a traceback, a hang, or a run that ignores it.
One row per case of the bad-input probe (docs/errors.md); the CLI runs in this process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from tests.cli_run import run_cli

from servetune.errors import InputError
from servetune.tune.space import parse_space
from servetune.yamlfile import MAX_EXPANDED_NODES, expanded_size, load_yaml, parse_yaml

BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{','.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8)
)  # nine levels of nine aliases: 9^9 values once expanded
SYNTH = {
    "count": 20,
    "input_tokens": {"dist": "fixed", "value": 64},
    "output_tokens": {"dist": "fixed", "value": 16},
    "arrival": {"kind": "poisson", "rate": 2},
}


def _file(tmp: Path, name: str, data: object) -> str:
    p = tmp / name
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return str(p)


def _workload(tmp: Path, **changes: object) -> str:
    return _file(tmp, "w.yaml", {**SYNTH, **changes})


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    """The probe's input files, by name."""
    binary = tmp_path / "bin.dat"
    binary.write_bytes(b"\x8c\x00\xff\xfe binary \x80")
    t = tmp_path
    trace = t / "trace.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 64, "output_length": 8, "hash_ids": [1]}\n'
        '{"timestamp": 500, "input_length": 64, "output_length": 8, "hash_ids": [2]}\n'
    )
    return {
        "trace_wl": _file(
            t, "tw.yaml", {"trace": {"path": str(trace)}, "arrival": {"kind": "trace"}}
        ),
        "bin": str(binary),
        "ok": _workload(t),
        "dataset_bin": _file(
            t,
            "ds.yaml",
            {"count": 5, "arrival": SYNTH["arrival"], "dataset": {"path": str(binary)}},
        ),
        "tiny_rate": _file(t, "r.yaml", {**SYNTH, "arrival": {"kind": "poisson", "rate": 1e-308}}),
        "seed": _file(t, "seed.yaml", {**SYNTH, "seed": -1}),
        "out0": _file(t, "o0.yaml", {**SYNTH, "output_tokens": {"dist": "fixed", "value": 0}}),
        "count_true": _file(t, "ct.yaml", {**SYNTH, "count": True}),
        "huge_in": _file(t, "hi.yaml", {**SYNTH, "input_tokens": {"dist": "fixed", "value": 1e29}}),
        "bomb_name": _file(t, "bn.yaml", BOMB + yaml.safe_dump(SYNTH) + "name: *i\n"),
        "bomb_values": _file(
            t,
            "bv.yaml",
            BOMB
            + yaml.safe_dump({k: v for k, v in SYNTH.items() if k != "input_tokens"})
            + "input_tokens: {dist: empirical, values: *i}\n",
        ),  # fmt: skip
        "div0": _file(
            t,
            "s0.yaml",
            {"knobs": {"max_num_seqs": [8, 16]}, "constraints": ["max_num_seqs / 0 > 1"]},
        ),  # fmt: skip
        "huge_space": _file(
            t, "sh.yaml", {"knobs": {"max_num_seqs": {"min": 1, "max": 1e12, "step": 1}}}
        ),  # fmt: skip
        "slo_inf": _file(t, "slo.yaml", {"ttft_ms": {"p95": float("inf")}}),
        "nested": _file(t, "sn.yaml", {"knobs": {"max_num_seqs": [[8, 16]]}}),
        "fixed_and_knob": _file(
            t, "fk.yaml", {"fixed": {"max_num_seqs": 8}, "knobs": {"max_num_seqs": [16, 64]}}
        ),
        "fixed_foreign": _file(
            t, "ff.yaml", {"fixed": {"parallel_slots": 8}, "knobs": {"max_num_seqs": [16, 64]}}
        ),
        "db": str(t / "st.db"),
    }


SIM = ["simulate", "--no-store"]
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
TUNE = ["tune", "--backend", "sim", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "-q"]

# (case, argv with {file} names, what the one line names)
CAL = ["calibrate", "-m", "llama-3.1-8b", "-g", "h100-sxm", "-o", "p.json"]
ROWS = [
    ("workload binary", [*SIM, "-w", "{bin}"], "--workload: "),
    ("profile binary", [*SIM, "-w", "{ok}", "--profile", "{bin}"], "--profile: "),
    ("replay binary", [*SIM, "--replay", "{bin}"], "--replay: "),
    ("preset binary", ["tune", "--preset", "{bin}"], "--preset: "),
    ("dataset binary", [*SIM, "-w", "{dataset_bin}"], "workload.dataset.path: "),
    ("rate 1e-308", [*SIM, "-w", "{tiny_rate}"], "workload.arrival.rate: "),
    ("seed -1", [*SIM, "-w", "{seed}"], "workload.seed: "),
    ("constraint / 0", [*TUNE, "--space", "{div0}"], "space.constraints: "),
    ("tune --max-load -5", ["tune", "--max-load", "-5"], "--max-load: "),
    ("tune sim --max-load -5", [*TUNE, "--max-load", "-5"], "--max-load: "),
    ("plan --kv-cache-space inf", ["plan", "--kv-cache-space", "inf"], "--kv-cache-space: "),
    ("simulate -o missing dir", [*SIM, "-w", "{ok}", "-o", "/nonexistent/d/x.json"], "--output: "),
    ("anchor bomb name", [*SIM, "-w", "{bomb_name}"], "--workload: "),
    ("anchor bomb values", [*SIM, "-w", "{bomb_values}"], "--workload: "),
    ("space 1..1e12 step 1", [*TUNE, "--space", "{huge_space}"], "space.knobs.max_num_seqs: "),
    ("tune --trials 0", [*TUNE, "--trials", "0"], "--trials: "),
    ("simulate --gpus 0", [*SIM, "-w", "{ok}", "--gpus", "0"], "--gpus: "),
    # one bound for plan, simulate and tune (`plan.service.check_gpus`): plan printed
    # `--data-parallel-size 1000000000`
    (
        "plan --gpus 1e9",
        ["plan", "--gpus", "1000000000"],
        "--gpus: 1,000,000,000 is not allowed (give 1 to 100,000 GPUs)",
    ),
    ("simulate --gpus 1e9", [*SIM, "--gpus", "1000000000"], "give 1 to 100,000 GPUs"),
    ("tune --gpus 1e9", [*TUNE, "--gpus", "1000000000"], "give 1 to 100,000 GPUs"),
    ("block_size 7", [*SIM, "-w", "{ok}", "--set", "block_size=7"], "block_size: "),
    ("tp 3", [*SIM, "-w", "{ok}", "--set", "tensor_parallel_size=3"], "tensor_parallel_size: "),
    ("--rate inf", [*SIM, "-w", "{ok}", "--rate", "inf"], "--rate: "),
    ("--rate 1,,2", [*SIM, "-w", "{ok}", "--rate", "1,,2"], "--rate: '1,,2' has an empty item"),
    ("--concurrency 4,", [*SIM, "-w", "{ok}", "--concurrency", "4,"], "--concurrency: '4,' has"),
    ("output length 0", [*SIM, "-w", "{out0}"], "workload.output_tokens"),
    ("count: true", [*SIM, "-w", "{count_true}"], "count must be a number"),
    ("input 1e29", [*SIM, "-w", "{huge_in}"], "workload.input_tokens.value: "),
    ("simulate --db ''", ["simulate", "-w", "{ok}", "--db", ""], "--db: "),
    (
        "simulate data parallel",  # one replica simulated: its figures would ignore the rest
        [*SIM, "-w", "{ok}", "--set", "data_parallel_size=2"],
        "--set data_parallel_size: 2: the simulator runs one replica",
    ),
    (
        "simulate llama.cpp weights too big",  # it was simulated at 313 ms a token
        [*SIM, "-w", "{ok}", "--engine", "llamacpp", "--model", "llama-3.1-405b"],
        "config: the engine would not start: weights need 756.0 GiB",
    ),
    (
        "simulate bf16 on a T4",  # vLLM refuses it at start-up; it was simulated as served
        [*SIM, "-w", "{ok}", "--gpu", "t4", "--model", "llama-3.2-1b", "--set", "dtype=bfloat16"],
        "--set dtype: bfloat16 needs compute capability >= 8.0, and",
    ),
    ("tune --db ''", [*TUNE, "--db", ""], "--db: "),
    # what the study would not read: each ran as if not given
    ("tune sim --finalists", [*TUNE, "--finalists", "3"], "--finalists: only the real"),
    (
        "tune on requests no config serves",  # a best effort that blamed TTFT/TPOT, unmeasured
        [*TUNE, "--workload", str(EXAMPLES / "workloads" / "long-context.yaml")],
        "--workload: no config serves its longest request: prompt + output 29,263 tokens",
    ),
    (
        "space knob also fixed",  # the knob's values replaced the fixed one unseen
        [*TUNE, "--space", "{fixed_and_knob}"],
        "space.fixed.max_num_seqs: is also a knob",
    ),
    (
        "space fixed knob the engine lacks",  # kept in the winner, left out of its launch
        [*TUNE, "--space", "{fixed_foreign}"],
        "space.fixed.parallel_slots: vllm has no flag for parallel_slots",
    ),
    ("tune sim --top-k", [*TUNE, "--top-k", "5"], "--top-k: only the real engine's"),
    ("tune sim --recalibrate", [*TUNE, "--recalibrate"], "--recalibrate: only the real"),
    ("tune --gpu-hour-usd", [*TUNE, "--gpu-hour-usd", "2"], "--gpu-hour-usd: only --objective"),
    ("tune --ray-cpus", [*TUNE, "--ray-cpus", "4"], "--ray-cpus: only with --executor ray"),
    ("tune --study ../x", [*TUNE, "--study", "../../etc/x"], "--study: '../../etc/x' is not"),
    ("tune --study ''", [*TUNE, "--study", ""], "--study: '' is not a plain name"),
    ("--count 0", [*SIM, "-w", "{ok}", "--count", "0"], "--count: "),
    (
        "--count and --duration",  # the count ended the run first: --duration was dropped
        [*SIM, "-w", "{ok}", "--count", "5", "--duration", "3"],
        "--duration: --count and --duration both size the run",
    ),
    ("--count -1", [*SIM, "-w", "{ok}", "--count", "-1"], "--count: "),
    ("--rate nan", [*SIM, "-w", "{ok}", "--rate", "nan"], "--rate: "),
    ("--duration nan", [*SIM, "-w", "{ok}", "--duration", "nan"], "--duration: "),
    ("--rate 1e-308", [*SIM, "-w", "{ok}", "--rate", "1e-308"], "--rate: "),
    ("slo .inf", [*SIM, "-w", "{ok}", "--slo", "{slo_inf}"], "slo.ttft_ms.p95: "),
    ("--set a bool", [*SIM, "-w", "{ok}", "--set", "max_num_seqs=true"], "max_num_seqs must be"),
    (
        "--set a llama.cpp knob on vllm",
        [*SIM, "-w", "{ok}", "--engine", "vllm", "--set", "parallel_slots=4"],
        "--set parallel_slots: vllm has no flag for it: llama.cpp-only knob",
    ),
    (
        "bench --set a format vllm lacks",
        [
            "bench",
            "--url",
            "http://127.0.0.1:9",
            "--engine",
            "vllm",
            "--set",
            "quantization=q4_k_m",
        ],
        "--set quantization: vllm has no flag for it: vLLM has no 'q4_k_m' weight format",
    ),
    ("tune --seed -1", [*TUNE, "--seed", "-1"], "--seed: "),
    # numpy's and optuna's seeds are 32-bit; 1e308 req/s overflowed the rate lattice:
    # both were tracebacks
    ("tune --seed 2**32", [*TUNE, "--seed", "4294967296"], "--seed: Input should be less"),
    ("tune --max-load 1e308", [*TUNE, "--max-load", "1e308"], "--max-load: Input should be"),
    ("tune --gpus 0", [*TUNE, "--gpus", "0"], "--gpus: "),
    ("tune --gpus 3", [*TUNE, "--gpus", "3"], "--gpus: 3 does not divide"),
    (
        "tune --gpus 3, 8 KV heads",
        [*TUNE[:3], "--model", "minimax-m2.5", "--gpu", "h200", "-q", "--gpus", "3"],
        "--gpus: 3 neither divides the model's 8 KV heads nor is a multiple of them",
    ),
    # --gpus sets TP: its refusals name --gpus with plan's sizes (`check_gpus_as_tp`); the
    # simulator had named `--set tensor_parallel_size`, tune offered 16 on an 8-GPU node,
    # and `simulate --engine llamacpp --gpus 2` ran as if llama.cpp split tensors
    ("simulate --gpus 3", [*SIM, "-w", "{ok}", "--gpus", "3"], "--gpus: 3 does not divide"),
    (
        "tune --gpus 3, node sizes",
        [*TUNE[:3], "--model", "llama-3.1-70b", "--gpu", "h100-sxm", "-q", "--gpus", "3"],
        "heads (use one of 1, 2, 4, 8 (TP stays within one node))",
    ),
    (
        "simulate --gpus 16",
        [*SIM, "-w", "{ok}", "--gpus", "16"],
        "--gpus: 16 is more than the 8 GPUs in one h100-sxm node (tensor parallelism runs "
        "within a node) (use --set tensor_parallel_size=8 --set pipeline_parallel_size=2 for "
        "16 GPUs",
    ),
    ("tune --gpus 16", [*TUNE, "--gpus", "16"], "use a --space fixing tensor_parallel_size: 8"),
    (
        "simulate llamacpp --gpus 2",
        [*SIM, "-w", "{ok}", "--engine", "llamacpp", "--gpus", "2"],
        "--gpus: 2 sets tensor parallelism, which llamacpp has no flag for",
    ),
    (
        "tune llamacpp --gpus 2",
        ["tune", "--backend", "sim", "-q", "--gpus", "2"],
        "--gpus: 2 sets tensor parallelism, which llamacpp has no flag for",
    ),
    # a file given to another kind's flag is named for what it is (`filekinds.check_kind`);
    # it had read "unknown key 'ttft_ms' (known: name, seed, ...)", the keys it lacks
    (
        "SLO as --workload",
        [*SIM, "-w", str(EXAMPLES / "slo.yaml")],
        "workload: this reads as an SLO file, not a workload (keys: error_rate, "
        "kv_cache_usage_max, tpot_ms, ttft_ms) (give it with --slo)",
    ),
    (
        "workload as --slo",
        [*SIM, "-w", "{ok}", "--slo", str(EXAMPLES / "workloads" / "chat.yaml")],
        "slo: this reads as a workload file, not an SLO (keys: api, arrival, count, "
        "input_tokens, ...) (give it with --workload)",
    ),
    (
        "workload as --preset",
        ["tune", "--preset", str(EXAMPLES / "workloads" / "chat.yaml")],
        "--preset: this reads as a workload file, not a tune preset",
    ),
    (
        "preset as --workload",
        [*SIM, "-w", str(EXAMPLES / "tune" / "vllm-gpu.yaml")],
        "workload: this reads as a tune preset file, not a workload",
    ),
    (
        "SLO as --space",
        [*TUNE, "--space", str(EXAMPLES / "slo.yaml")],
        "space: this reads as an SLO file, not a search space",
    ),
    # an HTML output named for another format is refused before anything runs: `report -o
    # r.md` wrote HTML into it, nothing said (report's: test_report_fixes)
    ("tune --report r.json", [*TUNE, "--report", "/tmp/r.json"], "--report: /tmp/r.json: the"),
    (
        "accept --html a.md",
        ["accept", "--url", "http://127.0.0.1:1", "--engine", "vllm", "--html", "/tmp/a.md"],
        "--html: /tmp/a.md: the .md name says another format than HTML (name it .html)",
    ),
    (
        "simulate --extra a knob's flag",
        [*SIM, "-w", "{ok}", "--engine", "sglang", "--extra", "--tp-size 2"],
        "--extra: --tp-size is the tensor_parallel_size knob's flag (use --set "
        "tensor_parallel_size=N)",
    ),
    # a trace run given --duration names the flag (it named the file's duration_s)
    (
        "trace --duration",
        [*SIM, "-w", "{trace_wl}", "--duration", "2"],
        "--duration: a trace replays its own span (drop it; --count cuts it short)",
    ),
    (
        "trace --count above its lines",
        [*SIM, "-w", "{trace_wl}", "--count", "50"],
        "--count: 50 is more than the trace's 2 requests (give at most 2: a trace sends its "
        "own lines, --count cuts them short)",
    ),
    ("plan --tp 3", ["plan", "--gpus", "3", "--tp", "3"], "--tp: "),
    (
        "plan --tp 3, 8 KV heads",
        ["plan", "--model", "minimax-m2.5", "--gpu", "h200", "--gpus", "3", "--tp", "3"],
        "--tp: 3 neither divides the model's 8 KV heads nor is a multiple of them",
    ),
    ("plan --block-size 7", ["plan", "--block-size", "7"], "--block-size: "),
    ("plan cpu --block-size 48", ["plan", "--gpu", "cpu-host", "--block-size", "48"], "of 32"),
    ("space list in list", [*TUNE, "--space", "{nested}"], "space.knobs.max_num_seqs: "),
    ("--rate ''", [*SIM, "-w", "{ok}", "--rate", ""], "--rate: "),
    ("tune --max-load below 0.25", [*TUNE, "--max-load", "1e-308"], "--max-load: "),
    # calibrate checks the engine and its start-up rules before a sweep or a fit
    ("calibrate --engine bogus", [*CAL, "--engine", "bogus", "{ok}"], "engine: unknown engine"),
    (
        "calibrate tp 3",
        [*CAL, "--set", "tensor_parallel_size=3", "{ok}"],
        "tensor_parallel_size: 3",
    ),
    # a filter no run can match is refused, not an empty listing
    ("runs list --status bogus", ["runs", "list", "--status", "bogus"], "--status: unknown value"),
    ("runs list --backend x", ["runs", "list", "--backend", "x"], "--backend: unknown value 'x'"),
    # the tuner searches users or rates; a trace sets its own send times
    ("tune a trace workload", [*TUNE, "--workload", "{trace_wl}"], "--workload: a trace replays"),
    # an empty id, study or tag (an unset shell variable) names nothing
    ("runs show ''", ["runs", "show", ""], "'ref': an empty value names nothing"),
    ("runs delete '' -y", ["runs", "delete", "", "-y"], "'refs': an empty value names nothing"),
    ("runs tag last ''", ["runs", "tag", "last", ""], "'tags': an empty value names nothing"),
    ("report ','", ["report", ","], "RUNS: an empty value names nothing"),  # `$A,$B` unset
    # a knob set twice: the last one won, unsaid (`max-num-seqs` is max_num_seqs)
    (
        "simulate --set twice",
        [*SIM, "--set", "max_num_seqs=8", "--set", "max-num-seqs=16"],
        "--set max_num_seqs: given twice (give each knob once)",
    ),
    # a window no run can be in, and a flag the format would ignore
    (
        "runs export -f json --records",
        ["runs", "export", "-f", "json", "--records", "-o", "x.json"],
        "--records: applies to csv and parquet",
    ),
    # a tag is one word (`store.models.check_tag`): `x,y` stored whole showed as two tags
    # that no `--tag x` found; `simulate --tag ''` stored an empty one
    (
        "runs tag last 'x,y'",
        ["runs", "tag", "last", "x,y"],
        "TAGS: 'x,y' holds a comma or a blank (one word per tag, each its own: x y)",
    ),
    ("runs tag last 'a b'", ["runs", "tag", "last", "a b"], "TAGS: 'a b' holds a comma"),
    (
        "simulate --tag ''",
        ["simulate", "--count", "2", "--tag", ""],
        "--tag: an empty tag names nothing",
    ),
    (
        "bench --tag 'x,'",
        ["bench", "--url", "http://127.0.0.1:9", "--tag", "x,"],
        "--tag: 'x,' holds a comma or a blank (give x)",
    ),
    # a path given to diagnose is a path: a missing file is said so, not "no run or study"
    ("diagnose missing file", ["diagnose", "/nonexistent/r.json"], "RUN: no such file: /nonex"),
]


@pytest.mark.parametrize("args,needle", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_bad_input_is_one_line_naming_the_field_exit_2(
    capsys: pytest.CaptureFixture[str], files: dict[str, str], args: list[str], needle: str
) -> None:
    code, _, err = run_cli(capsys, *(a.format(**files) for a in args))
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert needle in lines[0]
    assert "pydantic" not in err and "validation error" not in err


def test_unknown_knob_lists_the_knobs_when_nothing_is_close(
    capsys: pytest.CaptureFixture[str], files: dict[str, str]
) -> None:
    code, _, err = run_cli(capsys, *SIM, "-w", files["ok"], "--set", "unknown_knob=1")
    assert code == 2 and "did you mean ?" not in err
    assert "knobs: " in err and "max_num_seqs" in err
    code, _, err = run_cli(capsys, *SIM, "-w", files["ok"], "--set", "max_num_seq=1")
    assert code == 2 and "did you mean max_num_seqs" in err


def test_count_and_rate_errors_name_the_flag_typed_not_concurrency(
    capsys: pytest.CaptureFixture[str], files: dict[str, str]
) -> None:
    for flag, value in (("--count", "0"), ("--duration", "nan"), ("--rate", "nan")):
        code, _, err = run_cli(capsys, *SIM, "-w", files["ok"], flag, value)
        assert code == 2 and err.startswith(f"error: {flag}: ") and "--concurrency" not in err


@pytest.mark.parametrize("kind", ["count", "duration"])
def test_a_closed_loop_whose_every_request_is_refused_ends_with_the_reason(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, kind: str
) -> None:
    """Prompts longer than the context: the engine refuses each, a closed-loop user sends
    the next at the same instant. Bounded by count it ends; bounded by duration it used to
    resend forever. Both now end with the engine's reason."""
    load = {"count": 20} if kind == "count" else {"duration_s": 30}
    w = _file(tmp_path, "w.yaml", {**{k: v for k, v in SYNTH.items() if k != "count"}, **load,
              "input_tokens": {"dist": "fixed", "value": 9000},
              "arrival": {"kind": "closed", "concurrency": 4}})  # fmt: skip
    out = tmp_path / "r.json"
    args = [*SIM, "-w", w, "--set", "max_model_len=4096", "-o", str(out)]
    code, _, err = run_cli(capsys, *args)
    assert code == 2 and "refuses all" in err and "exceeds max_model_len 4096" in err
    records = json.loads(out.read_text())["records"]  # the result is still written
    assert records and all(r["http_status"] == 400 for r in records)


def test_a_store_that_cannot_open_is_one_warning_and_json_says_nothing_stored(
    capsys: pytest.CaptureFixture[str], files: dict[str, str]
) -> None:
    args = ["simulate", "-w", files["ok"], "--json"]
    code, out, err = run_cli(capsys, *args, "--db", "/nonexistent/d/x.db")
    assert code == 0 and err.count("warning: experiment store off") == 1
    assert json.loads(out)["stored"] is False
    code, out, _ = run_cli(capsys, *args, "--db", files["db"])
    assert code == 0 and json.loads(out)["stored"] is True
    code, out, _ = run_cli(capsys, *args, "--no-store")
    assert code == 0 and json.loads(out)["stored"] is None


def test_alias_bombs_are_measured_on_the_node_graph_not_expanded(tmp_path: Path) -> None:
    assert parse_yaml("x: &a [1, 2]\ny: *a\n") == {"x": [1, 2], "y": [1, 2]}
    p = tmp_path / "b.yaml"
    p.write_text(BOMB)
    with pytest.raises(InputError, match="aliases expand to over 1,000,000 values"):
        load_yaml(p, "--workload")
    with pytest.raises(InputError, match="contains it"):  # expands forever
        p.write_text("a: &a [1, *a]\n")
        load_yaml(p, "--workload")
    import yaml as pyyaml

    six = pyyaml.compose(BOMB.split("g:")[0])  # a..f: 9^6 leaves under f
    assert expanded_size(six) > 9**6 and expanded_size(six) < MAX_EXPANDED_NODES


def test_ranges_are_counted_before_they_are_made() -> None:
    with pytest.raises(InputError, match="1,000,000,000,000 values"):
        parse_space({"knobs": {"max_num_seqs": {"min": 1, "max": 1e12, "step": 1}}})
    with pytest.raises(InputError, match="write 1.0e"):  # YAML 1.1 reads 1e12 as text
        parse_space({"knobs": {"max_num_seqs": {"min": 1, "max": "1e12", "step": 1}}})
    with pytest.raises(InputError, match="min > 0"):  # 0 x 2 x 2 ... never reaches max
        parse_space({"knobs": {"max_num_seqs": {"min": 0, "max": 64, "mult": 2}}})
    # a key a range has not, named (it read "needs min, max and mult" beside all three)
    with pytest.raises(InputError) as e:
        parse_space({"knobs": {"max_num_seqs": {"min": 8, "max": 64, "mul": 2}}})
    assert e.value.one_line() == (
        "space.knobs.max_num_seqs.mul: a range has no such key (did you mean mult?)"
    )
    space = parse_space({"knobs": {"max_num_seqs": {"min": 8, "max": 128, "mult": 2},
                                   "gpu_memory_utilization": {"min": 0.8, "max": 0.95,
                                                              "step": 0.05}}})  # fmt: skip
    assert space.knobs == {
        "max_num_seqs": (8, 16, 32, 64, 128),
        "gpu_memory_utilization": (0.8, 0.85, 0.9, 0.95),
    }


def test_the_engine_release_is_fixed_for_a_study_never_searched() -> None:
    """`engine_version` picks the simulator's CPU-side figures (kernels.yaml releases): a
    study holds it fixed, every trial's config carries it, and neither a search over it
    nor a value that is no release gets past the space."""
    space = parse_space(
        {"knobs": {"max_num_seqs": [16, 64]}, "fixed": {"engine_version": "0.18.0"}}
    )
    assert space.baseline_config().engine_version == "0.18.0"
    assert {space.config(p).engine_version for p in space.points()} == {"0.18.0"}
    with pytest.raises(InputError, match="put engine_version under space.fixed"):
        parse_space({"knobs": {"engine_version": ["0.11.0", "0.18.0"]}})
    with pytest.raises(InputError, match="a release such as 0.15.1") as e:
        parse_space({"knobs": {"max_num_seqs": [16]}, "fixed": {"engine_version": "latest"}})
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "command",
    [
        ["accept"],
        ["diagnose"],
        ["monitor", "export"],
        ["quality"],
        ["report"],
        ["bench"],
        ["simulate"],
        ["calibrate"],
    ],  # fmt: skip
)
def test_every_store_flag_says_the_variable_it_honours(
    capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """One --db option (`cli.bench_cmd.DB_OPTION`): accept's own said ./servetune.db and
    read $SERVETUNE_DB."""
    code, out, _ = run_cli(capsys, *command, "--help")
    assert code == 0 and "$SERVETUNE_DB" in " ".join(out.split()), out


def test_a_window_no_run_can_be_in_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`--since` after `--until` listed 0 runs and said nothing: a swap, named."""
    db = str(tmp_path / "st.db")
    code, _, err = run_cli(capsys, "simulate", "--count", "2", "--db", db)
    assert code == 0, err
    window = ["--since", "2030-01-01", "--until", "2020-01-01", "--db", db]
    code, _, err = run_cli(capsys, "runs", "list", *window)
    assert code == 2 and err.strip() == (
        "error: --until: 2020-01-01 is before --since 2030-01-01 (swap the two)"
    ), err
    code, out, _ = run_cli(capsys, "runs", "list", "--since", "2020-01-01", "--db", db)
    assert code == 0 and "1 run" in out, out
