"""WorkloadSpec validation and materialisation: exact token counts, determinism, sources."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from servetune.errors import InputError
from servetune.metrics.stats import ks_exponential
from servetune.workload.materialize import arrival_offsets_s, materialize, sample_lengths
from servetune.workload.spec import LogNormal, Uniform, load_workload, parse_workload
from servetune.workload.tokenizer import HFTokenizer, WordTokenizer

BASE = {
    "count": 50,
    "arrival": {"kind": "poisson", "rate": 10},
    "input_tokens": {"dist": "fixed", "value": 40},
    "output_tokens": {"dist": "fixed", "value": 8},
}


@pytest.fixture(scope="module")
def bpe(tmp_path_factory: pytest.TempPathFactory) -> HFTokenizer:
    """A small byte-level BPE trained here (no download), like a real model's tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    words = "the of and to in is was for on that with as by at from his her they this be are"
    corpus = [" ".join(np.random.default_rng(i).permutation(words.split())) for i in range(300)]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, show_progress=False))
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return HFTokenizer(path)


def test_bad_field_is_one_line_naming_it() -> None:
    bad = {**BASE, "input_tokens": {"dist": "uniform", "low": 10, "high": 5}}
    with pytest.raises(InputError) as e:
        parse_workload(bad)
    assert e.value.field.startswith("workload.input_tokens")  # as written, no `mix.0`
    assert "\n" not in e.value.one_line()
    with pytest.raises(InputError, match="needs a rate"):
        parse_workload({**BASE, "arrival": {"kind": "poisson"}})
    with pytest.raises(InputError, match="count or duration_s"):
        parse_workload({k: v for k, v in BASE.items() if k != "count"})


@pytest.mark.parametrize(
    ("change", "line"),
    [
        # top-level lengths: no `mix.0`, no union tag `fixed`, and the stray key named
        ({"input_tokens": {"dist": "fixed", "mean": 4096}},
         "workload.input_tokens.value: is missing, and it has no field mean (give value)"),
        ({"input_tokens": {"dist": "fixed", "value": -3}},
         "workload.input_tokens.value: Input should be greater than or equal to 0 (got -3)"),
        # a mix the user wrote keeps its own path, without the tag
        ({"input_tokens": None, "output_tokens": None,
          "mix": [{"input_tokens": {"dist": "fixed", "value": 5},
                   "output_tokens": {"dist": "fixed", "value": 5}},
                  {"name": "b", "input_tokens": {"dist": "lognormal", "mean": 50},
                   "output_tokens": {"dist": "fixed", "value": 5}}]},
         "workload.mix.1.input_tokens.sigma: is missing (give sigma)"),
    ],
    ids=["shorthand-missing", "shorthand-range", "mix-missing"],
)  # fmt: skip
def test_an_error_names_the_path_the_user_wrote(change: dict, line: str) -> None:
    """Pydantic's location held keys the file never had (the shorthand's one-entry `mix`,
    the length union's tag): `workload.mix.0.input_tokens.fixed.value: Field required`
    sent a user who wrote `mean` for a fixed length looking for both."""
    data = {k: v for k, v in {**BASE, **change}.items() if v is not None}
    with pytest.raises(InputError) as e:
        parse_workload(data)
    assert e.value.one_line() == line


def test_written_path_drops_only_what_the_data_lacks() -> None:
    from servetune.errors import written_path

    data = {"input_tokens": {"dist": "fixed", "mean": 1}, "sessions": {"kind": "chat"}}
    loc = ("mix", 0, "input_tokens", "fixed", "value")
    assert written_path(loc, data, missing=True) == ("input_tokens", "value")
    assert written_path(loc, data) == ("input_tokens",)  # an absent last part is a tag
    assert written_path(("sessions", "chat", "turns"), data) == ("sessions",)
    assert written_path(("mix", 3, "name"), {"mix": [{}]}, missing=True) == ("mix", "name")


