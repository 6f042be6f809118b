"""Session workloads: fields that would be ignored are refused, and the per-session figures
reach the --json output of bench and simulate, not only the human line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from tests.cli_run import run_cli
from tests.test_sessions import chat, sim

from servetune.bench.runner import BenchOptions
from servetune.errors import InputError
from servetune.measure.real import ServerSession
from servetune.measure.session import Point
from servetune.mock.server import MockConfig, mock_in_thread
from servetune.workload.session_plan import plan_sessions
from servetune.workload.spec import parse_workload
from servetune.workload.tokenizer import WordTokenizer

FIXED = {"dist": "fixed", "value": 3}


@pytest.mark.parametrize("field", ["turns", "user_tokens", "output_tokens"])
def test_a_dataset_refuses_the_lengths_it_sets(field: str) -> None:
    wl = chat()
    wl["sessions"] = {"kind": "chat", "dataset": {"path": "builtin"}, field: FIXED}
    with pytest.raises(InputError, match=f"{field}: not read with a dataset"):
        parse_workload(wl)


def test_on_cap_end_session_needs_a_cap() -> None:
    with pytest.raises(InputError, match="on_cap end_session is read only with context_cap"):
        parse_workload(chat(on_cap="end_session"))
    assert parse_workload(chat(on_cap="end_session", context_cap_tokens=400))


def test_a_dumped_session_spec_loads_again() -> None:
    """A result's workload holds every default (on_cap drop_oldest, turns: null beside a
    dataset): reading it back must not trip the refusals above."""
    for wl in (chat(), {**chat(), "sessions": {"kind": "chat", "dataset": {"path": "builtin"}}}):
        dumped = parse_workload(wl).model_dump(mode="json")
        assert parse_workload(dumped).sessions is not None


def _workload(tmp_path: Path) -> str:
    path = tmp_path / "chat.yaml"
    wl = chat(count=3, users=1, turns={"dist": "fixed", "value": 2})
    path.write_text(yaml.safe_dump({"name": "chat", "api": "chat", **wl}))
    return str(path)


def test_simulate_json_carries_the_session_figures(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    args = ("simulate", "--gpu", "h100-sxm", "-w", _workload(tmp_path), "--no-store", "--json")
    code, out, err = run_cli(capsys, *args)
    assert code == 0, err
    ses = json.loads(out)["sessions"]
    assert ses["sessions"] == 3 and ses["followup"]["requests"] == 3
    assert ses["first"]["ttft_ms"]["p50"] > 0 and ses["resent_tokens"] > 0
    assert 0 < ses["allowed_hit_rate"] < 1


def test_bench_json_carries_the_session_figures(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with mock_in_thread(MockConfig(ttft_ms=5, itl_ms=1)) as srv:
        args = ("bench", "--url", f"http://127.0.0.1:{srv.port}", "-w", _workload(tmp_path),
                "--no-store", "--json")  # fmt: skip
        code, out, err = run_cli(capsys, *args)
    assert code == 0, err
    ses = json.loads(out)["sessions"]
    assert ses["sessions"] == 3 and ses["turns"] == 6 and ses["resent_tokens"] > 0


def test_json_of_a_run_without_sessions_has_no_sessions_key(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "w.yaml"
    fixed = {"dist": "fixed"}
    wl = {"name": "w", "count": 4, "arrival": {"kind": "closed", "concurrency": 1},
          "input_tokens": fixed | {"value": 64},
          "output_tokens": fixed | {"value": 8}}  # fmt: skip
    path.write_text(yaml.safe_dump(wl))
    code, out, err = run_cli(capsys, "simulate", "-w", str(path), "--no-store", "--json")
    assert code == 0, err
    assert "sessions" not in json.loads(out)


class TwoPerWord(WordTokenizer):
    """Two tokens per word: a dataset counted in words would ask for half the tokens."""

    name = "two-per-word"

    def encode(self, text: str) -> list[int]:
        return [i for w in super().encode(text) for i in (w, w)]

    def decode(self, ids: list[int]) -> str:
        return super().decode(ids[::2])


def test_bench_asks_a_dataset_sessions_replies_in_the_tokenizers_tokens() -> None:
    """The session worker re-plans the turns: it must count them with the tokenizer the
    requests were made with (it counted words: max_tokens half the reply's tokens)."""
    wl = chat(count=2, users=1)
    wl["sessions"] = {"kind": "chat", "dataset": {"path": "builtin"}}
    spec = parse_workload(wl)
    tok = TwoPerWord()
    planned = [r.output_tokens for r in plan_sessions(spec, tok, with_text=False).requests()]
    with mock_in_thread(MockConfig(ttft_ms=1, itl_ms=0.1)) as srv:
        opts = BenchOptions(url=f"http://127.0.0.1:{srv.port}", workers=1)
        res = ServerSession(opts, tok).measure(Point("ds", spec))
    records = sorted(res.records, key=lambda r: r.index)
    assert [r.max_tokens for r in records] == planned
    # the mock streams the max_tokens it is sent
    assert [r.usage_completion_tokens for r in records] == planned


def open_chat(cap: int | None) -> dict:
    wl = chat(count=12, think_time_s=0.01)
    wl["arrival"] = {"kind": "poisson", "rate": 50.0, "concurrency": cap}
    return wl


def test_an_open_loop_cap_holds_session_turns_in_the_client() -> None:
    """`concurrency` on an open-loop arrival caps the turns in flight, in bench as for
    single requests (it was ignored: 9 in flight under a cap of 1)."""
    spec = parse_workload(open_chat(2))
    with mock_in_thread(MockConfig(ttft_ms=20, itl_ms=2)) as srv:
        opts = BenchOptions(url=f"http://127.0.0.1:{srv.port}", workers=1)
        res = ServerSession(opts, WordTokenizer()).measure(Point("cap", spec))
    assert res.metrics.completed == len(res.records) == 48
    assert res.metrics.max_in_flight == 2
    assert srv.stats.max_running == 2
    assert max(r.queue_ns for r in res.records) > 0  # a turn waited in the client


def test_the_simulator_caps_an_open_loops_session_turns() -> None:
    capped = sim(open_chat(1))
    free = sim(open_chat(None))
    assert capped.metrics.completed == free.metrics.completed == 48
    assert capped.metrics.max_in_flight == 1 < free.metrics.max_in_flight

    # one turn at a time: the run takes the sum of the turns' times, not their overlap
    def span_s(res) -> float:
        return (max(r.end_ns for r in res.records) - min(r.send_ns for r in res.records)) / 1e9

    assert span_s(capped) > 5 * span_s(free)
