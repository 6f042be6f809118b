"""The compact record codec is lossless: every field of every record comes back, so any
metric can be recomputed from the store."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servetune.errors import InputError
from servetune.metrics.compute import compute_metrics
from servetune.results.schema import RequestRecord
from servetune.store import codec
from synthetic_runs import synthetic_run

ns = st.integers(min_value=0, max_value=2**62)
opt_int = st.none() | st.integers(min_value=-(2**40), max_value=2**40)


@st.composite
def records(draw: st.DrawFn) -> RequestRecord:
    send = draw(ns)
    gaps = draw(st.lists(st.integers(0, 10**10), max_size=20))
    chunks, t = [], send + draw(st.integers(0, 10**10))
    for g in gaps:
        t += g
        chunks.append(t)
    return RequestRecord(
        index=draw(st.integers(0, 10**6)),
        sub=draw(st.sampled_from(["default", "long", "短"])),
        priority=draw(opt_int),
        send_ns=send,
        scheduled_ns=draw(st.none() | ns),
        first_event_ns=draw(st.none() | ns),
        chunk_ns=chunks,
        chunk_tokens=draw(st.lists(st.integers(0, 64), min_size=len(chunks), max_size=len(chunks))),
        end_ns=draw(ns),
        status=draw(st.sampled_from(["ok", "error", "cancelled", "aborted"])),
        error=draw(st.none() | st.sampled_from(["http_5xx", "ttft_timeout"])),
        error_detail=draw(st.none() | st.text(max_size=30)),
        usage_completion_tokens=draw(opt_int),
        server_timings=draw(
            st.none() | st.dictionaries(st.sampled_from(["a", "b"]), st.floats(0, 1e6))
        ),
    )


@settings(max_examples=60, deadline=None)
@given(st.lists(records(), max_size=12))
def test_round_trip_is_exact(recs: list[RequestRecord]) -> None:
    back = codec.decode_records(codec.encode_records(recs))
    assert [r.model_dump() for r in back] == [r.model_dump() for r in recs]


def test_plain_dicts_from_bench_workers_are_accepted() -> None:
    rows = [
        {"index": 3, "send_ns": 10, "end_ns": 99, "chunk_ns": [20, 30], "chunk_tokens": [1, 2]},
        {"index": 4, "send_ns": 5, "end_ns": 7, "status": "error", "error": "http_5xx"},
    ]
    back = codec.decode_records(codec.encode_records(rows))
    assert back[0].chunk_ns == [20, 30] and back[0].output_tokens == 3
    assert back[1].status == "error" and back[1].chunk_ns == [] and back[1].sub == "default"


def test_metrics_recomputed_from_stored_records_match() -> None:
    result, _ = synthetic_run(8, n_requests=80)
    back = codec.decode_records(codec.encode_records(result.records))
    assert compute_metrics(back, slo=result.slo) == result.metrics


def test_storage_is_compact() -> None:
    result, _ = synthetic_run(16, n_requests=200)
    raw = sum(len(r.model_dump_json()) for r in result.records)
    blob = codec.encode_records(result.records)
    assert len(blob) < raw / 4  # deltas + narrow ints + zlib


def test_foreign_or_newer_blobs_are_refused() -> None:
    with pytest.raises(InputError, match="not in servetune's format"):
        codec.decode_records(b"nope")
    newer = codec.MAGIC + bytes([codec.VERSION + 1]) + zlib.compress(b"{}")
    with pytest.raises(InputError, match="newer"):
        codec.decode_records(newer)