def test_yaml_file_and_relative_dataset(tmp_path: Path) -> None:
    (tmp_path / "d.jsonl").write_text(json.dumps({"prompt": "w1 w2 w3", "output_tokens": 5}) + "\n")
    (tmp_path / "w.yaml").write_text(
        "count: 3\narrival: {kind: closed, concurrency: 2}\ndataset: {path: d.jsonl}\n"
    )
    spec = load_workload(tmp_path / "w.yaml")
    reqs = materialize(spec, WordTokenizer())
    assert [r.prompt_tokens for r in reqs] == [3, 3, 3]
    assert all(r.output_tokens == 5 and r.arrival_s is None for r in reqs)
    with pytest.raises(InputError) as e:
        load_workload(tmp_path / "missing.yaml")
    assert e.value.field == "--workload"


def test_length_distributions_have_their_moments() -> None:
    rng = np.random.default_rng(0)
    x = sample_lengths(LogNormal(mean=500, sigma=0.6), 40_000, rng)
    assert abs(x.mean() - 500) / 500 < 0.02  # mean parameterisation, not median
    u = sample_lengths(Uniform(low=10, high=20), 10_000, rng)
    assert u.min() == 10 and u.max() == 20
    clipped = sample_lengths(LogNormal(mean=500, sigma=2.0, min=100, max=600), 1000, rng)
    assert clipped.min() >= 100 and clipped.max() <= 600
    emp = parse_workload(
        {**BASE, "input_tokens": {"dist": "empirical", "values": [1, 100], "weights": [3, 1]}}
    )
    ins = sample_lengths(emp.mix[0].input_tokens, 8000, rng)  # type: ignore[arg-type]
    assert abs((ins == 1).mean() - 0.75) < 0.03


def test_exact_prompt_tokens_word_and_bpe(bpe: HFTokenizer) -> None:
    spec = parse_workload(
        {**BASE, "input_tokens": {"dist": "uniform", "low": 5, "high": 300}, "count": 40}
    )
    for tok in (WordTokenizer(), bpe):
        reqs = materialize(spec, tok)
        want = sample_lengths(spec.mix[0].input_tokens, 40, np.random.default_rng(0))  # type: ignore[arg-type]
        assert len(want) == 40
        for r in reqs:
            assert len(tok.encode(r.prompt or "")) == r.prompt_tokens
        exact = sum(r.prompt_tokens == len(tok.encode(r.prompt or "")) for r in reqs)
        assert exact == 40


def test_deterministic_and_prefix_groups_share_text(bpe: HFTokenizer) -> None:
    data = {
        **BASE,
        "prefix": {"groups": 3, "tokens": 20},
        "input_tokens": {"dist": "fixed", "value": 60},
    }
    spec = parse_workload(data)
    a, b = materialize(spec, bpe), materialize(spec, bpe)
    assert a == b
    assert {r.prefix_group for r in a} == {0, 1, 2}
    by_group: dict[int, set[str]] = {}
    for r in a:
        assert r.prompt_tokens == 60
        prefix_text = bpe.decode(bpe.encode(r.prompt or "")[:18])
        by_group.setdefault(r.prefix_group or 0, set()).add(prefix_text)
    assert all(len(v) == 1 for v in by_group.values())
    other = materialize(parse_workload({**data, "seed": 1}), bpe)
    assert [r.prompt for r in other] != [r.prompt for r in a]


def test_weighted_mix_and_priority() -> None:
    spec = parse_workload(
        {
            "count": 2000,
            "arrival": {"kind": "constant", "rate": 100},
            "mix": [
                {"name": "short", "weight": 3, "input_tokens": {"dist": "fixed", "value": 4},
                 "output_tokens": {"dist": "fixed", "value": 2}, "priority": 0},
                {"name": "long", "weight": 1, "input_tokens": {"dist": "fixed", "value": 40},
                 "output_tokens": {"dist": "fixed", "value": 2}, "priority": 1},
            ],
        }
    )  # fmt: skip
    reqs = materialize(spec, WordTokenizer())
    long = [r for r in reqs if r.sub == "long"]
    assert abs(len(long) / 2000 - 0.25) < 0.03
    assert all(r.priority == 1 and r.prompt_tokens == 40 for r in long)
    assert reqs[1].arrival_s == pytest.approx(0.01)


