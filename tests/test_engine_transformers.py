"""Hugging Face `transformers serve` (engine `transformers`): the adapter's mapping, its
flags against the installed CLI, and the real server launched with the seeded test Llama
(real weights) and measured by `servetune bench`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from servetune.engines import EngineConfig, flagcheck
from servetune.engines.registry import exports_metrics, launch_command

HELP = """\
Usage: transformers serve [OPTIONS] [FORCE_MODEL]

Options:
  --continuous-batching / --no-continuous-batching
                                  Enable continuous batching with paged
  --model-timeout INTEGER         Seconds before idle model is unloaded.
  --cb-max-memory-percent FLOAT   Max GPU memory fraction for KV cache
  --reasoning [on|off|auto]       Reasoning mode. 'auto' uses the chat
                                  template default. --not-a-flag here
  --device TEXT                   Device for inference (e.g. 'auto', 'cuda:0',
  -h, --help                      Show this message and exit.
"""


def test_click_help_is_read_as_flags_with_types_and_choices() -> None:
    flags = flagcheck.click_help_flags(HELP)
    assert flags == {
        "--continuous-batching": {"type": "switch"},
        "--no-continuous-batching": {"type": "switch"},
        "--model-timeout": {"type": "int"},
        "--cb-max-memory-percent": {"type": "float"},
        "--reasoning": {"type": "str", "choices": ["on", "off", "auto"]},
        "--device": {"type": "str"},
        "--help": {"type": "switch"},
    }


def test_adapter_says_what_maps_and_what_does_not() -> None:
    seq = launch_command("transformers", EngineConfig(tensor_parallel_size=2), "/m",
                         prefix=["py"], device="cpu")  # fmt: skip
    assert seq.argv == [
        "py", "-m", "transformers.cli.transformers", "serve", "/m",
        "--host", "127.0.0.1", "--port", "8000", "--device", "cpu",
    ]  # fmt: skip
    assert seq.unsupported == ["tensor_parallel_size"]
    assert seq.env["HF_HUB_OFFLINE"] == "1"
    assert any("client-side" in n for n in seq.notes)
    # more than one sequence at a time is continuous batching, with its KV knobs
    cfg = EngineConfig(max_num_seqs=4, kv_cache_tokens=1000, max_num_batched_tokens=512)
    cb = launch_command("transformers", cfg, "/m", device="cpu")
    assert cb.argv[-5:] == [
        "--continuous-batching", "--cb-max-batch-tokens", "512", "--cb-num-blocks", "4",
    ]  # fmt: skip
    assert cb.unsupported == []
    assert any("no cap on requests" in n for n in cb.notes)
    # without it those knobs mean nothing: said, not dropped silently
    one = launch_command("transformers", cfg.with_(max_num_seqs=1), "/m", device="cpu")
    assert "--continuous-batching" not in one.argv
    assert one.unsupported == ["max_num_batched_tokens", "kv_cache_tokens"]
    assert not exports_metrics("transformers")


def test_prompts_use_the_model_dirs_tokenizer_where_there_is_no_tokenize(tmp_path: Path) -> None:
    from servetune.engines.testmodel import make_llama_dir
    from servetune.measure.real import engine_tokenizer

    model = make_llama_dir()  # the test Llama's trained tokenizer (cached)
    url = "http://127.0.0.1:9"
    for engine in ("transformers", "mlx"):
        tok = engine_tokenizer(engine, url, str(model))
        assert tok.name == f"hf:{model / 'tokenizer.json'}"
        assert tok.decode(tok.encode(" hello world")) == " hello world"
        assert engine_tokenizer(engine, url, "org/hub-id").name == "word"
    assert engine_tokenizer("vllm", url, str(model)).name == f"server:{url}"


def test_only_openai_fields_are_sent_to_transformers_serve() -> None:
    from servetune.bench.client import spec_body
    from servetune.measure.real import engine_sampling
    from servetune.workload.spec import parse_workload

    spec = parse_workload(
        {"count": 2, "arrival": {"kind": "closed", "concurrency": 1},
         "input_tokens": {"dist": "fixed", "value": 8},
         "output_tokens": {"dist": "fixed", "value": 8}}
    )  # fmt: skip

    def body(engine: str | None) -> dict:
        fitted = engine_sampling(spec, engine)
        raw = spec_body(fitted, model="m", prompt="hi", messages=None, max_tokens=8)
        return json.loads(raw)

    # it answers 422 to vLLM's ignore_eos/min_tokens; the others keep them
    assert "ignore_eos" not in body("transformers") and "min_tokens" not in body("transformers")
    assert body("vllm")["ignore_eos"] is True and body("mlx")["min_tokens"] == 8
    assert body(None)["ignore_eos"] is True


@pytest.mark.timeout(120)
def test_bench_does_not_scrape_an_engine_without_metrics(tmp_path: Path) -> None:
    from servetune.mock.server import MockConfig, mock_in_thread

    (tmp_path / "w.yaml").write_text(
        "count: 2\narrival: {kind: closed, concurrency: 1}\n"
        "input_tokens: {dist: fixed, value: 8}\noutput_tokens: {dist: fixed, value: 4}\n"
    )
    deltas = {}
    with mock_in_thread(MockConfig(ttft_ms=5, itl_ms=2)) as srv:  # it does serve /metrics
        for engine in ("transformers", None):
            out = subprocess.run(
                [
                    sys.executable, "-m", "servetune.cli.app", "bench",
                    "--url", f"http://127.0.0.1:{srv.port}", "-w", str(tmp_path / "w.yaml"),
                    "--tokenizer", "word", "--no-store", "--json",
                    *(["--engine", engine] if engine else []),
                ],
                capture_output=True, text=True, timeout=100,
            )  # fmt: skip
            assert out.returncode == 0, out.stderr[-2000:]
            deltas[engine] = json.loads(out.stdout)["server_deltas"]
            said = "transformers exports no /metrics: every figure is client-side"
            assert (said in out.stderr) == (engine is not None)
    assert deltas["transformers"] is None  # not scraped: the run is client-side only
    assert deltas[None] is not None  # the same server, scraped when nothing says otherwise


def _venv_help() -> str:
    from servetune.engines.install import install_transformers

    found = install_transformers(say=lambda _: None)  # cached: reads the stamp
    cmd = [*found.prefix, "-m", "transformers.cli.transformers", "serve", "--help"]
    env = {"COLUMNS": "100", "HF_HUB_DISABLE_UPDATE_CHECK": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


@pytest.mark.engine
@pytest.mark.timeout(180)
def test_emitted_flags_exist_in_the_installed_cli() -> None:
    from servetune.engines.install import read_stamp

    data = flagcheck.load("transformers")
    live_flags = flagcheck.click_help_flags(_venv_help())
    live = flagcheck.EngineCli("transformers", "installed", "--help", live_flags, {})
    batching = EngineConfig(
        max_num_seqs=8,
        kv_cache_tokens=4096,
        dtype="float32",
        max_num_batched_tokens=256,
        gpu_memory_utilization=0.5,
    )
    cfgs = [EngineConfig(), batching]
    for cfg in cfgs:
        for device in ("cpu", "gpu"):
            spec = launch_command("transformers", cfg, "/m", device=device)  # type: ignore[arg-type]
            argv = spec.argv
            assert flagcheck.check_argv(live, argv) == [], argv
    stamp = read_stamp("transformers")
    assert stamp is not None
    if stamp["version"] == data.version:  # the checked-in file is exactly that CLI
        assert dict(live.flags) == dict(data.flags)


@pytest.fixture(scope="module")
def weights_model() -> Path:
    from servetune.engines.install import install_transformers
    from servetune.engines.testmodel import make_llama_weights

    install_transformers(say=lambda _: None)
    return make_llama_weights()


@pytest.mark.engine
@pytest.mark.timeout(360)
def test_serves_the_test_model_token_by_token_and_bench_measures_it(
    weights_model: Path, tmp_path: Path
) -> None:
    from servetune.engines.process import launch

    (tmp_path / "w.yaml").write_text(
        "api: completions\ncount: 4\narrival: {kind: closed, concurrency: 2}\n"
        "input_tokens: {dist: fixed, value: 16}\noutput_tokens: {dist: fixed, value: 8}\n"
    )
    # continuous batching (its warm-up is the launch's); float32: the test Llama's float16
    # weights decode ~2.8x slower on this CPU (docs/engines.md)
    cfg = EngineConfig(max_num_seqs=2, dtype="float32")
    with launch("transformers", cfg, str(weights_model), device="cpu", timeout_s=240) as srv:
        assert "--continuous-batching" in srv.spec.argv
        out = subprocess.run(
            [
                sys.executable, "-m", "servetune.cli.app", "bench", "--url", srv.url,
                "-w", str(tmp_path / "w.yaml"), "--tokenizer", str(weights_model),
                "--model", srv.served_model, "--engine", "transformers",
                "--json", "-o", str(tmp_path / "r.json"),
            ],
            capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        warmup_s = srv.warmup_s
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    m = result["metrics"]
    assert m["completed"] == 4 and m["failed"] == 0, m["errors_by_class"]
    # token by token: the buffered-stream detector does not flag it, and every request
    # has several content chunks (ITL gaps)
    assert not m["stream_buffered"]
    assert m["ttft_ms"]["count"] == 4 and m["itl_ms"]["count"] >= 4
    assert m["output_tokens"] > 0
    assert result["server_deltas"] is None  # no /metrics: not scraped, client-side only
    assert "transformers exports no /metrics: every figure is client-side" in out.stderr
    # the first continuous-batching request's warm-up (~25 s here) was paid at launch: no
    # measured request waited that long (or 5 s, should the warm-up be short)
    assert warmup_s is not None and m["ttft_ms"]["max"] < 1000 * max(warmup_s, 5.0)
