"""Shared session fixtures: each real engine is installed (cached) and started ONCE per
test session, then reused by every test that asks for it.

    def test_something(vllm_server):          # an engines.process.EngineServer
        url = vllm_server.url                  # http://127.0.0.1:<free port>
        model = vllm_server.served_model       # the name to put in requests
        vllm_server.metrics().values           # canonical /metrics
        vllm_server.settings                   # effective settings (KV tokens, version)
        vllm_server.check()                    # raises EngineError if it died

Fixtures skip nothing: a missing engine is installed through servetune's own installer
(scripts/run.sh test pre-installs them so installs never run inside a test). The
engines are shared, so tests must leave them idle (no requests left running) and must
not change their settings; a test that needs other settings launches its own engine, or,
when another test needs the same settings, a session fixture here that both share
(vllm_small_kv_server): a vLLM start costs 30-65 s on a busy 2-core host.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# The engine settings the shared servers run with (defined next to the test models).
from servetune.engines.testmodel import LLAMACPP_TEST_CONFIG, VLLM_TEST_CONFIG

# Per-test time bounds that hold while bench sends load (tests/timeouts.py).
from timeouts import (
    pytest_runtest_call,
    pytest_runtest_setup,
    pytest_runtest_teardown,
    pytest_timeout_set_timer,
)

__all__ = [
    "LLAMACPP_TEST_CONFIG",
    "VLLM_SMALL_KV_CONFIG",
    "VLLM_TEST_CONFIG",
    "pytest_runtest_call",
    "pytest_runtest_setup",
    "pytest_runtest_teardown",
    "pytest_timeout_set_timer",
]


# A test that asks for a real engine is an engine test, marked or not: scripts/run.sh runs
# the timed engine tests one at a time, beside or after the rest (docs/testing.md).
ENGINE_FIXTURES = frozenset(
    {"vllm_install", "llamacpp_install", "vllm_server", "vllm_small_kv_server", "llamacpp_server"}
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if ENGINE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.engine)


@pytest.fixture(autouse=True)
def _private_store(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """bench/simulate record to ./servetune.db by default: point every test at its own
    throwaway database so the suite never writes into the checkout."""
    db = tmp_path_factory.mktemp("store") / "servetune.db"
    monkeypatch.setenv("SERVETUNE_DB", f"sqlite:///{db}")


@pytest.fixture(autouse=True)
def _idle_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tuner's host check (`tune.hostfit.check_host`) sees an idle host unless a test
    says otherwise: what other tests run beside it must not change what a study does."""
    import os

    monkeypatch.setattr(
        "servetune.tune.hostfit.others_now", lambda seconds=2.0: (os.cpu_count() or 2, 0.0)
    )


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty store's path, which the CLI under test reads (SERVETUNE_DB), and tables
    wide enough to print whole. Files that need runs in it build on this one."""
    path = tmp_path / "runs.db"
    monkeypatch.setenv("SERVETUNE_DB", str(path))
    monkeypatch.setenv("COLUMNS", "250")
    return path


def _say(msg: str) -> None:
    print(f"[servetune engines] {msg}", file=sys.stderr)


@pytest.fixture(scope="session")
def vllm_install():  # -> install.EngineInstall
    """vLLM's CPU build (installed into the cache on first use, seconds afterwards)."""
    from servetune.engines.install import install_vllm

    return install_vllm(say=_say)


@pytest.fixture(scope="session")
def llamacpp_install():  # -> install.EngineInstall
    """llama.cpp's llama-server (built into the cache on first use)."""
    from servetune.engines.install import install_llamacpp

    return install_llamacpp(say=_say)


@pytest.fixture(scope="session")
def llama_test_model() -> Path:
    """The generated small Llama directory (config + tokenizer, no weights)."""
    from servetune.engines.testmodel import make_llama_dir

    return make_llama_dir()


@pytest.fixture(scope="session")
def gemma_gguf() -> Path:
    """Gemma 3 270M Q4_K_M GGUF (base model: use /v1/completions)."""
    from servetune.engines.testmodel import gemma_gguf as fetch

    return fetch()


@pytest.fixture(scope="session")
def vllm_server(vllm_install, llama_test_model: Path) -> Iterator:
    """A running vLLM (CPU) with VLLM_TEST_CONFIG, warmed up; stopped at session end."""
    from servetune.engines.process import launch

    with launch("vllm", VLLM_TEST_CONFIG, str(llama_test_model), device="cpu") as srv:
        yield srv


# A vLLM whose KV pool is too small for the load the tests send it, shared by the tests
# that need one (diagnose: preemptions; sessions: evicted histories), so it starts once:
# 1,280 tokens (40 blocks of 32) while 8 users x 350 tokens want 2,800 and 3 chat
# histories grow to ~900 tokens each; max_model_len 1,024 fits the longest history.
VLLM_SMALL_KV_CONFIG = VLLM_TEST_CONFIG.model_copy(
    update={"max_model_len": 1024, "kv_cache_tokens": 1280, "max_num_seqs": 8}
)


@pytest.fixture(scope="session")
def vllm_small_kv_server(vllm_install, llama_test_model: Path) -> Iterator:
    """A running vLLM (CPU) with VLLM_SMALL_KV_CONFIG; stopped at session end."""
    from servetune.engines.process import launch

    with launch("vllm", VLLM_SMALL_KV_CONFIG, str(llama_test_model), device="cpu") as srv:
        yield srv


@pytest.fixture(scope="session")
def llamacpp_server(llamacpp_install, gemma_gguf: Path) -> Iterator:
    """A running llama-server with LLAMACPP_TEST_CONFIG, warmed up; stopped at session end."""
    from servetune.engines.process import launch

    with launch("llamacpp", LLAMACPP_TEST_CONFIG, str(gemma_gguf), device="cpu") as srv:
        yield srv
