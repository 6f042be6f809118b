"""The files in examples/ are what the docs tell users to run: every workload loads and
runs in `servetune simulate` (the command its own header comment gives, shortened with
--count), the SLO parses, every tune space parses and is the built-in preset itself (one
copy), and the docs name no example file that does not exist."""

from __future__ import annotations

import json
import re
import shlex
from importlib import resources
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servetune.cli.app import app
from servetune.slo import load_slo
from servetune.tune.preset import BUILTIN, load_preset
from servetune.tune.space import load_space
from servetune.workload.spec import load_workload

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
WORKLOADS = sorted((EXAMPLES / "workloads").glob("*.yaml"))
SPACES = sorted((EXAMPLES / "tune").glob("*.yaml"))
COUNT = 12  # requests per point: enough to exercise the scheduler, fast


def simulate(*args: str) -> list[dict]:
    """`servetune simulate ... --json` in-process, every point's summary."""
    res = CliRunner().invoke(app, ["simulate", *args, "--no-store", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    return out if isinstance(out, list) else [out]


def header_commands(path: Path) -> list[list[str]]:
    """The `servetune simulate` commands in a file's header comment (`\\` continues)."""
    lines = [ln.lstrip("#").strip() for ln in path.read_text().splitlines() if ln.startswith("#")]
    text = "\n".join(lines).replace("\\\n", " ")
    return [shlex.split(ln)[2:] for ln in text.splitlines() if ln.startswith("servetune simulate")]


def test_the_examples_are_there() -> None:
    names = {p.stem for p in WORKLOADS}
    assert names == {"chat", "rag", "long-context", "shared-prefix", "bursty"}
    assert {p.stem for p in SPACES} == set(BUILTIN)


@pytest.mark.parametrize("path", WORKLOADS, ids=lambda p: p.stem)
def test_each_workload_runs_in_simulate_with_the_slo(path: Path) -> None:
    spec = load_workload(path)
    assert spec.name == path.stem
    (point,) = simulate("--workload", str(path), "--slo", str(EXAMPLES / "slo.yaml"),
                        "--count", str(COUNT))  # fmt: skip
    assert point["completed"] == COUNT and point["rejected"] == 0
    assert point["slo_pass"] is not None and point["goodput_req_s"] is not None


@pytest.mark.parametrize("path", WORKLOADS, ids=lambda p: p.stem)
def test_the_commands_in_each_header_run(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the commands name examples/ from the repository root
    commands = header_commands(path)
    assert commands, f"{path.name} shows no servetune simulate command"
    for args in commands:
        points = simulate(*args, "--count", str(COUNT))
        loads = next((a for i, a in enumerate(args) if args[i - 1] in ("--rate", "--concurrency")),
                     None)  # fmt: skip
        assert len(points) == (len(loads.split(",")) if loads else 1)
        assert all(p["completed"] == COUNT and p["rejected"] == 0 for p in points), args


def test_the_shared_prefix_example_hits_the_prefix_cache() -> None:
    path = str(EXAMPLES / "workloads" / "shared-prefix.yaml")
    on, off = (
        simulate("--workload", path, "--count", "40", "--set", f"enable_prefix_caching={v}")[0]
        for v in ("true", "false")
    )
    # 40 requests over 8 prompts of 2,000 tokens (125 whole blocks of 16): the first of
    # each group misses, the other 32 reuse all of it.
    assert on["prefix_hit_tokens"] >= 32 * 2000 and off["prefix_hit_tokens"] == 0
    assert on["ttft_ms"]["p50"] < off["ttft_ms"]["p50"]


def test_the_slo_is_the_chat_slo_of_seed_003() -> None:
    slo = load_slo(EXAMPLES / "slo.yaml")
    assert slo.per_request() == {"ttft_ms": 800, "tpot_ms": 40}
    assert slo.ttft_ms is not None and slo.ttft_ms.p99 == 2000
    assert slo.error_rate == 0.001 and slo.kv_cache_usage_max == 0.9


@pytest.mark.parametrize("path", SPACES, ids=lambda p: p.stem)
def test_each_tune_space_parses_and_is_the_builtin_preset(path: Path) -> None:
    builtin = resources.files("servetune").joinpath("data", "tune", BUILTIN[path.stem])
    assert path.resolve() == Path(str(builtin)).resolve()  # a link, not a second copy
    space = load_space(path)
    assert space.size > 1 and space.valid_points()
    assert load_preset(str(path)) == load_preset(path.stem)


DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_docs_name_only_example_files_that_exist() -> None:
    named = set()
    for doc in DOCS:
        text = doc.read_text()
        named |= set(re.findall(r"examples/[\w./-]+\.yaml", text))
        # a workload, SLO or space file the user would have to write first
        imaginary = re.findall(r"(?<![\w./-])(?:chat|slo|space)\.yaml", text)
        assert not imaginary, f"{doc.name} uses {imaginary}: point at examples/"
    assert {f"examples/workloads/{p.name}" for p in WORKLOADS} <= named
    assert "examples/slo.yaml" in named
    missing = sorted(n for n in named if not (ROOT / n).is_file())
    assert not missing, missing


def test_every_link_into_examples_resolves() -> None:
    links = 0
    for doc in [*DOCS, EXAMPLES / "README.md"]:
        for target in re.findall(r"\]\(([^)#\s]+)", doc.read_text()):
            path = (doc.parent / target).resolve()
            if path.is_relative_to(EXAMPLES) or doc.parent == EXAMPLES:
                links += 1
                assert path.exists(), f"{doc.name}: {target}"
    assert links >= 15
