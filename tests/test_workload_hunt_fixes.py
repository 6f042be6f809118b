"""Workload files that ran something other than what they say, or gave a traceback: found by
a bug hunt over the spec, the materialiser and the dataset readers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from servetune.errors import InputError
from servetune.workload.materialize import arrival_offsets_s, materialize
from servetune.workload.session_plan import plan_sessions
from servetune.workload.spec import parse_workload
from servetune.workload.tokenizer import WordTokenizer

FIXED = {"dist": "fixed", "value": 8}
CLOSED = {"count": 4, "arrival": {"kind": "closed", "concurrency": 1}}


def synthetic(**sub) -> dict:
    return {**CLOSED, "input_tokens": FIXED, "output_tokens": FIXED, **sub}


@pytest.mark.parametrize(
    ("workload", "field", "says"),
    [
        ({**CLOSED, "mix": [{"input_tokens": FIXED, "output_tokens": FIXED},
                            {"input_tokens": {"dist": "fixed", "value": 90},
                             "output_tokens": FIXED}]},
         "workload", "two entries named 'default'"),
        (synthetic(input_tokens={"dist": "fixed", "value": 100}, prefix={"tokens": 500}),
         "workload:", "prefix.tokens (500) leaves no room in input_tokens (at most 100)"),
        (synthetic(input_tokens={"dist": "lognormal", "mean": 900, "sigma": 0.5, "max": 400},
                   prefix={"tokens": 400}),
         "workload:", "at most 400"),
        (synthetic(input_tokens={"dist": "empirical", "values": [100, 200], "counts": [9, 1]}),
         "workload.input_tokens:", "counts, bin_edges: not read with values"),
        (synthetic(sampling={"temperature": -1}), "workload.sampling.temperature",
         "greater than or equal to 0"),
        (synthetic(sampling={"extra_body": {"max_completion_tokens": 5}}),
         "workload.sampling", "max_completion_tokens set by servetune itself"),
    ],
    ids=["same-name", "prefix-fixed", "prefix-max", "empirical", "temperature", "extra-body"],
)  # fmt: skip
def test_a_field_that_would_run_something_else_is_refused(workload, field, says) -> None:
    with pytest.raises(InputError) as exc:
        parse_workload(workload)
    line = str(exc.value)
    assert field in line and says in line and "\n" not in line


def test_a_prefix_with_room_for_the_prompts_own_tokens_is_kept() -> None:
    spec = parse_workload(
        synthetic(input_tokens={"dist": "uniform", "low": 50, "high": 120}, prefix={"tokens": 100})
    )
    reqs = materialize(spec, WordTokenizer())
    assert all(101 <= r.prompt_tokens <= 120 for r in reqs)


def chat(**ses) -> dict:
    return {**CLOSED, "sessions": {"kind": "chat", **ses}}


LENGTHS = {"turns": {"dist": "fixed", "value": 2}, "user_tokens": FIXED, "output_tokens": FIXED}


@pytest.mark.parametrize(
    ("think", "says"),
    [
        (1.0e300, "less than or equal to 86400"),
        ({"dist": "lognormal", "mean": 1, "sigma": 1e200}, "less than or equal to 10"),
    ],
)
def test_a_delay_past_a_day_is_refused_in_one_line(think, says: str) -> None:
    """1e300 s ran with int64 overflow warnings and 0 ms latencies; sigma 1e200 was an
    OverflowError traceback."""
    with pytest.raises(InputError, match=says):
        parse_workload(chat(**LENGTHS, think_time_s=think))


def test_a_mooncake_sessions_trace_refuses_a_think_time(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({"timestamp": 0, "input_length": 9, "output_length": 2}) + "\n")
    ds = {"path": str(path), "format": "mooncake"}
    with pytest.raises(InputError, match="think_time_s: not read with a mooncake trace"):
        parse_workload(chat(dataset=ds, think_time_s=30))
    assert parse_workload(chat(dataset=ds)).sessions is not None


@pytest.mark.parametrize(("rate", "duration"), [(10, 1.0), (7, 1.0), (5, 10.0), (10, 10.0)])
def test_constant_arrivals_send_rate_times_duration(rate: float, duration: float) -> None:
    """The summed gaps put the (rate x duration + 1)th send at 0.999999999 s of 1 s."""
    t = arrival_offsets_s("constant", rate, np.random.default_rng(0), duration_s=duration)
    assert len(t) == round(rate * duration) and t[-1] < duration


def trace(tmp_path: Path, rows: int) -> str:
    path = tmp_path / "t.jsonl"
    lines = [{"timestamp": 10 * i, "input_length": 9, "output_length": 2} for i in range(rows)]
    path.write_text("\n".join(json.dumps(x) for x in lines))
    return str(path)


def test_a_trace_at_another_rate_stops_at_the_duration(tmp_path: Path) -> None:
    """100 lines at 50 req/s for 0.5 s: ~25 sends, not all 100 over 2 s."""
    spec = parse_workload(
        {"trace": {"path": trace(tmp_path, 100)}, "duration_s": 0.5,
         "arrival": {"kind": "poisson", "rate": 50.0}}
    )  # fmt: skip
    reqs = materialize(spec, WordTokenizer())
    assert 10 <= len(reqs) <= 45 and max(r.arrival_s or 0 for r in reqs) < 0.5
    short = parse_workload({**spec.model_dump(mode="json"), "duration_s": 60.0})
    assert len(materialize(short, WordTokenizer())) == 100  # the trace ends first


def sharegpt(tmp_path: Path, conv: list[dict]) -> Path:
    path = tmp_path / "s.json"
    path.write_text(json.dumps([{"conversations": conv}]))
    return path


def test_sharegpt_takes_the_first_human_turn_and_the_reply_after_it(tmp_path: Path) -> None:
    conv = [
        {"from": "system", "value": "You are a helpful assistant"},
        {"from": "gpt", "value": "Hello! How can I help today?"},
        {"from": "human", "value": "what is two plus two"},
        {"from": "gpt", "value": "four"},
    ]
    spec = parse_workload(
        {**CLOSED, "dataset": {"path": str(sharegpt(tmp_path, conv)), "format": "sharegpt"}}
    )
    r = materialize(spec, WordTokenizer())[0]
    assert r.prompt == "what is two plus two" and r.output_tokens == 1


def messages_file(tmp_path: Path, text: str) -> dict:
    path = tmp_path / "c.jsonl"
    path.write_text(text)
    return chat(dataset={"path": str(path)})


def test_a_session_file_may_hold_a_line_separator_inside_a_message(tmp_path: Path) -> None:
    """U+2028 is valid inside a JSON string; splitting lines on it said "Unterminated"."""
    msgs = [{"role": "user", "content": "one\u2028two"}, {"role": "assistant", "content": "ok"}]
    wl = messages_file(tmp_path, json.dumps({"messages": msgs}, ensure_ascii=False) + "\n")
    plan = plan_sessions(parse_workload(wl, base_dir=tmp_path), WordTokenizer())
    assert plan.sessions[0].turns[0].new_text == "one\u2028two"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"messages": [{"role": "user", "content": "a", "n": ' + "9" * 5000 + "}]}",
         "line 1: is not valid JSON"),
        ("[" * 100_000 + "]" * 100_000, "line 1: is not valid JSON"),
        ('{"messages": "hello"}', 'line 1.messages: "hello" is not a list of messages'),
        ('["a"]', "line 1: is a JSON list, not an object"),
    ],
    ids=["5000-digits", "nested", "not-a-list", "not-an-object"],
)  # fmt: skip
def test_a_bad_session_file_is_one_line_when_the_workload_loads(
    tmp_path: Path, text: str, says: str
) -> None:
    with pytest.raises(InputError) as exc:
        parse_workload(messages_file(tmp_path, text), base_dir=tmp_path)
    line = str(exc.value)
    assert line.startswith("workload.sessions.dataset") and says in line and "\n" not in line
