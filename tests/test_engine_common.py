"""Behaviour every installed engine shares: a busy port is a clear error, and a second
install is served from the cache without running any step."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from servetune.engines.process import EngineError, launch
from servetune.engines.testmodel import LLAMACPP_TEST_CONFIG, VLLM_TEST_CONFIG

# engine -> (install fixture, model fixture, launch config, expected version)
ENGINES = {
    "vllm": ("vllm_install", "llama_test_model", VLLM_TEST_CONFIG, "0.32.0"),
    "llamacpp": ("llamacpp_install", "gemma_gguf", LLAMACPP_TEST_CONFIG, "b11434"),
}


@pytest.mark.engine
@pytest.mark.timeout(60)  # refused before the engine starts: ~0.01 s
@pytest.mark.parametrize("engine", list(ENGINES))
def test_busy_port_is_a_clear_error(engine: str, request: pytest.FixtureRequest) -> None:
    install, model_fixture, config, _ = ENGINES[engine]
    request.getfixturevalue(install)
    model = request.getfixturevalue(model_fixture)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(EngineError) as err:
            launch(engine, config, str(model), device="cpu", port=port)
    assert err.value.kind == "port_in_use" and err.value.exit_code == 2
    assert f"port {port}" in str(err.value)


@pytest.mark.engine
@pytest.mark.timeout(120)  # reads a stamp and lists engines: ~0.5 s
@pytest.mark.parametrize("engine", list(ENGINES))
def test_install_is_cached(engine: str, request: pytest.FixtureRequest) -> None:
    """A second install only reads the stamp: no pip/cmake step, no change on disk."""
    from servetune.engines import install as inst

    install, _, _, version = ENGINES[engine]
    request.getfixturevalue(install)
    stamp, log = inst.engine_dir(engine) / "installed.json", inst.engine_dir(engine) / "install.log"
    before = (stamp.read_text(), log.stat().st_mtime_ns)
    installer = getattr(inst, f"install_{engine}")
    again = installer(say=lambda _: pytest.fail("cached install must not run any step"))
    assert again.source == "cache" and again.version == version
    assert (stamp.read_text(), log.stat().st_mtime_ns) == before
    listed = subprocess.run(
        [sys.executable, "-m", "servetune.cli.app", "engine", "list", "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    row = next(r for r in json.loads(listed.stdout) if r["engine"] == engine)
    assert row["installed"] and row["version"] == version and row["source"] == "cache"


def test_old_engine_run_dirs_are_pruned_newest_kept(tmp_path) -> None:
    import os

    from servetune.engines.process import prune_run_dirs

    for i in range(7):
        d = tmp_path / f"llamacpp-{i}"
        d.mkdir()
        (d / "engine.log").write_text("x")
        os.utime(d, (1_000_000 + i, 1_000_000 + i))
    (tmp_path / "stray-file").write_text("not a run dir")
    gone = prune_run_dirs(tmp_path, keep=3)
    assert sorted(p.name for p in gone) == [f"llamacpp-{i}" for i in range(4)]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "llamacpp-4", "llamacpp-5", "llamacpp-6", "stray-file",
    ]  # fmt: skip
    assert prune_run_dirs(tmp_path / "missing") == []


def test_a_run_dir_pruned_by_another_process_meanwhile_is_no_error(tmp_path, monkeypatch) -> None:
    """CI once failed here: the niced suite beside the engine tests pruned a run dir between
    this process's listing and its stat of that dir."""
    import os
    import shutil
    from pathlib import Path

    from servetune.engines.process import prune_run_dirs

    for i in range(5):
        d = tmp_path / f"vllm-{i}"
        d.mkdir()
        os.utime(d, (1_000_000 + i, 1_000_000 + i))
    listing = Path.iterdir

    def racing_iterdir(self: Path):
        yield from listing(self)
        shutil.rmtree(self / "vllm-0")  # the other process's prune, after our listing

    monkeypatch.setattr(Path, "iterdir", racing_iterdir)
    gone = prune_run_dirs(tmp_path, keep=2)
    monkeypatch.undo()
    assert {p.name for p in gone} <= {"vllm-0", "vllm-1", "vllm-2"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vllm-3", "vllm-4"]
