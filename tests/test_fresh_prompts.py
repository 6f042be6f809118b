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
