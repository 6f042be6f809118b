"""The typed RunResult parts (Target, Load, TuneTag) and the status vocabularies: they read
and write the same JSON as the plain dicts and strings they replace."""

from __future__ import annotations

import json
from enum import Enum

import pytest

from servetune.results.schema import (
    Load,
    RequestRecord,
    RunResult,
    SimStats,
    Target,
    TuneFailure,
    TuneTag,
)
from servetune.status import RequestStatus, RunStatus, TrialStatus
from servetune.workload.spec import Arrival


@pytest.mark.parametrize("vocabulary", [RequestStatus, RunStatus, TrialStatus])
def test_status_members_behave_as_their_words(vocabulary: type[Enum]) -> None:
    for member in vocabulary:
        word = member.value
        assert member == word and vocabulary(word) is member
        assert str(member) == f"{member}" == word and f"{member:>12}" == f"{word:>12}"
        assert json.dumps({"s": member}) == json.dumps({"s": word})
        assert {word: 1}[member] == 1  # a dict keyed by stored strings finds the member


def test_record_status_reads_stored_strings_and_rejects_others() -> None:
    rec = RequestRecord.model_validate({"index": 0, "send_ns": 0, "end_ns": 1, "status": "error"})
    assert rec.status is RequestStatus.ERROR
    assert json.loads(rec.model_dump_json())["status"] == "error"
    # Hot-path records are built unvalidated, holding the plain word: dumps it unchanged.
    fast = RequestRecord.model_construct(index=0, send_ns=0, end_ns=1, status="cancelled")
    assert fast.status == RequestStatus.CANCELLED and fast.model_dump()["status"] == "cancelled"
    with pytest.raises(ValueError, match="status"):
        RequestRecord.model_validate({"index": 0, "send_ns": 0, "end_ns": 1, "status": "done"})


def test_result_status_takes_only_final_run_states() -> None:
    res = RunResult.model_validate({"id": "r", "created_utc": "x", "status": "circuit_breaker"})
    assert res.status is RunStatus.CIRCUIT_BREAKER
    with pytest.raises(ValueError, match="status"):
        RunResult.model_validate({"id": "r", "created_utc": "x", "status": "running"})


def test_parts_write_back_exactly_what_was_read() -> None:
    stored = {
        "url": "http://h:1",
        "model": None,  # an explicit null stays
        "sim": {"steps": 3, "phases_s": {"loop": 0.5}, "gpu_seconds": 2.0},
        "tune": {"pid": "k/trial", "key": "k", "phase": "trial", "trial": {"key": "k"}},
        "gateway": {"region": "eu"},  # a key this version does not know
    }
    t = Target.model_validate(stored)
    assert t.url == "http://h:1" and t.sim.steps == 3 and t.tune is not None
    assert t.tune.key == "k" and t.model_extra == {"gateway": {"region": "eu"}}
    assert t.model_dump(mode="json") == stored
    assert json.loads(t.model_dump_json()) == stored


def test_empty_parts_are_falsy_and_write_nothing() -> None:
    res = RunResult(id="r", created_utc="x")
    assert not res.target and not res.load and not res.target.sim
    dumped = json.loads(res.model_dump_json())
    assert dumped["target"] == {} and dumped["load"] == {}
    assert Target(url="u") and Load(kind="closed") and SimStats(steps=1)


def test_load_of_an_arrival_and_of_a_tuning_point() -> None:
    gamma = Arrival(kind="gamma", rate=2.0, burstiness=0.5)
    assert Load.of(gamma).model_dump() == {
        "kind": "gamma",
        "rate": 2.0,
        "concurrency": None,
        "burstiness": 0.5,
    }
    assert Load.of(Arrival(kind="poisson", rate=3.0)).burstiness is None
    assert Load.point("concurrency", 4.0).model_dump() == {"kind": "closed", "concurrency": 4}
    assert Load.point("rate", 2.5).model_dump() == {"kind": "poisson", "rate": 2.5}


def test_tune_tag_with_failure_round_trips() -> None:
    failure = TuneFailure(kind="oom", reason="CUDA out of memory", log_tail=["a", "b"])
    tag = TuneTag(pid="k/launch/launch=0/r0", key="k", phase="launch", failure=failure)
    back = TuneTag.model_validate_json(tag.model_dump_json())
    assert back == tag and back.failure is not None and back.failure.log_tail == ["a", "b"]
    assert set(json.loads(tag.model_dump_json())) == {"pid", "key", "phase", "failure"}
