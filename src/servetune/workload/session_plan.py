"""A session workload drawn into its exact sessions: per turn the new tokens, the output
length, the delay before it and how much history the client still sends.

`bench` sends these turns (building each prompt from the history it really received),
`simulate` replays their token counts, so both see the same sessions. Everything is drawn
from numpy generators seeded by the spec's seed, like `materialize`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from servetune.errors import InputError
from servetune.workload.materialize import PromptMaker, Request, arrival_offsets_s, sample_lengths
from servetune.workload.sessions import (
    AgentLoop,
    Conversation,
    Seconds,
    SessionDataset,
)
from servetune.workload.sources import conversation_messages, message_text, read_trace
from servetune.workload.spec import WorkloadSpec
from servetune.workload.tokenizer import Tokenizer, WordTokenizer

# Closed loops bounded only by a duration start sessions from a pool this big.
SESSION_POOL = 512


@dataclass(frozen=True)
class Turn:
    """One model call of a session. `new_tokens` were appended since the previous call (a
    user message, tool results; the first turn: the opening message); `keep_from` is the
    first earlier turn still in the history (a context cap dropped the ones before)."""

    new_tokens: int
    output_tokens: int
    delay_s: float = 0.0  # after the previous answer: think time or tool latency
    keep_from: int = 0
    new_text: str | None = None


@dataclass(frozen=True)
class PlannedSession:
    index: int
    first_request: int  # index of its first turn's Request
    start_s: float | None  # open loop: when it starts
    system_group: int  # -1: no system prompt
    system_tokens: int
    turns: tuple[Turn, ...]

    def prompt_tokens(self, j: int) -> int:
        """Tokens of turn j's prompt as planned: system + kept history + the new part."""
        t = self.turns
        kept = sum(t[k].new_tokens + t[k].output_tokens for k in range(t[j].keep_from, j))
        return self.system_tokens + kept + t[j].new_tokens

    def reused_tokens(self, j: int) -> int:
        """Prompt tokens of turn j that the previous turn's prompt already held: what a
        prefix cache can serve (0 for a first turn, or after the history was cut)."""
        if j == 0:
            return 0
        if self.turns[j].keep_from != self.turns[j - 1].keep_from:
            return self.system_tokens
        return self.prompt_tokens(j - 1)


@dataclass
class SessionPlan:
    sessions: list[PlannedSession]
    system_texts: list[str]  # by group (empty without text)
    closed: bool  # users run sessions back to back (else each starts at start_s)

    def requests(self) -> list[Request]:
        """One Request per turn, in session order: `sub` names the turn (`turn0` is the
        first, the rest are follow-ups), `prefix_group` the session, and `messages` (with
        text) what the turn adds: the system prompt (first turn) and its new message. The
        client builds the rest of the prompt from the answers it received."""
        out = []
        for s in self.sessions:
            for j, t in enumerate(s.turns):
                msgs = None
                if t.new_text is not None:
                    msgs = [{"role": "user", "content": t.new_text}]
                    if j == 0 and s.system_group >= 0 and self.system_texts:
                        sys_text = self.system_texts[s.system_group]
                        msgs.insert(0, {"role": "system", "content": sys_text})
                out.append(
                    Request(
                        index=s.first_request + j,
                        sub=f"turn{j}",
                        prompt_tokens=s.prompt_tokens(j),
                        output_tokens=t.output_tokens,
                        arrival_s=s.start_s if j == 0 else None,
                        prefix_group=s.index,
                        messages=msgs,
                    )
                )
        return out

    def cuts(self) -> set[tuple[int, int]]:
        """(session, turn) of each turn whose history a context cap cut (`keep_from`
        moved): what a prefix cache can serve of it is the system prompt only."""
        return {
            (s.index, j)
            for s in self.sessions
            for j in range(1, len(s.turns))
            if s.turns[j].keep_from != s.turns[j - 1].keep_from
        }

    def system_prompts(self) -> dict[int, tuple[int, int]]:
        """session -> (system prompt group, its tokens); group -1: none."""
        return {s.index: (s.system_group, s.system_tokens) for s in self.sessions}


# --- pure samplers and the context cap ------------------------------------------------


def sample_seconds(dist: Seconds, n: int, rng: np.random.Generator) -> np.ndarray:
    """n delays (s) from `dist`."""
    if dist.dist == "fixed":
        return np.full(n, dist.value)
    if dist.dist == "uniform":
        return rng.uniform(dist.low, dist.high, size=n)
    if dist.dist == "exponential":
        return rng.exponential(dist.mean, size=n) if dist.mean > 0 else np.zeros(n)
    if dist.mean <= 0:
        return np.zeros(n)
    mu = math.log(dist.mean) - dist.sigma**2 / 2  # E[X] = exp(mu + sigma^2/2)
    return rng.lognormal(mu, dist.sigma, size=n)