def test_poisson_schedule_passes_ks_and_gamma_mean() -> None:
    rng = np.random.default_rng(3)
    t = arrival_offsets_s("poisson", 50.0, rng, count=5000)
    d, p = ks_exponential(np.diff(t), 50.0)
    assert p > 0.01, (d, p)
    # the same test rejects a constant schedule
    assert (
        ks_exponential(np.diff(arrival_offsets_s("constant", 50.0, rng, count=5000)), 50.0)[1]
        < 1e-6
    )
    g = arrival_offsets_s("gamma", 50.0, rng, count=20000, burstiness=0.25)
    gaps = np.diff(g)
    assert abs(gaps.mean() - 0.02) / 0.02 < 0.05
    assert gaps.std() / gaps.mean() == pytest.approx(2.0, rel=0.1)  # CV = 1/sqrt(shape)
    bounded = arrival_offsets_s("poisson", 100.0, rng, duration_s=2.0)
    assert bounded.max() < 2.0 and abs(len(bounded) - 200) < 60


def test_trace_hash_ids_share_blocks(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 0, "input_length": 30, "output_length": 4, "hash_ids": [1, 2]},
        {"timestamp": 500, "input_length": 25, "output_length": 4, "hash_ids": [1, 3]},
    ]
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    spec = parse_workload(
        {
            "trace": {"path": str(tmp_path / "t.jsonl"), "block_tokens": 16},
            "arrival": {"kind": "trace"},
        }
    )
    a, b = materialize(spec, WordTokenizer())
    assert (a.prompt_tokens, b.prompt_tokens) == (30, 25)
    assert a.prompt.split()[:16] == b.prompt.split()[:16]  # type: ignore[union-attr]
    assert a.prompt.split()[16:25] != b.prompt.split()[16:25]  # type: ignore[union-attr]
    assert (a.arrival_s, b.arrival_s) == (0.0, 0.5)


def test_a_simulated_trace_counts_its_prompts_as_bench_sends_them(tmp_path: Path) -> None:
    """The simulator counts its own "#1#1..." texts (`CountingTokenizer`): a trace's prompts
    are built block by block, and read as one word each they simulated 1-token prompts
    (bench sent 600 and 700). Its shared hash blocks are then prefix-cache hits."""
    from servetune.engines.config import EngineConfig
    from servetune.hardware import get_hardware
    from servetune.model import get_model
    from servetune.sim.engine import CountingTokenizer, materialize_for_sim, simulate

    assert len(CountingTokenizer().encode("#1#1#256")) == 258
    assert len(CountingTokenizer().encode("#1 word")) == 2  # not its own text: words
    rows = [
        {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]},
        {"timestamp": 500, "input_length": 700, "output_length": 6, "hash_ids": [1, 3]},
    ]
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    spec = parse_workload(
        {"trace": {"path": str(tmp_path / "t.jsonl"), "block_tokens": 256},
         "arrival": {"kind": "trace"}}
    )  # fmt: skip
    assert list(materialize_for_sim(spec).prompt_tokens) == [600, 700]
    res, _ = simulate(get_model("llama-3.1-8b"), get_hardware("h100-sxm"), EngineConfig(), spec)
    assert [r.prompt_tokens for r in res.records] == [600, 700]
    assert res.target.sim.prefix_hit_tokens == 256  # block 1, shared


def test_sharegpt(tmp_path: Path) -> None:
    data = [
        {
            "conversations": [
                {"from": "human", "value": "w1 w2"},
                {"from": "gpt", "value": "w3 w4 w5"},
            ]
        }
    ]
    (tmp_path / "s.json").write_text(json.dumps(data))
    spec = parse_workload(
        {"count": 2, "arrival": {"kind": "closed", "concurrency": 1},
         "dataset": {"path": str(tmp_path / "s.json"), "format": "sharegpt"}}
    )  # fmt: skip
    reqs = materialize(spec, WordTokenizer())
    assert [(r.prompt_tokens, r.output_tokens) for r in reqs] == [(2, 3), (2, 3)]


