"""A workload's dataset and trace files, read into checked rows.

Why apart from `materialize`: the same file is read when the workload is loaded (so a
missing file or a bad line is refused before anything runs, docs/errors.md) and again when
the requests are built, and a Mooncake trace feeds both plain replay and sessions. Every
value is checked here, once, and a bad one is one `InputError` naming the line and the key
(`workload.trace line 2.timestamp`) and the file to fix.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from servetune.errors import InputError
from servetune.workload.sessions import BUILTIN_DATASET, Conversation, SessionDataset
from servetune.workload.spec import MAX_TOKENS, Dataset
from servetune.yamlfile import read_text

if TYPE_CHECKING:
    from servetune.workload.spec import WorkloadSpec

TRACE = "workload.trace"
DATASET = "workload.dataset"
_TRACE_LINE = "each line is one JSON object with input_length, output_length, timestamp, hash_ids"
_DATASET_LINE = "each line is one JSON object with prompt (text) or messages, and output_tokens"
_SHAREGPT_ITEM = 'each item holds conversations: [{"from": "human", "value": "..."}, ...]'
# numpy seeds a trace block from its hash id, and a prefix group is an int64
_MAX_HASH_ID = 2**63 - 1


@dataclass(frozen=True)
class TraceRow:
    """One request of a Mooncake-style trace."""

    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


@dataclass(frozen=True)
class DatasetRow:
    """One prompt of a dataset: text or chat messages, and its output length if given."""

    prompt: str | None
    messages: list[dict[str, Any]] | None
    output_tokens: int | None
    reply: str | None  # ShareGPT: the first answer, whose token count is the output length


@dataclass(frozen=True)
class _At:
    """Where a value sits (`workload.trace line 3` of `path`), for its one-line error."""

    label: str
    path: Path

    def error(self, key: str | None, problem: str, rule: str) -> InputError:
        field = f"{self.label}.{key}" if key else self.label
        return InputError(field, problem, f"{rule}; fix it in {self.path}")


def check_files(spec: WorkloadSpec) -> None:
    """Read every dataset and trace `spec` names, so that a missing file or a bad line is
    refused when the workload is loaded, not after the run has started (the rows are
    cached for the run's own read)."""
    if spec.trace is not None:
        read_trace(spec.trace.path)
    for sub in spec.mix:
        if sub.dataset is not None:
            read_dataset(sub.dataset)
    ds = spec.sessions.dataset if isinstance(spec.sessions, Conversation) else None
    if ds is not None and ds.format == "mooncake":
        read_trace(ds.path, "workload.sessions.dataset")
    elif ds is not None:
        conversation_messages(ds)


# ShareGPT's speakers as chat roles (`from` -> role)
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant"}
_CONVERSATION = 'each line is {"messages": [{"role": "user", "content": "..."}, ...]}'


def conversation_messages(ds: SessionDataset) -> list[list[dict[str, Any]]]:
    """The messages ({role, content}) of each conversation of a session dataset, ShareGPT's
    speakers mapped to chat roles; a file that is not valid JSON is one line naming it."""
    label = "workload.sessions.dataset"
    path = BUILTIN_DATASET if str(ds.path) == "builtin" else ds.path
    raw = read_text(path, f"{label}.path")  # unreadable or binary: a line
    sharegpt = ds.format == "sharegpt"
    rule = _SHAREGPT_ITEM if sharegpt else _CONVERSATION
    if sharegpt:
        items = _json(raw, _At(label, path), rule)
        if not isinstance(items, list):
            raise _At(label, path).error(None, f"is a JSON {_kind(items)}, not a list", rule)
        rows = [(_At(f"{label} item {k}", path), item) for k, item in enumerate(items)]
    else:
        rows = _json_lines(raw, label, path, rule)
    convs = []
    for at, row in rows:
        if not isinstance(row, dict):
            raise at.error(None, f"is a JSON {_kind(row)}, not an object", rule)
        key = (
            ("conversations" if "conversations" in row else "conversation")
            if sharegpt
            else ("messages")
        )
        msgs = row.get(key) or []
        if not isinstance(msgs, list) or not all(isinstance(m, dict) for m in msgs):
            raise at.error(key, f"{_shown(msgs)} is not a list of messages", rule)
        if sharegpt:
            msgs = [{"role": SHAREGPT_ROLES.get(str(m.get("from")), ""), "content": m.get("value")}
                    for m in msgs]  # fmt: skip
        convs.append(msgs)
    return convs


# The longest replay a trace may ask for. Public LLM-serving traces span an hour (Mooncake's
# conversation trace) to a week (Azure LLM inference trace 2024, one week of requests); a
# replay longer than that is a timestamp in the wrong unit or a typo, and would leave the
# bench waiting (or overflow a float past 1.8e308 ms) instead of measuring.
MAX_REPLAY_S = 7 * 86_400.0


def trace_rows(spec: WorkloadSpec) -> tuple[TraceRow, ...]:
    """The trace lines a run of `spec` sends: the first `count` when it sets one."""
    assert spec.trace is not None
    rows = read_trace(spec.trace.path)
    return rows if spec.count is None else rows[: spec.count]


def check_replay_span(spec: WorkloadSpec) -> None:
    """A trace replayed at its own timestamps (arrival kind `trace`) whose replay would
    outlast MAX_REPLAY_S is refused in one line; other arrivals ignore the timestamps."""
    if spec.trace is None or spec.arrival.kind != "trace":
        return
    stamps = [r.timestamp_ms for r in trace_rows(spec)]
    scale = spec.trace.time_scale
    span_s = (max(stamps) - min(stamps)) / 1000.0 / scale  # inf when the difference overflows
    if not span_s <= MAX_REPLAY_S:
        shown = "over 1e308 ms" if not math.isfinite(span_s) else f"{span_s:,.3g} s"
        raise InputError(
            "workload.trace",
            f"the timestamps in {spec.trace.path} span {shown} of replay at time_scale {scale:g} "
            f"(the limit is {MAX_REPLAY_S / 86_400:g} days)",
            "give timestamps in milliseconds from the first request, raise time_scale, "
            "or cut the trace",
        )


def read_trace(path: Path, label: str = TRACE) -> tuple[TraceRow, ...]:
    """The requests of a trace file (one JSON object a line), every value checked."""
    return cast("tuple[TraceRow, ...]", _cached(Path(path), "mooncake", label))


def read_dataset(ds: Dataset, label: str = DATASET) -> tuple[DatasetRow, ...]:
    """The prompts of a dataset file; rows with neither prompt nor messages are skipped."""
    return cast("tuple[DatasetRow, ...]", _cached(Path(ds.path), ds.format, label))


# --------------------------------------------------------------------------- internals


def _cached(path: Path, fmt: str, label: str) -> tuple[TraceRow | DatasetRow, ...]:
    """Parse each version of a file once (it is read at load time and again per run)."""
    try:
        st = path.stat()
    except (OSError, ValueError):
        return _parse(path, fmt, label)  # raises read_text's one-line error
    return _parse_version(path, fmt, label, st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=4)
def _parse_version(
    path: Path, fmt: str, label: str, _mtime_ns: int, _size: int
) -> tuple[TraceRow | DatasetRow, ...]:
    return _parse(path, fmt, label)


def _parse(path: Path, fmt: str, label: str) -> tuple[TraceRow | DatasetRow, ...]:
    text = read_text(path, f"{label}.path")
    rows: list[TraceRow | DatasetRow]
    if fmt == "mooncake":
        rows = [_trace_row(row, at) for at, row in _json_lines(text, label, path, _TRACE_LINE)]
        if not rows:
            raise InputError(label, f"{path} holds no requests", _TRACE_LINE)
        return tuple(rows)
    if fmt == "sharegpt":
        rows = _sharegpt_rows(_json(text, _At(label, path), _SHAREGPT_ITEM), label, path)
    else:
        lines = _json_lines(text, label, path, _DATASET_LINE)
        rows = [r for at, row in lines if (r := _dataset_row(row, at)) is not None]
    if not rows:
        raise InputError(label, f"{path} holds no prompts", _DATASET_LINE)
    return tuple(rows)


def _json(text: str, at: _At, rule: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise at.error(None, f"is not valid JSON ({exc.msg})", rule) from None
    except (ValueError, RecursionError) as exc:  # a 5,000-digit number, [[[[...]]]]
        raise at.error(None, f"is not valid JSON ({exc})", rule) from None


def _json_lines(text: str, label: str, path: Path, rule: str) -> list[tuple[_At, Any]]:
    """(where, value) of each non-blank line. Split on newlines only: `splitlines` also
    splits on U+2028, which a JSON string may hold."""
    out = []
    for n, line in enumerate(text.split("\n"), 1):
        if line.strip():
            at = _At(f"{label} line {n}", path)
            out.append((at, _json(line, at, rule)))
    return out


def _trace_row(row: Any, at: _At) -> TraceRow:
    if not isinstance(row, dict):
        raise at.error(None, f"is a JSON {_kind(row)}, not an object", _TRACE_LINE)
    for key in ("input_length", "output_length"):
        if row.get(key) is None:
            raise at.error(key, "is missing", _TRACE_LINE)
    ids = row.get("hash_ids")
    ids = [] if ids is None else ids
    if not isinstance(ids, list) or not all(_is_int(h) and 0 <= h <= _MAX_HASH_ID for h in ids):
        raise at.error(
            "hash_ids",
            f"{_shown(ids)} is not a list of block ids",
            "give a list of integers >= 0, one per block of block_tokens prompt tokens",
        )
    return TraceRow(
        timestamp_ms=_timestamp(row, at),
        input_length=_tokens(row, "input_length", at, minimum=0) or 0,
        # 0 is a prefill-only request (traces of KV-cache studies hold them): served as
        # one token, the least an OpenAI server's max_tokens asks for
        output_length=max(1, _tokens(row, "output_length", at, minimum=0) or 0),
        hash_ids=tuple(ids),
    )


def _dataset_row(row: Any, at: _At) -> DatasetRow | None:
    if not isinstance(row, dict):
        raise at.error(None, f"is a JSON {_kind(row)}, not an object", _DATASET_LINE)
    messages = row.get("messages")
    if messages is not None and (
        not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages)
    ):
        raise at.error(
            "messages",
            f"{_shown(messages)} is not a list of messages",
            'give a list of objects such as {"role": "user", "content": "..."}',
        )
    prompt = _text(row, "prompt", at)
    if not prompt and not messages:
        return None
    return DatasetRow(
        prompt=prompt,
        messages=messages or None,
        output_tokens=_tokens(row, "output_tokens", at, minimum=1),
        reply=_text(row, "reply", at),
    )


def _sharegpt_rows(data: Any, label: str, path: Path) -> list[TraceRow | DatasetRow]:
    """The first human turn of each conversation as the prompt, the reply after it as
    the output (the practice of vLLM's and SGLang's benchmarks, which take the first two
    messages: here by their speaker, so a system message or an opening reply is skipped)."""
    if not isinstance(data, list):
        raise _At(label, path).error(None, f"is a JSON {_kind(data)}, not a list", _SHAREGPT_ITEM)
    rows: list[TraceRow | DatasetRow] = []
    for k, item in enumerate(data):
        at = _At(f"{label} item {k}", path)
        if not isinstance(item, dict):
            raise at.error(None, f"is a JSON {_kind(item)}, not an object", _SHAREGPT_ITEM)
        key = "conversations" if "conversations" in item else "conversation"
        conv = item.get(key) or []
        if not isinstance(conv, list) or not all(isinstance(m, dict) for m in conv):
            raise at.error(key, f"{_shown(conv)} is not a list of messages", _SHAREGPT_ITEM)
        roles = [SHAREGPT_ROLES.get(str(m.get("from")), "") for m in conv]
        # by role, not position: a system message or a greeting may open the conversation
        ask = next((j for j, m in enumerate(conv) if roles[j] == "user" and m.get("value")), -1)
        answer = next((j for j in range(ask + 1, len(conv)) if roles[j] == "assistant"), -1)
        if ask >= 0 and answer >= 0:
            prompt = _text(conv[ask], "value", _At(f"{at.label}.{key}.{ask}", path))
            reply = _text(conv[answer], "value", _At(f"{at.label}.{key}.{answer}", path))
            rows.append(DatasetRow(prompt=prompt, messages=None, output_tokens=None, reply=reply))
    return rows


def message_text(content: Any) -> str:
    """A chat message's text: a string as is, an OpenAI content-parts list as its text
    parts joined (`[{"type": "text", "text": ...}]`; it had been sent and counted as the
    list's Python repr), anything else as its string."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict)]
        return " ".join(t for t in parts if isinstance(t, str))
    return "" if content is None else str(content)


def _text(row: dict[str, Any], key: str, at: _At) -> str | None:
    value = row.get(key)
    if value is not None and not isinstance(value, str):
        raise at.error(key, f"{_shown(value)} is not text", "give a JSON string")
    return value


def _tokens(row: dict[str, Any], key: str, at: _At, minimum: int) -> int | None:
    """A token count from `minimum` to MAX_TOKENS, None when absent. A larger one is a
    typo (and wraps numpy's int64 past 9e18); 5.0 is 5, 10.5 is refused, not rounded."""
    value = row.get(key)
    if value is None:
        return None
    rule = f"give a whole number of tokens from {minimum} to {MAX_TOKENS:,}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise at.error(key, f"{_shown(value)} is not a number", rule)
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise at.error(key, f"{_shown(value)} is not a whole number", rule)
    if value < 0:
        raise at.error(key, f"{_shown(value)} is negative", rule)
    if value < minimum:
        raise at.error(key, f"{_shown(value)} is below {minimum}", rule)
    if value > MAX_TOKENS:
        raise at.error(key, f"{_shown(value)} is over {MAX_TOKENS:,} tokens", rule)
    return int(value)


def _timestamp(row: dict[str, Any], at: _At) -> float:
    """The send time in ms (0 when absent): a finite number."""
    value = row.get("timestamp", 0)
    rule = "give the send time in milliseconds, a finite number"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise at.error("timestamp", f"{_shown(value)} is not a number", rule)
    try:
        ms = float(value)
    except OverflowError:  # an integer of 400 digits
        ms = math.inf
    if not math.isfinite(ms):
        raise at.error("timestamp", f"{_shown(value)} is not finite", rule)
    return ms


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value: object) -> str:
    """The JSON name of a value's type."""
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "list"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    return "number" if isinstance(value, (int, float)) else "null"


def _shown(value: object, limit: int = 40) -> str:
    """`value` as JSON writes it (what the user sees in the file), cut to `limit`."""
    text = json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