def apply_cap(
    turns: list[Turn], system_tokens: int, cap: int | None, policy: str, where: str
) -> list[Turn]:
    """The client's context cap: before each turn, drop the oldest exchanges until system +
    history + new + output fit in `cap` (drop_oldest), or end the session at the first
    turn that would not fit (end_session). A turn that cannot fit even alone is an error."""
    if cap is None:
        return turns
    out: list[Turn] = []
    keep = 0
    for j, t in enumerate(turns):
        alone = system_tokens + t.new_tokens + t.output_tokens
        if alone > cap:
            raise InputError(
                "workload.sessions.context_cap_tokens",
                f"{where} turn {j} needs {alone} tokens (system + new + output) alone, "
                f"more than the cap of {cap}",
                "raise the cap or shorten the messages",
            )

        def need(k: int, j: int = j, t: Turn = t) -> int:
            hist = sum(out[i].new_tokens + out[i].output_tokens for i in range(k, j))
            return system_tokens + hist + t.new_tokens + t.output_tokens

        if need(keep) > cap:
            if policy == "end_session":
                break
            while need(keep) > cap:
                keep += 1
        out.append(Turn(t.new_tokens, t.output_tokens, t.delay_s, keep, t.new_text))
    return out


# --- datasets ---------------------------------------------------------------------------


def read_conversations(ds: SessionDataset) -> list[list[tuple[str, str]]]:
    """Every conversation of the file as (user message, the reply to it) pairs; messages
    other than user/assistant (system, tool) are skipped. A file without any turn is an
    error naming the field."""
    out = [c for c in (_pairs(msgs) for msgs in conversation_messages(ds)) if c]
    if not out:
        raise InputError(
            "workload.sessions.dataset",
            f"{ds.path} holds no conversation with a user message followed by a reply",
            "each line needs messages with role user, then assistant",
        )
    return out


def trace_sessions(ds: SessionDataset) -> list[list[Turn]]:
    """A Mooncake trace's requests chained into sessions: a request whose block hashes
    start with all of an earlier request's (the longest such, its session's latest turn)
    is that session's next turn: its prompt holds that prompt and more. New tokens: its
    input minus the previous input and output (at least 1); delay: the gap between the
    two sends (the trace has no answer times: an upper bound of the think time)."""
    rows = [
        (r.timestamp_ms, r.input_length, r.output_length, r.hash_ids)
        for r in read_trace(ds.path, "workload.sessions.dataset")
    ]
    sessions: list[list[Turn]] = []
    last: dict[tuple[int, ...], tuple[int, float, int, int]] = {}  # hashes -> session, t, in, out
    for t, n_in, n_out, hashes in sorted(rows, key=lambda r: r[0]):
        prev = next(
            (last.pop(hashes[:k]) for k in range(len(hashes), 0, -1) if hashes[:k] in last),
            None,
        )
        if prev is None:
            sessions.append([Turn(max(1, n_in), n_out)])
            k = len(sessions) - 1
        else:
            k, t0, p_in, p_out = prev
            new = max(1, n_in - p_in - p_out)
            sessions[k].append(Turn(new, n_out, max(0.0, (t - t0) / 1000.0)))
        if hashes:
            last[hashes] = (k, t, n_in, n_out)
    return sessions