def test_with_load_switches_mode() -> None:
    spec = parse_workload(BASE)
    assert spec.with_load(concurrency=4).arrival.kind == "closed"
    assert spec.with_load(rate=7).arrival.rate == 7
    capped = spec.with_load(rate=7, concurrency=2)
    assert capped.arrival.kind == "poisson" and capped.arrival.concurrency == 2


def test_duration_alone_replaces_the_files_count() -> None:
    """`--duration 3` on a file of `count: 200` runs 3 s, not 200 requests (the count ended
    the arrivals first); both together are refused (the count would end the run first and
    the duration be dropped), and a count replaces the file's duration."""
    spec = parse_workload({**BASE, "count": 200, "arrival": {"kind": "constant", "rate": 20}})
    timed = spec.with_load(duration_s=3.0)
    assert timed.count is None and timed.duration_s == 3.0
    assert abs(len(materialize(timed, WordTokenizer())) - 60) <= 1  # 20 req/s x 3 s, not 200
    with pytest.raises(ValueError, match="give count or duration_s, not both"):
        spec.with_load(count=10, duration_s=3.0)
    assert timed.with_load(count=10).duration_s is None
    assert spec.with_load(rate=5).count == 200


def test_a_swept_workload_file_needs_no_load_of_its_own(tmp_path) -> None:
    """`--rate`/`--concurrency` set the load, so the file may leave arrival out entirely."""
    from servetune.errors import InputError
    from servetune.workload.spec import load_workload

    path = tmp_path / "w.yaml"
    path.write_text(
        "count: 10\ninput_tokens: {dist: fixed, value: 8}\n"
        "output_tokens: {dist: fixed, value: 4}\narrival: {kind: poisson}\n"
    )
    with pytest.raises(InputError, match="needs a rate"):
        load_workload(path)
    spec = load_workload(path, swept=True)
    assert spec.with_load(rate=3.0).arrival.rate == 3.0
    assert spec.with_load(concurrency=2).arrival.kind == "closed"


def test_a_rate_point_of_a_closed_loop_file_has_no_in_flight_cap(tmp_path) -> None:
    """A closed loop's users (the swept file's placeholder 1, or the file's own users) are
    not an open loop's in-flight cap: `--rate 8` on such a file must not run one request at
    a time. An explicit cap still holds."""
    from servetune.workload.spec import load_workload

    path = tmp_path / "w.yaml"
    path.write_text("count: 10\ninput_tokens: {dist: fixed, value: 8}\n"
                    "output_tokens: {dist: fixed, value: 4}\n")  # fmt: skip
    swept = load_workload(path, swept=True)
    assert swept.arrival.kind == "closed" and swept.arrival.concurrency == 1  # placeholder
    at_rate = swept.with_load(rate=8.0).arrival
    assert (at_rate.kind, at_rate.rate, at_rate.concurrency) == ("poisson", 8.0, None)
    users = parse_workload({**BASE, "arrival": {"kind": "closed", "concurrency": 6}})
    assert users.with_load(rate=2.0).arrival.concurrency is None
    assert users.with_load(rate=2.0, concurrency=3).arrival.concurrency == 3


def test_safe_ids_are_found_once_per_tokenizer_identity(bpe: HFTokenizer) -> None:
    """Each measurement makes a new tokenizer object for the same server: the search
    (~1,000 encodes, HTTP calls on `server`) runs once; later objects re-check 3 ids. A
    tokenizer that no longer round-trips them (a restarted server) searches again."""
    from servetune.workload import tokenizer as tk

    class Counting:
        def __init__(self, inner: HFTokenizer, name: str) -> None:
            self.inner, self.name, self.calls = inner, name, 0

        def encode(self, text: str) -> list[int]:
            self.calls += 1
            return self.inner.encode(text)

        def decode(self, ids: list[int]) -> str:
            return self.inner.decode(ids)

    name = f"server:http://test-{id(bpe)}"
    first = Counting(bpe, name)
    ids = tk.safe_token_ids(first)
    assert first.calls > 200  # the search
    again = Counting(bpe, name)
    assert tk.safe_token_ids(again) == ids and again.calls <= 3  # the re-check only
    # the same name, another vocabulary (its ids 1000 up): the old ids fail the re-check
    other = Counting(bpe, name)
    other.encode = lambda text: [i + 1000 for i in bpe.encode(text)]  # type: ignore[method-assign]
    other.decode = lambda ids: bpe.decode([i - 1000 for i in ids if i >= 1000])  # type: ignore[method-assign]
    found = tk.safe_token_ids(other)
    assert found == [i + 1000 for i in ids]  # searched again, on the new vocabulary


