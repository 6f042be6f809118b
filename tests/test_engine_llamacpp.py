"""llama.cpp's llama-server for real (Gemma 3 270M Q4_K_M): launch from an EngineConfig,
stream, metrics, effective settings from /props and /slots, clean stop, and the errors
a user meets. Shares one server (conftest.llamacpp_server); some tests start their own.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from cli_run import run_cli
from servetune.engines.process import EngineError, launch, pid_alive
from servetune.engines.testmodel import LLAMACPP_TEST_CONFIG
from servetune.measure.real import server_engine
from servetune.results.files import load_result
from streaming import stream_completion

# Bound per test, engine start included: ~10x the slowest here on a busy 2-core host (two
# detached engines started and stopped, 33 s).
pytestmark = [pytest.mark.engine, pytest.mark.timeout(300)]


def test_streaming_completion_returns_tokens(llamacpp_server) -> None:
    out = stream_completion(
        llamacpp_server.url, llamacpp_server.served_model, "The capital of France is", 16
    )
    assert out["usage"]["completion_tokens"] == 16
    assert len(out["chunks"]) >= 8
    assert "".join(out["chunks"]).strip()


def test_metrics_map_to_canonical_names(llamacpp_server) -> None:
    before = llamacpp_server.metrics()
    stream_completion(llamacpp_server.url, llamacpp_server.served_model, "One, two, three,", 8)
    after = llamacpp_server.metrics()
    v, b = after.values, before.values
    assert v["generation_tokens_total"] - b["generation_tokens_total"] >= 8
    assert v["prompt_tokens_total"] >= b["prompt_tokens_total"]
    assert v["requests_running"] == 0 and v["requests_waiting"] == 0
    assert v["decode_calls_total"] > b["decode_calls_total"]
    assert 0 < v["busy_slots_per_decode"] <= LLAMACPP_TEST_CONFIG.parallel_slots
    assert v["generation_seconds_total"] > b["generation_seconds_total"]


@pytest.mark.untimed
def test_bench_names_the_engine_from_its_metrics(
    llamacpp_server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --engine, bench read llama.cpp's /metrics under raw names: no canonical
    series for diagnose, which then named vLLM's knobs for this server. Without
    --tokenizer, its 64-word prompts are ~64 of Gemma 3's tokens (plus the chat
    template's ~24); synthetic words ("w3484") made them ~300."""
    assert server_engine(llamacpp_server.url) == "llamacpp"
    out = tmp_path / "run.json"
    args = ["--concurrency", "1", "--count", "2", "--input-len", "64", "--output-len", "4",
            "--no-store"]  # fmt: skip
    code, _, err = run_cli(capsys, "bench", "--url", llamacpp_server.url, *args, "-o", str(out))
    assert code == 0, err
    assert "engine: llamacpp, named by its /metrics" in err
    res = load_result(out)
    assert res.target.engine == "llamacpp"
    assert res.server is not None and res.server.series("requests_running")
    served = [r.usage_prompt_tokens for r in res.records]
    assert all(r.prompt_tokens == 64 for r in res.records)
    assert all(s is not None and 64 <= s <= 100 for s in served), served


def test_effective_settings_from_props_and_slots(llamacpp_server) -> None:
    s = llamacpp_server.settings
    assert s["total_slots"] == 2
    # -c 4096 split over -np 2 slots (no --kv-unified): 2,048 tokens each = max_model_len.
    assert s["slot_ctx_tokens"] == 2048
    assert s["slot_ctx_tokens_each"] == [2048, 2048]
    assert s["version"]
    assert str(s["model_path"]).endswith(".gguf")


def test_stop_leaves_no_process(llamacpp_install, gemma_gguf) -> None:
    srv = launch("llamacpp", LLAMACPP_TEST_CONFIG, str(gemma_gguf), device="cpu", warmup=False)
    pids = srv.pids()
    assert srv.pid in pids
    srv.stop()
    assert not [p for p in pids if pid_alive(p)]
    assert srv.proc.returncode is not None


@pytest.mark.untimed
def test_invalid_flag_quotes_the_engine_log(llamacpp_install, gemma_gguf) -> None:
    cfg = LLAMACPP_TEST_CONFIG.with_(extra_args=("--no-such-flag",))
    with pytest.raises(EngineError) as err:
        launch("llamacpp", cfg, str(gemma_gguf), device="cpu", timeout_s=60)
    e = err.value
    assert e.kind == "bad_flag" and e.exit_code == 2
    assert "--no-such-flag" in str(e) and "engine log:" in str(e)


