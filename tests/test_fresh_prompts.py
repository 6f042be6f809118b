"""Each load point on one engine draws its own prompts (`measure.real.fresh_prompts`): an
engine serves a prompt it has seen from its prompt cache, so a point that repeated an
earlier point's prompts would measure cache hits that real traffic never gets."""

from __future__ import annotations

from servetune.measure.real import fresh_prompts
from servetune.measure.session import Point
from servetune.workload.materialize import materialize
from servetune.workload.spec import parse_workload
from servetune.workload.tokenizer import WordTokenizer

SPEC = parse_workload({"seed": 5, "count": 4,
                       "input_tokens": {"dist": "uniform", "low": 32, "high": 96},
                       "output_tokens": {"dist": "fixed", "value": 16},
                       "arrival": {"kind": "closed", "concurrency": 2}})  # fmt: skip


def test_the_first_point_is_as_given_and_every_later_one_draws_new_prompts() -> None:
    first = fresh_prompts(Point("c1", SPEC), 0)
    assert first.spec is SPEC
    tok = WordTokenizer()
    seen = {r.prompt for r in materialize(first.spec, tok)}
    for k in (1, 2, 3):
        later = fresh_prompts(Point("c2", SPEC.with_load(concurrency=4)), k)
        assert later.spec.seed == SPEC.seed + k and later.spec.arrival.concurrency == 4
        prompts = {r.prompt for r in materialize(later.spec, tok)}
        assert not prompts & seen  # no prompt served before is sent again
        seen |= prompts


def test_fixed_requests_are_sent_as_given() -> None:
    reqs = materialize(SPEC, WordTokenizer())
    replay = Point("replay", SPEC, requests=reqs)
    assert fresh_prompts(replay, 3) is replay


class _Server:
    def __init__(self) -> None:
        self.sent: list[Point] = []

    def measure(self, point: Point, sinks=None):  # noqa: ANN201
        from servetune.results.schema import RunResult, Target

        self.sent.append(point)
        return RunResult.model_construct(target=Target())


class _Engine:
    engine, cfg, settings = "llamacpp", None, None

    def check(self) -> None:
        pass


def _session():
    from servetune.engines.config import EngineConfig
    from servetune.measure.real import EngineSession

    sess = EngineSession.__new__(EngineSession)  # the engine and its tokenizer stood in
    sess.server, sess.srv, sess.measured = _Server(), _Engine(), 0
    sess.srv.cfg = EngineConfig(engine="llamacpp")
    return sess


def test_an_engine_warms_up_before_its_first_point_then_each_point_is_fresh() -> None:
    from servetune.measure.real import WARMUP_REQUESTS

    sess = _session()
    sess.measure(Point("c4", SPEC.with_load(concurrency=4)))
    sess.measure(Point("c8", SPEC.with_load(concurrency=8)))
    warm, first, second = sess.server.sent
    # the warm-up: the first point's own requests, one user, a couple, unmeasured seed
    assert (warm.spec.arrival.concurrency, warm.spec.count) == (1, WARMUP_REQUESTS)
    assert warm.spec.seed == SPEC.seed and "warm-up" in warm.label
    assert (first.spec.arrival.concurrency, first.spec.seed) == (4, SPEC.seed + 1)
    assert (second.spec.arrival.concurrency, second.spec.seed) == (8, SPEC.seed + 2)
    # a replay of fixed requests is sent as given, without a warm-up
    sess = _session()
    replay = Point("replay", SPEC, requests=materialize(SPEC, WordTokenizer()))
    sess.measure(replay)
    assert sess.server.sent == [replay]


def test_a_session_workload_warms_up_with_first_turns_only() -> None:
    """Whole sessions would wait on think and tool times: the warm-up sends WARMUP_REQUESTS
    sessions of one turn each (a chat's first turn, an agent's answering call), one at a
    time; a chat dataset's conversations keep their turns, and one of them is sent."""
    from pathlib import Path

    from servetune.measure.real import WARMUP_REQUESTS, warmup_spec
    from servetune.workload.session_plan import plan_sessions
    from servetune.workload.spec import load_workload

    examples = Path(__file__).resolve().parents[1] / "examples"
    chat = parse_workload({
        "count": 4, "arrival": {"kind": "closed", "concurrency": 2},
        "sessions": {"kind": "chat", "turns": {"dist": "fixed", "value": 4},
                     "user_tokens": {"dist": "fixed", "value": 128},
                     "output_tokens": {"dist": "fixed", "value": 16}, "think_time_s": 0.5,
                     "system_prompt": {"groups": 1, "tokens": 256}},
    })  # fmt: skip
    for spec in (load_workload(examples / "agent-loop.yaml"), chat):
        assert len(plan_sessions(spec).requests()) > 2 * WARMUP_REQUESTS  # whole sessions
        warm = warmup_spec(spec)
        reqs = plan_sessions(warm).requests()
        assert len(reqs) == WARMUP_REQUESTS and {r.sub for r in reqs} == {"turn0"}
        assert warm.arrival.concurrency == 1
        # a first turn as the workload's own: its system prompt, then the task or message
        assert spec.sessions is not None and spec.sessions.system_prompt is not None
        assert all(r.prompt_tokens > spec.sessions.system_prompt.tokens for r in reqs)
    dataset = load_workload(examples / "multi-turn-chat.yaml")
    warm = warmup_spec(dataset)
    assert (warm.count, warm.arrival.concurrency, warm.sessions) == (1, 1, dataset.sessions)
    plain = warmup_spec(SPEC)
    assert (plain.count, plain.arrival.concurrency, plain.sessions) == (WARMUP_REQUESTS, 1, None)