def test_a_prompt_costs_one_encode_and_no_decode(bpe: HFTokenizer) -> None:
    """Prompt text is the safe tokens' own texts joined (`safe_token_pieces`), so once the
    safe tokens are known a prompt costs one encode (its count check) and no decode: on a
    server's tokenizer each call is an HTTP round trip."""

    class Counting:
        name = f"server:http://pieces-{id(bpe)}"

        def __init__(self) -> None:
            self.encodes = self.decodes = 0

        def encode(self, text: str) -> list[int]:
            self.encodes += 1
            return bpe.encode(text)

        def decode(self, ids: list[int]) -> str:
            self.decodes += 1
            return bpe.decode(ids)

        def vocab_size(self) -> int:
            return 0

    tok = Counting()
    spec = parse_workload({**BASE, "count": 40})
    materialize(spec, tok)  # finds the safe tokens
    tok.encodes = tok.decodes = 0
    reqs = materialize(spec.model_copy(update={"seed": 9}), tok)
    assert [len(bpe.encode(r.prompt or "")) for r in reqs] == [r.prompt_tokens for r in reqs]
    assert tok.decodes <= 3  # the identity re-check of the known tokens, no prompt
    assert tok.encodes <= 3 + 2 * len(reqs)  # one a prompt, a second for a rare fix-up


def test_a_local_tokenizer_is_used_only_where_the_server_agrees(
    bpe: HFTokenizer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A launched vLLM serving a local directory: its tokenizer.json builds the prompts when
    the server's /tokenize gives the same ids on the probe texts (`agree`); a server that
    tokenizes otherwise, or fails, keeps its own tokenizer."""
    import shutil

    from servetune.measure.real import engine_tokenizer
    from servetune.workload import tokenizer as tk

    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(bpe.name.removeprefix("hf:"), model / "tokenizer.json")
    for server_encode, local in (
        (lambda self, text: bpe.encode(text), True),  # the same tokenizer
        (lambda self, text: [i + 1 for i in bpe.encode(text)], False),  # another vocabulary
        (lambda self, text: 1 / 0, False),  # a server that fails the probe
    ):
        monkeypatch.setattr(tk.ServerTokenizer, "encode", server_encode)
        monkeypatch.setattr(tk.ServerTokenizer, "decode", lambda self, ids: bpe.decode(ids))
        tok = engine_tokenizer("vllm", "http://127.0.0.1:9", str(model))
        assert isinstance(tok, HFTokenizer) is local
    assert tk.agree(bpe, bpe) and not tk.agree(bpe, WordTokenizer())
    # llama.cpp serving a GGUF file: no tokenizer.json beside it, the server's own
    monkeypatch.undo()
    assert isinstance(
        engine_tokenizer("llamacpp", "http://127.0.0.1:9", "m.gguf"), tk.ServerTokenizer
    )


def test_a_trace_out_of_order_starts_at_its_earliest_send(tmp_path) -> None:
    """Lines out of time order: the earliest timestamp is t = 0, so no request is due
    before the run starts (it read the first line's, giving a negative send time)."""
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"timestamp": 100, "input_length": 16, "output_length": 4, "hash_ids": [1]}\n'
        '{"timestamp": 0, "input_length": 16, "output_length": 4, "hash_ids": [2]}\n'
    )
    spec = parse_workload({"trace": {"path": str(trace)}, "arrival": {"kind": "trace"}})
    reqs = materialize(spec, WordTokenizer())
    assert sorted(r.arrival_s for r in reqs) == [0.0, 0.1]


