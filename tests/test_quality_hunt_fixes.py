"""`quality` on odd input: a server's reply of another shape, a passage the baseline does not
continue, YAML-typed corpus values, and requantized GGUFs that share a file name. Each is
one line naming the flag (exit 2) or a figure honestly not measured, never a traceback or
a NaN."""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from cli_run import run_cli
from servetune.errors import InputError
from servetune.quality.corpus import load_corpus
from servetune.quality.endpoint import Endpoint, connect
from servetune.quality.run import QualityResult, Scores, Settings
from servetune.quality.scoring import agreement

# --- a server's odd reply ---------------------------------------------------------------


@contextlib.contextmanager
def _server(replies: dict[str, bytes]) -> Iterator[str]:
    """A local server answering each path (GET or POST) with its fixed body; yields its URL."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = replies.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        do_GET = do_POST = _answer

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    th = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def _j(obj: object) -> bytes:
    return json.dumps(obj).encode()


OLD_LLAMA = {"content": "x", "completion_probabilities": [{"content": "x", "probs": []}]}


@pytest.mark.parametrize(
    ("engine", "path", "reply", "call", "expected"),
    [
        # vLLM with prompt_logprobs null, an error object, no choices left
        (
            "vllm",
            "/v1/completions",
            _j({"choices": [{"text": "x", "prompt_logprobs": None}]}),
            "score",
            r"/v1/completions returned no prompt logprobs .*prompt_logprobs\": null",
        ),
        (
            "vllm",
            "/v1/completions",
            _j({"object": "error", "message": "prompt_logprobs not supported"}),
            "score",
            r"returned no prompt logprobs .*prompt_logprobs not supported",
        ),
        ("vllm", "/v1/completions", _j({"choices": []}), "greedy", r"returned no continuation"),
        # a 200 that is not JSON
        ("vllm", "/tokenize", b"<html>oops</html>", "tokenize", r"/tokenize returned no JSON"),
        ("vllm", "/tokenize", _j({"tokens": None}), "tokenize", r"returned no token ids"),
        # llama.cpp before b4000 (no token id) and without completion_probabilities
        ("llamacpp", "/completion", _j(OLD_LLAMA), "score", r"no token logprobs .*b4000"),
        ("llamacpp", "/completion", _j({"content": "x"}), "score", r"no token logprobs .*b4000"),
        ("llamacpp", "/completion", _j(["x"]), "greedy", r"returned no continuation"),
    ],
)
def test_an_odd_reply_is_one_line_naming_the_flag(
    engine: str, path: str, reply: bytes, call: str, expected: str
) -> None:
    with _server({path: reply}) as url:
        ep = Endpoint(url, engine, "m", None, timeout_s=10, flag="--candidate")
        with pytest.raises(InputError) as e:
            if call == "score":
                ep.token_logprobs([1, 2, 3])
            elif call == "greedy":
                ep.greedy("one two", 4)
            else:
                ep.tokenize("one two")
        ep.close()
    line = e.value.one_line()
    assert line.startswith(f"--candidate: {url}{path} ") and "\n" not in line, line
    assert e.value.fix and re.search(expected, line), line


def test_a_model_list_of_strings_is_one_line() -> None:
    replies = {"/v1/models": _j({"data": ["m"]}), "/version": _j({"version": "0"})}
    expected = r"^--baseline: .*/v1/models returned no model list"
    with _server(replies) as url, pytest.raises(InputError, match=expected):
        connect(url, "--baseline")


def test_a_url_httpx_cannot_parse_is_one_line() -> None:
    with pytest.raises(InputError, match=r"^--baseline: 'http://\[::1' is not a URL"):
        connect("http://[::1", "--baseline")


def test_the_cli_answers_an_odd_reply_in_one_line_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    replies = {
        "/v1/models": _j({"data": [{"id": "fake", "root": "fake"}]}),
        "/version": _j({"version": "0.11.0"}),
        "/tokenize": _j({"tokens": [1, 5, 6, 7]}),
        "/v1/completions": _j({"choices": [{"text": "x", "prompt_logprobs": None}]}),
    }
    with _server(replies) as url:
        args = ("--baseline", url, "--candidate", url, "--passages", "2", "--tasks", "0")
        code, _, err = run_cli(capsys, "quality", *args)
    assert code == 2, err
    assert err.startswith(f"error: --baseline: {url}/v1/completions returned no prompt logprobs")
    assert "Traceback" not in err and err.count("\n") == 1, err


# --- a passage the baseline does not continue ----------------------------------------------


def _result(
    base_greedy: list[list[int | str]], cand_greedy: list[list[int | str]]
) -> QualityResult:
    corpus = load_corpus().limit(len(base_greedy), 0)
    lp = [[-1.0, -2.0, -1.5] for _ in base_greedy]
    worse = [[x - 0.5 for x in p] for p in lp]
    ep = Endpoint("http://a:1", "llamacpp", "m", "m.gguf")
    base, cand = Scores(lp, base_greedy, []), Scores(worse, cand_greedy, [])
    again = Scores(lp, base_greedy, [])
    return QualityResult(ep, ep, corpus, base, cand, Settings(threshold=1.0), again=again)


def _no_nan(text: str) -> object:
    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in the JSON")

    return json.loads(text, parse_constant=refuse)


def test_an_empty_baseline_continuation_is_left_out_of_the_agreement() -> None:
    assert agreement([], [1, 2]) is None
    r = _result([[1, 2], [], [3, 4]], [[1, 9], [5], [3, 9]])
    t = r.table()
    assert t["greedy_agreement"] == 0.5 and t["greedy_agreement_ci95"] == [0.5, 0.5]
    assert t["noise_floor_agreement_ci95"] == [1.0, 1.0]
    # the agreement (0.5, wholly below the floor's 1.0) still counts as a measured regression
    assert r.agreement is not None and r.agreement.high < 1.0 and t["regression_measurable"]
    _no_nan(json.dumps(t))


def test_no_continued_passage_is_agreement_not_measured() -> None:
    r = _result([[], []], [[1], []])
    t = r.table()
    assert t["greedy_agreement"] is None and t["greedy_agreement_ci95"] is None
    assert t["noise_floor_agreement_ci95"] is None
    # the perplexity ratio alone still decides: the candidate is worse by e^0.5 per token
    assert t["regression_measurable"] and t["quality_check"] == "pass"
    _no_nan(json.dumps(t))
    same = QualityResult(r.baseline, r.candidate, r.corpus, r.base, r.base, r.settings)
    assert same.table()["noise_floor_agreement_ci95"] is None and not same.regression


def test_the_cli_shows_agreement_not_measured(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    r = _result([[], []], [[1], []])
    monkeypatch.setattr("servetune.quality.endpoint.connect", lambda url, flag: r.baseline)
    monkeypatch.setattr("servetune.quality.run.compare", lambda *a: r)
    urls = ("--baseline", "http://a:1", "--candidate", "http://a:1")
    code, out, err = run_cli(capsys, "quality", *urls, "--json")
    assert code == 0, err
    shown = _no_nan(out)
    assert isinstance(shown, dict) and shown["greedy_agreement"] is None
    code, out, err = run_cli(capsys, "quality", *urls)
    assert code == 0, err
    lines = {
        line.split()[0]: line.split(None, 1)[1] for line in out.splitlines() if line[:1] != " "
    }
    assert lines["greedy_agreement"] == "not measured"
    assert lines["noise_floor_agreement_ci95"] == "not measured"


# --- YAML-typed corpus values -------------------------------------------------------------

PASSAGES = 'passages:\n  - {id: a, text: "one two three"}\n  - {id: b, text: "x y"}\n'


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('passages:\n  - {id: a, text: "one two"}\n  - {id: b, text: }\n', r"'b' has no text"),
        ('passages:\n  - {id: a, text: "one two"}\n  - id: b\n    text:\n', r"'b' has no text"),
        ('passages:\n  - {id: a, text: "one two"}\n  - {id: b, text: 12}\n', r"text as the int 12"),
        (PASSAGES + "tasks:\n  - {id: t, prompt: p, answer: 010}\n", r"answer as the int 8"),
        (PASSAGES + "tasks:\n  - {id: t, prompt: p, answer: 3.10}\n", r"answer as the float 3.1"),
        (PASSAGES + "tasks:\n  - {id: t, prompt: p, answer: yes}\n", r"answer as the bool True"),
        (PASSAGES + "tasks:\n  - {id: t, prompt: p, answer: }\n", r"'t' has no answer"),
        (PASSAGES + "tasks:\n  - {id: t, prompt: 7, answer: x}\n", r"prompt as the int 7"),
    ],
)
def test_a_corpus_value_yaml_did_not_read_as_text_is_refused(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as e:
        load_corpus(path)
    line = e.value.one_line()
    assert line.startswith(f"--corpus: {path}: ") and expected in line, line
    assert e.value.fix and '"..."' in e.value.fix


def test_quoted_corpus_values_stay_as_written(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(PASSAGES + 'tasks:\n  - {id: t, prompt: "p", answer: "010"}\n')
    assert load_corpus(path).tasks[0].answer == "010"


# --- requantized GGUFs that share a file name ----------------------------------------------


def test_the_cache_key_tells_two_ggufs_of_one_name_apart(tmp_path: Path) -> None:
    from servetune.quality.requantize import cache_name

    a, b = tmp_path / "a" / "m.gguf", tmp_path / "b" / "m.gguf"
    for p, body in ((a, b"first"), (b, b"second!")):
        p.parent.mkdir()
        p.write_bytes(body)
    name = cache_name(a, "Q2_K")
    assert name.startswith("m.") and name.endswith(".requant-Q2_K.gguf")
    assert cache_name(a, "Q2_K") == name  # stable: a second run finds the cached file
    assert cache_name(b, "Q2_K") != name
    assert cache_name(a, "Q3_K") != name
    a.write_bytes(b"rewritten in place")
    assert cache_name(a, "Q2_K") != name


def test_requantized_does_not_hand_one_ggufs_output_to_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stand-in llama-quantize that copies its input: each source gets its own output."""
    import servetune.quality.requantize as rq

    tool = tmp_path / "llama-quantize"
    tool.write_text('#!/bin/sh\ncp "$2" "$3"\n')
    tool.chmod(0o755)
    monkeypatch.setattr(rq, "llamacpp_quantize", lambda: tool)
    monkeypatch.setattr(rq, "engine_dir", lambda engine: tmp_path / "cache")
    a, b = tmp_path / "a" / "m.gguf", tmp_path / "b" / "m.gguf"
    for p, body in ((a, b"first"), (b, b"second")):
        p.parent.mkdir()
        p.write_bytes(body)
    out_a = rq.requantized(a)
    out_b = rq.requantized(b)
    assert out_a.read_bytes() == b"first" and out_b.read_bytes() == b"second"
    assert rq.requantized(a) == out_a  # still made once