def _pairs(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [
        (message_text(a["content"]), message_text(b["content"]))
        for a, b in zip(messages, messages[1:], strict=False)
        if (a.get("role"), b.get("role")) == ("user", "assistant")
        and a.get("content")
        and b.get("content")
    ]


# --- the plan ---------------------------------------------------------------------------


def plan_sessions(
    spec: WorkloadSpec, tok: Tokenizer | None = None, *, with_text: bool = True
) -> SessionPlan:
    """The sessions of `spec`. With `tok`, a dataset is counted in its tokens (in words
    without) and, unless `with_text` is False, every new message has text of its exact
    token count (bench's requests; its worker needs the same counts but not the text)."""
    ses = spec.sessions
    if ses is None:
        raise ValueError("not a session workload")
    seq = np.random.SeedSequence(spec.seed)
    rng_arrival, rng_draw, rng_text = (np.random.default_rng(s) for s in seq.spawn(3))
    arr = spec.arrival
    starts: np.ndarray | None = None
    if arr.open_loop:
        starts = arrival_offsets_s(
            arr.kind,
            float(arr.rate or 1.0),
            rng_arrival,
            count=spec.count,
            duration_s=spec.duration_s if spec.count is None else None,
            burstiness=arr.burstiness,
        )
        n = len(starts)
    else:
        n = spec.count or SESSION_POOL
    maker = PromptMaker(tok, rng_text) if tok is not None and with_text else None
    sys_tokens, sys_texts, sys_group = 0, [], np.full(n, -1)
    if ses.system_prompt is not None:
        sys_tokens = ses.system_prompt.tokens
        sys_group = rng_draw.integers(0, ses.system_prompt.groups, size=n)
        if maker is not None:
            sys_texts = [maker.text([], sys_tokens)[0] for _ in range(ses.system_prompt.groups)]
    if isinstance(ses, AgentLoop):
        drawn = [_agent_turns(ses, rng_draw) for _ in range(n)]
    elif ses.dataset is not None and ses.dataset.format == "mooncake":
        traced = trace_sessions(ses.dataset)
        drawn = [traced[i % len(traced)] for i in range(n)]
    elif ses.dataset is not None:
        drawn = _dataset_sessions(ses, n, tok or WordTokenizer(), rng_draw)
    else:
        drawn = [_chat_turns(ses, rng_draw) for _ in range(n)]
    sessions, first = [], 0
    for i, turns in enumerate(drawn):
        turns = apply_cap(turns, sys_tokens, ses.context_cap_tokens, ses.on_cap, f"session {i}")
        if maker is not None:
            turns = [
                t if t.new_text is not None else _with_text(t, maker) for t in turns
            ]  # fmt: skip
        g = int(sys_group[i])
        sessions.append(
            PlannedSession(
                index=i,
                first_request=first,
                start_s=float(starts[i]) if starts is not None else None,
                system_group=g,
                system_tokens=sys_tokens if g >= 0 else 0,
                turns=tuple(turns),
            )
        )
        first += len(turns)
    return SessionPlan(sessions, sys_texts, closed=not arr.open_loop)


def _with_text(t: Turn, maker: PromptMaker) -> Turn:
    text, count = maker.text([], t.new_tokens)
    return Turn(count, t.output_tokens, t.delay_s, t.keep_from, text)


def _one(dist: Any, rng: np.random.Generator, n: int = 1) -> list[int]:
    return sample_lengths(dist, n, rng).tolist()


def _chat_turns(ses: Conversation, rng: np.random.Generator) -> list[Turn]:
    assert ses.turns and ses.user_tokens and ses.output_tokens
    n = max(1, _one(ses.turns, rng)[0])
    new = _one(ses.user_tokens, rng, n)
    out = _one(ses.output_tokens, rng, n)
    think = sample_seconds(ses.think_time_s, n, rng).tolist()
    return [
        Turn(max(1, new[j]), max(1, out[j]), think[j] if j else 0.0) for j in range(n)
    ]  # fmt: skip


def _agent_turns(ses: AgentLoop, rng: np.random.Generator) -> list[Turn]:
    """Step j answers with fan_out tool calls; step j+1 appends their results after the
    slowest tool returns; the last step writes the answer."""
    steps = max(1, _one(ses.steps, rng)[0])
    task = max(1, _one(ses.task_tokens, rng)[0])
    turns: list[Turn] = []
    new, delay = task, 0.0
    for j in range(steps):
        if j == steps - 1:
            out = max(1, _one(ses.answer_tokens or ses.tool_call_tokens, rng)[0])
            turns.append(Turn(new, out, delay))
            break
        fan = max(1, _one(ses.fan_out, rng)[0])
        out = max(1, sum(_one(ses.tool_call_tokens, rng, fan)))
        turns.append(Turn(new, out, delay))
        delay = float(sample_seconds(ses.tool_latency_s, fan, rng).max())
        new = max(1, sum(_one(ses.tool_result_tokens, rng, fan)))
    return turns


def _dataset_sessions(
    ses: Conversation, n: int, tok: Tokenizer, rng: np.random.Generator
) -> list[list[Turn]]:
    assert ses.dataset is not None
    convs = read_conversations(ses.dataset)
    order = rng.permutation(len(convs)) if ses.dataset.shuffle else np.arange(len(convs))
    out = []
    for i in range(n):
        pairs = convs[int(order[i % len(convs)])]
        think = sample_seconds(ses.think_time_s, len(pairs), rng).tolist()
        turns = []
        for j, (user, reply) in enumerate(pairs):
            turns.append(
                Turn(
                    max(1, len(tok.encode(user))),
                    max(1, len(tok.encode(reply))),
                    think[j] if j else 0.0,
                    new_text=user,
                )
            )
        out.append(turns)
    return out