def test_a_trace_replay_longer_than_a_week_is_refused_unless_sped_up(tmp_path) -> None:
    """8 days of timestamps replay in 4 at time_scale 2 (within the week the longest public
    trace spans); at time_scale 1 it is refused in one line, not left to wait for days."""
    from servetune.errors import InputError

    trace = tmp_path / "t.jsonl"
    eight_days_ms = 8 * 86_400_000
    trace.write_text(
        '{"timestamp": 0, "input_length": 16, "output_length": 4}\n'
        f'{{"timestamp": {eight_days_ms}, "input_length": 16, "output_length": 4}}\n'
    )
    slow = {"trace": {"path": str(trace)}, "arrival": {"kind": "trace"}}
    with pytest.raises(
        InputError, match=r"workload.trace: the timestamps in .*t.jsonl span 6.91e\+05 s"
    ):
        materialize(parse_workload(slow), WordTokenizer())
    fast = {**slow, "trace": {"path": str(trace), "time_scale": 2.0}}
    assert [r.arrival_s for r in materialize(parse_workload(fast), WordTokenizer())] == [
        0.0,
        4 * 86_400.0,
    ]
    # only the lines a run sends count: the first one alone spans nothing
    assert len(materialize(parse_workload({**slow, "count": 1}), WordTokenizer())) == 1
    # a closed loop ignores the timestamps: nothing waits on them
    closed = {**slow, "arrival": {"kind": "closed", "concurrency": 1}}
    assert len(materialize(parse_workload(closed), WordTokenizer())) == 2
    # a workload file is refused when loaded, before any run; unless the command line sets
    # the load (--rate), which replaces the trace's own arrival
    wl = tmp_path / "w.yaml"
    wl.write_text("trace: {path: t.jsonl}\narrival: {kind: trace}\n")
    with pytest.raises(InputError, match="span 6.91e\\+05 s"):
        load_workload(wl)
    swept = load_workload(wl, swept=True).with_load(rate=2.0, count=2)
    assert len(materialize(swept, WordTokenizer())) == 2


def test_a_prefill_only_trace_line_is_served_one_token(tmp_path) -> None:
    """`output_length: 0` (traces of KV-cache studies hold such lines) is kept and asks for
    one token, the least a server's max_tokens takes; a negative one is refused."""
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 16, "output_length": 0}\n')
    spec = parse_workload({"trace": {"path": str(trace)}, "arrival": {"kind": "trace"}})
    assert [r.output_tokens for r in materialize(spec, WordTokenizer())] == [1]
    trace.write_text('{"timestamp": 0, "input_length": 16, "output_length": -1}\n')
    with pytest.raises(InputError, match=r"line 1\.output_length: -1 is negative"):
        materialize(spec, WordTokenizer())  # the file changed: read again


_LENGTHS = {"input_tokens": {"dist": "fixed", "value": 20},
            "output_tokens": {"dist": "fixed", "value": 5}}  # fmt: skip
_CHAT = {"kind": "chat", "turns": {"dist": "fixed", "value": 2},
         "user_tokens": {"dist": "fixed", "value": 20},
         "output_tokens": {"dist": "fixed", "value": 5}}  # fmt: skip