@pytest.mark.untimed
def test_too_large_kv_quotes_the_engine_log(llamacpp_install, gemma_gguf) -> None:
    # Gemma 3 270M keeps ~3 KiB of KV per token: ask for a pool 4x the machine's RAM.
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    cfg = LLAMACPP_TEST_CONFIG.with_(kv_cache_tokens=4 * ram // 3072, parallel_slots=1)
    with pytest.raises(EngineError) as err:
        launch("llamacpp", cfg, str(gemma_gguf), device="cpu", timeout_s=120)
    e = err.value
    assert e.kind == "oom" and e.exit_code == 2
    assert "insufficient memory" in str(e) or "failed to allocate" in str(e)


def test_cli_launch_serves_until_interrupted(llamacpp_install, gemma_gguf) -> None:
    """`servetune engine launch` prints the ready record, then Ctrl-C/SIGTERM stops it all."""
    cmd = [
        sys.executable, "-m", "servetune.cli.app", "engine", "launch", "llamacpp",
        "-m", str(gemma_gguf), "--set", "parallel_slots=1", "--set", "max_model_len=1024",
        "--set", "threads=1", "--timeout", "120", "--json",
    ]  # fmt: skip
    # --timeout bounds the read below: not ready by then, the CLI exits and stdout ends
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in proc.stdout:  # the JSON record ends with a lone "}"
            lines.append(line)
            if line.rstrip() == "}":
                break
        record = json.loads("".join(lines))
        assert httpx.get(record["url"] + "/health", timeout=5).status_code == 200
        assert record["settings"]["slot_ctx_tokens"] == 1024
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not pid_alive(record["pid"])


def _live_procs() -> list[int]:
    """Every process that is not a zombie, read straight from /proc."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if "\nState:\tZ" not in Path(f"/proc/{entry}/status").read_text():
                found.append(int(entry))
    return found


def _group_members(pgid: int) -> list[int]:
    found = []
    for pid in _live_procs():
        with contextlib.suppress(ProcessLookupError):
            if os.getpgid(pid) == pgid:
                found.append(pid)
    return found


def _cwd_under(folder: Path) -> list[int]:
    """Live PIDs whose working directory is inside `folder` (engines run in their run dir)."""
    found = []
    for pid in _live_procs():
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/cwd").startswith(str(folder)):
                found.append(pid)
    return found


def test_detach_ps_stop_leave_no_orphan(llamacpp_install, gemma_gguf, tmp_path, monkeypatch):
    """Two detached llama-servers: the CLI returns once each serves; one dies behind
    servetune's back and `ps` shows it dead; `stop` ends the other's whole process group;
    `stop --all` cleans the dead entry; then there is nothing left to stop."""
    cache = tmp_path / "cache"  # a private state file; the engine comes from --executable
    monkeypatch.setenv("SERVETUNE_CACHE", str(cache))

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "servetune.cli.app", "engine", *args],
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip

    def ps() -> dict[str, str]:
        return {row["id"]: row["state"] for row in json.loads(cli("ps", "--json").stdout)}

    launch_args = (
        "launch", "llamacpp", "-m", str(gemma_gguf), "--executable", llamacpp_install.where,
        "--set", "parallel_slots=1", "--set", "max_model_len=512", "--set", "threads=1",
        "--timeout", "120", "--detach", "--json",
    )  # fmt: skip
    try:
        records = []
        for _ in range(2):
            out = cli(*launch_args)
            assert out.returncode == 0, out.stderr
            records.append(json.loads(out.stdout))
        live, dead = records
        for rec in records:  # the launching CLI has exited; the engines still serve
            assert httpx.get(rec["url"] + "/health", timeout=5).status_code == 200
            assert Path(rec["log"]).is_relative_to(cache)
        assert ps() == {live["id"]: "alive", dead["id"]: "alive"}

        os.killpg(dead["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while pid_alive(dead["pid"]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ps() == {live["id"]: "alive", dead["id"]: "dead"}

        group = _group_members(live["pid"])
        assert live["pid"] in group
        out = cli("stop", live["id"])
        assert out.returncode == 0 and out.stdout.startswith(f"stopped {live['id']}")
        assert not [p for p in group if pid_alive(p)]
        assert _group_members(live["pid"]) == []
        assert ps() == {dead["id"]: "dead"}

        out = cli("stop", "--all")
        assert out.returncode == 0 and "already exited" in out.stdout
        assert ps() == {}
        again = cli("stop", "--all")
        assert again.returncode == 2 and "nothing to stop" in again.stderr
    finally:  # whatever a failure left running, found by its run dir
        for pid in _cwd_under(cache):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(os.getpgid(pid), signal.SIGKILL)
    assert not _cwd_under(cache)  # nothing was left for the clean-up to kill


@pytest.mark.untimed
def test_the_adapters_aliases_are_the_engines_own(llamacpp_install) -> None:
    """`llamacpp.ALIASES` (an --extra `--parallel` repeats the emitted `-np`) lists only
    spellings llama-server's own --help gives on one option's line."""
    from engine_help import missing_aliases
    from servetune.engines.llamacpp import ALIASES

    argv = [*llamacpp_install.prefix, "--help"]
    assert missing_aliases(ALIASES, argv, dict(os.environ)) == []
