"""MLX (mlx-lm's server, CPU build) installed from the cache, launched with the seeded
random-weight test Llama, and benchmarked with `servetune bench`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from servetune.engines import EngineConfig
from servetune.engines.registry import launch_command

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def mlx_model() -> Path:
    from servetune.engines.install import install_mlx
    from servetune.engines.testmodel import make_llama_weights

    install_mlx(say=lambda _: None)  # cached: reads the stamp (about 30 s the first time)
    return make_llama_weights()


@pytest.mark.timeout(30)  # an engine-marked file: every test names its bound
def test_adapter_says_what_maps_and_what_does_not() -> None:
    cfg = EngineConfig(max_num_seqs=4, max_num_batched_tokens=512, tensor_parallel_size=2)
    spec = launch_command("mlx", cfg, "/m", prefix=["py"])
    assert spec.argv == [
        "py", "-m", "mlx_lm.server", "--model", "/m", "--host", "127.0.0.1", "--port", "8080",
        "--decode-concurrency", "4", "--prefill-step-size", "512",
    ]  # fmt: skip
    assert spec.unsupported == ["tensor_parallel_size"]
    assert spec.env["HF_HUB_OFFLINE"] == "1"
    assert any("client-side" in n for n in spec.notes)


@pytest.mark.timeout(300)
def test_mlx_serves_the_test_model_and_bench_measures_it(mlx_model: Path, tmp_path: Path) -> None:
    from servetune.engines.process import launch

    (tmp_path / "w.yaml").write_text(
        "count: 4\narrival: {kind: closed, concurrency: 2}\n"
        "input_tokens: {dist: fixed, value: 16}\noutput_tokens: {dist: fixed, value: 6}\n"
    )
    cfg = EngineConfig(max_num_seqs=2)
    with launch("mlx", cfg, str(mlx_model), device="cpu", timeout_s=180) as srv:
        out = subprocess.run(
            [
                sys.executable, "-m", "servetune.cli.app", "bench", "--url", srv.url,
                "-w", str(tmp_path / "w.yaml"), "--tokenizer", str(mlx_model),
                "--model", srv.served_model,
                "--no-scrape", "--json", "-o", str(tmp_path / "r.json"),
            ],
            capture_output=True, text=True, timeout=240,
        )  # fmt: skip
    assert out.returncode == 0, out.stderr
    m = json.loads(out.stdout)["metrics"]
    # `: keepalive` comment lines come before the first data line: still 4 clean answers
    # with token timing (MLX streams token by token, not buffered).
    assert m["completed"] == 4 and m["failed"] == 0, m["errors_by_class"]
    assert not m["stream_buffered"]
    assert m["ttft_ms"]["count"] == 4 and m["itl_ms"]["count"] > 0
    assert m["output_tokens"] > 0
