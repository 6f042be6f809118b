"""accept fixes from a bug hunt: the output-cap item passed on a model that stopped early
(under the cap, for end of text) on a server that caps nothing; a malformed IPv6 --url
was a traceback."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from tests.cli_run import run_cli

from servetune.accept import probes
from servetune.accept.checklist import Status
from servetune.accept.inputs import reach
from servetune.errors import InputError
from servetune.results.schema import RequestRecord
from servetune.workload.spec import WorkloadSpec, parse_workload
from servetune.workload.tokenizer import WordTokenizer

WORKLOAD = {
    "name": "w",
    "api": "completions",
    "count": 20,
    "input_tokens": {"dist": "uniform", "low": 16, "high": 48},
    "output_tokens": {"dist": "uniform", "low": 8, "high": 16},
    "sampling": {"ignore_eos": False},  # the workload's own answers may end early
}
CAP = 100


@dataclass
class _Run:
    records: list[RequestRecord]
    id: str = "run-1"


@dataclass
class _Dep:
    engine: str = "vllm"


@dataclass
class _Answers:
    """A Prober whose server answers the probe's one request with `got` tokens and
    `finish_reason`; keeps the spec it was sent."""

    got: int
    finish_reason: str | None
    dep: _Dep = field(default_factory=_Dep)
    tokenizer: WordTokenizer = field(default_factory=WordTokenizer)
    sent: list[WorkloadSpec] = field(default_factory=list)

    def measure(self, label: str, spec: WorkloadSpec, requests=None, **_k) -> _Run:
        self.sent.append(spec)
        rec = RequestRecord(index=0, send_ns=0, end_ns=1, http_status=200,
                            finish_reason=self.finish_reason,
                            usage_completion_tokens=self.got)  # fmt: skip
        return _Run([rec])


def _cap(got: int, finish_reason: str | None, engine: str = "vllm"):
    p = _Answers(got, finish_reason, _Dep(engine))
    return probes.output_cap(p, parse_workload(WORKLOAD, swept=True), CAP), p.sent[0]  # type: ignore[arg-type]


@pytest.mark.parametrize("reason", ["stop", None])
def test_an_answer_that_ended_before_the_cap_checks_no_cap(reason: str | None) -> None:
    """10 tokens for an ask of 400 on a server that caps nothing: the model ended its
    answer (finish_reason "stop"), which was read as "truncated at 10 tokens", a pass."""
    finding, sent = _cap(10, reason)
    assert finding.status == Status.UNCHECKED, finding
    assert f"stopped at 10 tokens (finish_reason {reason or 'not given'})" in finding.evidence[0]
    assert sent.sampling.ignore_eos  # asked to run on past its end of text


def test_a_length_stop_within_the_cap_passes_and_past_it_fails() -> None:
    finding, _ = _cap(CAP, "length")
    assert finding.status == Status.PASS and "truncated at 100 tokens" in finding.evidence[0]
    finding, _ = _cap(4 * CAP, "length")  # generated all it was asked: no cap
    assert finding.status == Status.FAIL


def test_an_engine_refusing_non_openai_fields_is_not_sent_ignore_eos() -> None:
    """transformers serve answers 422 to ignore_eos, which would read as the cap's refusal."""
    _, sent = _cap(CAP, "length", engine="transformers")
    assert not sent.sampling.ignore_eos


@pytest.mark.parametrize("url", ["http://[::1", "http://[zz]/"])
def test_a_malformed_ipv6_url_names_the_flag(capsys, url: str) -> None:
    """httpx.InvalidURL is no httpx.HTTPError: it went through as a traceback."""
    with pytest.raises(InputError, match=r"^--url: .* is not a valid URL"):
        reach(url)
    code, _, err = run_cli(capsys, "accept", "--url", url, "--engine", "vllm")
    assert code == 2 and err.startswith("error: --url:") and err.count("\n") == 1, err
