"""`servetune engine list`: per engine, can it run here and why, its version, metrics,
and whether the simulator models it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from servetune.engines import ENGINES, EngineConfig
from servetune.engines.registry import ADAPTERS
from servetune.engines.support import NEEDS_GPU, SIMULATED, support
from servetune.errors import InputError
from servetune.hardware import get_hardware
from servetune.model import get_model
from servetune.sim.engine import setup


def _row(engine: str, **kw: object):
    args: dict[str, object] = {
        "installed_version": None,
        "where": None,
        "installable": False,
        "how_to_install": "pip install it",
        "target_version": None,
        "has_gpu": False,
    }
    return support(engine, **(args | kw))  # type: ignore[arg-type]


def test_where_an_engine_stands() -> None:
    found = _row("vllm", installed_version="0.32.0", where="/venv/bin/python", installable=True)
    assert (found.here, found.version, found.why) == ("installed", "0.32.0", None)
    cached = _row("llamacpp", installable=True, target_version="b11434")
    assert (cached.here, cached.why, cached.version) == ("installable", "pip install it", "b11434")
    gpu_only = _row("sglang")
    assert gpu_only.here == "not on this machine" and "GPU" in (gpu_only.why or "")
    assert gpu_only.version == "0.5.23" and gpu_only.flags_checked == "0.5.23"
    assert _row("sglang", has_gpu=True).here == "installable"


def test_metrics_and_simulator_columns_follow_the_code() -> None:
    assert [e for e in ENGINES if _row(e).metrics] == ["vllm", "sglang", "tgi", "llamacpp"]
    model, hw = get_model("llama-3.1-8b"), get_hardware("h100-sxm")
    for engine in ENGINES:  # the planner's engines (EngineConfig.engine)
        simulated = _row(engine).simulator
        assert simulated == (engine in SIMULATED)
        if simulated:
            continue
        with pytest.raises(InputError, match="no scheduler model"):
            setup(model, hw, EngineConfig(engine=engine))  # type: ignore[arg-type]


@pytest.mark.timeout(60)
def test_engine_list_json_has_every_engine() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "servetune.cli.app", "engine", "list", "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = {r["engine"]: r for r in json.loads(out.stdout)}
    assert list(rows) == list(ADAPTERS)  # every adapter, the planner's engines first
    assert list(rows)[: len(ENGINES)] == list(ENGINES)
    assert {"mlx", "transformers"} <= set(rows)  # the engines launched here beyond those
    for r in rows.values():
        assert r["here"] in ("installed", "stale pins", "installable", "not on this machine"), r
        assert r["version"], r
        assert (r["here"] == "installed") == r["installed"] == (r["where"] is not None)
        if r["here"] != "installed":
            assert r["why"], r
    if not shutil.which("nvidia-smi"):
        for name in NEEDS_GPU:
            assert rows[name]["here"] in ("installed", "not on this machine")


@pytest.mark.timeout(60)
def test_an_install_of_older_pins_is_listed_as_stale_not_as_missing(tmp_path) -> None:
    """A cached install made under other pins is not run (`find` skips it); the listing
    said "installable", as if nothing were there. It says stale, and how to rebuild."""
    import os

    for name, pins in (("mlx", "mlx-lm==0.0.1"), ("transformers", None)):
        where = tmp_path / "engines" / name
        where.mkdir(parents=True)
        stamp = {"executable": sys.executable, "version": "0.0.1"}
        (where / "installed.json").write_text(json.dumps(stamp | ({"pins": pins} if pins else {})))
    env = {**os.environ, "SERVETUNE_CACHE": str(tmp_path)}
    for var in ("SERVETUNE_MLX_PYTHON", "SERVETUNE_TRANSFORMERS_PYTHON"):
        env.pop(var, None)
    out = subprocess.run(
        [sys.executable, "-m", "servetune.cli.app", "engine", "list", "--json"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = {r["engine"]: r for r in json.loads(out.stdout)}
    for name in ("mlx", "transformers"):  # pins of another day; a pre-pins stamp of 0.0.1
        r = rows[name]
        assert r["here"] == "stale pins" and not r["installed"], r
        assert sys.executable in r["why"] and f"servetune engine install {name}" in r["why"]
    text = subprocess.run(
        [sys.executable, "-m", "servetune.cli.app", "engine", "list"],
        capture_output=True, text=True, timeout=60, env=env,
    ).stdout  # fmt: skip
    assert "stale pins" in text and "engine install mlx` rebuilds it" in text