@pytest.mark.parametrize(
    "extra,needle",
    [
        ({"arrival": {"kind": "poisson", "rate": 2, "burstiness": 0.1}}, "burstiness: only"),
        ({"arrival": {"kind": "closed", "concurrency": 2, "rate": 5}}, "rate: arrival.kind"),
        ({"count": 100, "duration_s": 2}, "give count or duration_s, not both"),
        ({"sampling": {"extra_body": {"max_tokens": 50}}}, "extra_body: max_tokens set by"),
        ({"sessions": {**_CHAT, "think_time_s": {"dist": "exponential", "value": 2}}},
         "value: not read by dist exponential"),
        ({"sessions": {**_CHAT, "think_time_s": {"dist": "exponential"}}}, "needs its mean"),
        ({"sessions": {**_CHAT, "think_time_s": float("inf")}}, "finite number"),
        ({"sessions": {**_CHAT, "context_cap_tokens": True}}, "not true"),
    ],
)  # fmt: skip
def test_a_field_the_workload_would_ignore_is_refused(extra: dict, needle: str) -> None:
    """Each of these ran as if the field were not given (a bug hunt's finds): a poisson
    burstiness, a closed loop's rate, a duration beside a count, an extra_body field
    servetune sets itself, a delay field its dist does not read; an infinite think time
    overflowed the send times and hung bench."""
    data = {"count": 4, "arrival": {"kind": "closed", "concurrency": 2}, **extra}
    if "sessions" not in extra:
        data.update(_LENGTHS)
    with pytest.raises(InputError, match=needle):
        parse_workload(data)


def test_a_dataset_or_trace_refuses_the_lengths_it_would_ignore(tmp_path: Path) -> None:
    (tmp_path / "p.jsonl").write_text('{"prompt": "a b c", "output_tokens": 4}\n')
    (tmp_path / "t.jsonl").write_text('{"timestamp": 0, "input_length": 9, "output_length": 2}\n')
    ds = {"path": str(tmp_path / "p.jsonl")}
    trace = {"trace": {"path": str(tmp_path / "t.jsonl")}, "arrival": {"kind": "trace"}}
    for data, needle in (
        ({"count": 2, "dataset": ds, "input_tokens": {"dist": "fixed", "value": 5000}},
         "input_tokens: a dataset's prompts"),
        ({"count": 2, "dataset": ds, "prefix": {"groups": 2, "tokens": 300}}, "prefix: a"),
        ({**trace, **_LENGTHS}, "give a trace or input_tokens"),
        ({**trace, "duration_s": 1}, "duration_s: a trace replays"),
        ({**trace, "arrival": {"kind": "trace", "rate": 100}}, "rate: arrival.kind trace"),
    ):  # fmt: skip
        with pytest.raises(InputError, match=needle):
            parse_workload({"arrival": {"kind": "poisson", "rate": 1}, **data})
    # what they may carry: a dataset's output lengths, a trace at another rate
    parse_workload({"count": 2, "dataset": ds, "output_tokens": {"dist": "fixed", "value": 3},
                    "arrival": {"kind": "poisson", "rate": 1}})  # fmt: skip
    spec = parse_workload(trace).with_load(rate=4.0)
    assert spec.arrival.kind == "poisson" and spec.trace is not None


def test_count_or_duration_from_the_command_line_sizes_a_file_without_either(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--count/--duration size the run as --rate/--concurrency set its load: a file that
    gives neither was refused ("give count or duration_s") with the flag right there."""
    from cli_run import run_cli
    from servetune.mock.server import MockConfig, mock_in_thread

    wl = tmp_path / "w.yaml"
    wl.write_text(
        "arrival: {kind: closed, concurrency: 2}\n"
        "input_tokens: {dist: fixed, value: 8}\noutput_tokens: {dist: fixed, value: 4}\n"
    )
    code, out, err = run_cli(capsys, "simulate", "-w", str(wl), "--count", "12", "--no-store",
                             "--json")  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["completed"] == 12
    code, out, err = run_cli(capsys, "simulate", "-w", str(wl), "--duration", "2", "--no-store",
                             "--json")  # fmt: skip
    assert code == 0, err
    with mock_in_thread(MockConfig()) as srv:
        code, out, err = run_cli(
            capsys, "bench", "--url", f"http://127.0.0.1:{srv.port}", "-w", str(wl),
            "--count", "6", "--tokenizer", "word", "--no-store", "--json",
        )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["metrics"]["measured"] == 6
    code, _, err = run_cli(capsys, "simulate", "-w", str(wl), "--no-store")
    assert code == 2 and "give count or duration_s" in err  # nothing sizes it: still refused


def test_a_bare_number_is_a_fixed_length() -> None:
    """`input_tokens: 4096` was refused ("a valid dictionary"); it is the form one writes
    first, and the sessions' delays already read a bare number as fixed."""
    bare = parse_workload({**BASE, "input_tokens": 40, "output_tokens": 8})
    assert bare == parse_workload(BASE)
    with pytest.raises(InputError) as e:
        parse_workload({**BASE, "input_tokens": -5})
    assert e.value.one_line().startswith("workload.input_tokens: Input should be greater")
    with pytest.raises(InputError, match="workload.output_tokens"):
        parse_workload({**BASE, "output_tokens": True})  # YAML's true is no length


def test_with_lengths_fixes_every_class_and_keeps_the_rest() -> None:
    """`--input-len` / `--output-len`: the ISL/OSL what-if without writing a file."""
    from servetune.workload.spec import Fixed, with_lengths

    two = {**{k: v for k, v in BASE.items() if not k.endswith("_tokens")},
           "mix": [{"name": "a", "weight": 3, "input_tokens": 10, "output_tokens": 5},
                   {"name": "b", "input_tokens": {"dist": "uniform", "low": 5, "high": 9},
                    "output_tokens": 7, "prefix": {"tokens": 4}}]}  # fmt: skip
    spec = with_lengths(parse_workload(two), 64, None)
    assert [m.input_tokens for m in spec.mix] == [Fixed(value=64)] * 2
    assert [m.output_tokens for m in spec.mix] == [Fixed(value=5), Fixed(value=7)]
    assert spec.mix[0].weight == 3 and spec.mix[1].prefix is not None
    assert spec.arrival == parse_workload(two).arrival and spec.count == 50
    assert with_lengths(spec, None, None) is spec
    for args, says in [
        ((0, None), "--input-len: 0 tokens (give 1 to 10,000,000)"),
        ((None, 10**8), "--output-len: 100000000 tokens"),
        ((3, None), "--input-len: prefix.tokens (4) leaves no room in input_tokens (at most 3)"),
    ]:
        with pytest.raises(InputError) as e:
            with_lengths(parse_workload(two), *args)
        assert e.value.one_line().startswith(says)


@pytest.mark.parametrize("content", [b"garbage", b"", b'{"a":1}', b"\xff\xfe{"])
def test_a_file_that_is_no_tokenizer_is_one_line(tmp_path: Path, content: bytes) -> None:
    """`tokenizers` raises a bare Exception for a file it cannot read (bench printed its
    traceback): one line naming --tokenizer and the file."""
    path = tmp_path / "tokenizer.json"
    path.write_bytes(content)
    with pytest.raises(InputError) as e:
        HFTokenizer(tmp_path)
    assert e.value.field == "--tokenizer" and str(path) in e.value.problem
    assert "\n" not in e.value.one_line()


@pytest.mark.parametrize(
    ("parse", "data", "field", "fix"),
    [
        ("slo", {"ttft_ms": {"p42": 100}}, "slo.ttft_ms.p42",
         "known: p50, p90, p95, p99, mean, max"),
        ("slo", {"ttfts_ms": {"p99": 100}}, "slo.ttfts_ms", "did you mean ttft_ms"),
        ("workload", {**BASE, "streem": True}, "workload.streem", "did you mean stream"),
        ("workload", {**BASE, "arrival": {"kind": "poisson", "rate": 1, "rat": 3}},
         "workload.arrival.rat", "did you mean rate?"),
    ],
)  # fmt: skip
def test_an_unknown_key_names_the_keys_its_place_has(
    parse: str, data: dict, field: str, fix: str
) -> None:
    """Pydantic said "Extra inputs are not permitted" (a `p42` target, a misspelt key):
    the keys that place takes, or the close ones (`errors.known_keys`)."""
    from servetune.slo import parse_slo

    with pytest.raises(InputError) as e:
        (parse_slo if parse == "slo" else parse_workload)(data)
    assert e.value.field == field and e.value.problem.startswith("unknown key "), e.value
    assert fix in (e.value.fix or ""), e.value.fix
