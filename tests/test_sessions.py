"""Session workloads without a real engine: the plan (history, delays, context cap,
datasets, bad input), the simulator (prefix reuse across turns, eviction, llama.cpp slot
affinity, chaining), bench's session driver against the mock, and the per-turn metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from servetune.bench.runner import BenchOptions, run_point
from servetune.engines.config import EngineConfig
from servetune.errors import InputError
from servetune.hardware.catalog import get_hardware
from servetune.metrics.compute import compute_metrics
from servetune.metrics.turns import in_class, run_session_metrics, session_metrics
from servetune.mock.server import MockConfig, mock_in_thread
from servetune.model.catalog import get_model
from servetune.sim.engine import simulate
from servetune.slo import SLO
from servetune.workload.materialize import materialize
from servetune.workload.session_plan import plan_sessions
from servetune.workload.spec import parse_workload
from servetune.workload.tokenizer import WordTokenizer

ROOT = Path(__file__).resolve().parents[1]


def chat(count: int = 4, users: int = 2, **ses) -> dict:
    base = {
        "kind": "chat",
        "turns": {"dist": "fixed", "value": 4},
        "user_tokens": {"dist": "fixed", "value": 100},
        "output_tokens": {"dist": "fixed", "value": 20},
        "think_time_s": 0.2,
    }
    return {
        "count": count,
        "arrival": {"kind": "closed", "concurrency": users},
        "sessions": base | ses,
    }


def sim(wl: dict, engine: str = "vllm", **knobs):
    cfg = EngineConfig(engine=engine, **knobs)
    model = get_model("llama-3.1-8b")
    res, _ = simulate(model, get_hardware("h100-sxm"), cfg, parse_workload(wl))
    return res


# --- the plan -------------------------------------------------------------------------


def test_each_turn_resends_the_history_and_waits_the_think_time() -> None:
    plan = plan_sessions(parse_workload(chat(system_prompt={"groups": 2, "tokens": 50})))
    s = plan.sessions[0]
    assert [s.prompt_tokens(j) for j in range(4)] == [150, 270, 390, 510]
    assert [s.reused_tokens(j) for j in range(4)] == [0, 150, 270, 390]
    assert [t.delay_s for t in s.turns] == [0.0, 0.2, 0.2, 0.2]
    reqs = plan.requests()
    assert [r.sub for r in reqs[:5]] == ["turn0", "turn1", "turn2", "turn3", "turn0"]
    assert [r.prefix_group for r in reqs[:5]] == [0, 0, 0, 0, 1]


def test_context_cap_drops_the_oldest_turns_or_ends_the_session() -> None:
    wl = chat(context_cap_tokens=300)
    s = plan_sessions(parse_workload(wl)).sessions[0]
    # 100 + 20 per turn: turn 2 would need 360, so turn 0 is dropped (and its history)
    assert [s.prompt_tokens(j) for j in range(4)] == [100, 220, 220, 220]
    assert [t.keep_from for t in s.turns] == [0, 0, 1, 2]
    assert s.reused_tokens(2) == 0  # the prompt no longer extends the previous one
    wl["sessions"]["on_cap"] = "end_session"
    assert len(plan_sessions(parse_workload(wl)).sessions[0].turns) == 2


def test_agent_loop_appends_tool_results_after_the_slowest_tool() -> None:
    wl = {
        "count": 2,
        "arrival": {"kind": "poisson", "rate": 1},
        "sessions": {
            "kind": "agent",
            "task_tokens": {"dist": "fixed", "value": 200},
            "steps": {"dist": "fixed", "value": 3},
            "tool_call_tokens": {"dist": "fixed", "value": 10},
            "tool_result_tokens": {"dist": "fixed", "value": 300},
            "fan_out": {"dist": "fixed", "value": 2},
            "tool_latency_s": {"dist": "uniform", "low": 1, "high": 2},
            "answer_tokens": {"dist": "fixed", "value": 50},
        },
    }
    s = plan_sessions(parse_workload(wl)).sessions[1]
    assert [(t.new_tokens, t.output_tokens) for t in s.turns] == [(200, 20), (600, 20), (600, 50)]
    assert all(1 <= t.delay_s <= 2 for t in s.turns[1:]) and s.start_s > 0


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"think_time_s": -1}, "think_time_s"),
        ({"context_cap_tokens": 110}, "context_cap_tokens"),
        ({"turns": None}, "workload.sessions"),
    ],
)
def test_bad_input_is_one_line_naming_the_field(change: dict, field: str) -> None:
    wl = chat()
    wl["sessions"] = {k: v for k, v in (wl["sessions"] | change).items() if v is not None}
    with pytest.raises(InputError) as exc:
        plan_sessions(parse_workload(wl))
    msg = str(exc.value)
    assert field in msg and "\n" not in msg


def test_datasets_every_turn_sharegpt_and_messages(tmp_path: Path) -> None:
    share = [
        {
            "conversations": [
                {"from": "human", "value": "one two three"},
                {"from": "gpt", "value": "a b c d e"},
                {"from": "human", "value": "four five"},
                {"from": "gpt", "value": "f g"},
            ]
        }
    ]
    (tmp_path / "sg.json").write_text(json.dumps(share))
    wl = {"count": 1, "arrival": {"kind": "closed", "concurrency": 1},
          "sessions": {"kind": "chat", "dataset": {"path": str(tmp_path / "sg.json"),
                                                   "format": "sharegpt"}}}  # fmt: skip
    plan = plan_sessions(parse_workload(wl), WordTokenizer())
    assert [(t.new_tokens, t.output_tokens) for t in plan.sessions[0].turns] == [(3, 5), (2, 2)]
    assert plan.requests()[1].messages == [{"role": "user", "content": "four five"}]
    (tmp_path / "none.jsonl").write_text(json.dumps({"messages": [{"role": "user",
                                                                   "content": "hi"}]}))  # fmt: skip
    wl["sessions"]["dataset"] = {"path": str(tmp_path / "none.jsonl")}
    with pytest.raises(InputError, match="workload.sessions.dataset: .* no conversation"):
        plan_sessions(parse_workload(wl))


def test_content_parts_are_their_text_in_sessions_and_requests(tmp_path: Path) -> None:
    """An OpenAI content-parts list is its text: a session's turn had sent, and every
    dataset count had counted, the list's Python repr."""
    from servetune.workload.materialize import materialize

    parts = [{"type": "text", "text": "one two"}, {"type": "text", "text": "three"}]
    conv = {"messages": [{"role": "user", "content": parts},
                         {"role": "assistant", "content": "a b"}]}  # fmt: skip
    (tmp_path / "c.jsonl").write_text(json.dumps(conv) + "\n")
    wl = {"count": 1, "arrival": {"kind": "closed", "concurrency": 1},
          "sessions": {"kind": "chat", "dataset": {"path": str(tmp_path / "c.jsonl")}}}  # fmt: skip
    plan = plan_sessions(parse_workload(wl), WordTokenizer())
    assert plan.requests()[0].messages == [{"role": "user", "content": "one two three"}]
    assert plan.sessions[0].turns[0].new_tokens == 3
    req = {"count": 1, "arrival": {"kind": "closed", "concurrency": 1},
           "dataset": {"path": str(tmp_path / "c.jsonl")}, "output_tokens": 4}  # fmt: skip
    (r,) = materialize(parse_workload(req), WordTokenizer())
    assert r.prompt_tokens == 3 + 2 and r.messages == conv["messages"]  # sent as given


def test_mooncake_trace_requests_chain_into_sessions_by_block_hashes(tmp_path: Path) -> None:
    rows = [  # two users interleaved; each next prompt extends its own previous one
        {"timestamp": 0, "input_length": 1000, "output_length": 50, "hash_ids": [1, 2]},
        {"timestamp": 500, "input_length": 900, "output_length": 40, "hash_ids": [7, 8]},
        {"timestamp": 4000, "input_length": 1200, "output_length": 30, "hash_ids": [1, 2, 3]},
        {"timestamp": 6500, "input_length": 1100, "output_length": 20, "hash_ids": [7, 8, 9]},
        {"timestamp": 9000, "input_length": 300, "output_length": 10, "hash_ids": [5]},
    ]
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    ses = {"kind": "chat", "dataset": {"path": str(path), "format": "mooncake"}}
    wl = {"count": 3, "arrival": {"kind": "closed", "concurrency": 1}, "sessions": ses}
    plan = plan_sessions(parse_workload(wl))
    turns = [[(t.new_tokens, t.output_tokens, t.delay_s) for t in s.turns] for s in plan.sessions]
    assert turns == [[(1000, 50, 0.0), (150, 30, 4.0)], [(900, 40, 0.0), (160, 20, 6.0)],
                     [(300, 10, 0.0)]]  # fmt: skip
    assert [plan.sessions[0].prompt_tokens(j) for j in range(2)] == [1000, 1200]


def test_the_builtin_dataset_has_multi_turn_conversations() -> None:
    ses = {"kind": "chat", "dataset": {"path": "builtin", "shuffle": False}}
    wl = {"count": 64, "arrival": {"kind": "closed", "concurrency": 1}, "sessions": ses}
    plan = plan_sessions(parse_workload(wl))
    turns = [len(s.turns) for s in plan.sessions]
    assert max(turns) >= 4 and 1.5 <= sum(turns) / len(turns) <= 2.6  # LMSYS-Chat-1M: 2.0
    outs = [t.output_tokens for s in plan.sessions for t in s.turns]
    assert 150 <= sum(outs) / len(outs) <= 300  # LMSYS-Chat-1M: 214.5 tokens a response


# --- the simulator ----------------------------------------------------------------------


def _followup_ttft(res) -> float:
    m = session_metrics(list(res.records))
    assert m is not None
    return m.followup.ttft_ms.p50


def test_sim_follow_up_ttft_falls_with_prefix_caching_and_hits_match_the_allowance() -> None:
    wl = chat(count=16, users=4, user_tokens={"dist": "fixed", "value": 2000},
              system_prompt={"groups": 2, "tokens": 1000})  # fmt: skip
    on, off = sim(wl), sim(wl, enable_prefix_caching=False)
    assert on.metrics.completed == off.metrics.completed == 64
    assert _followup_ttft(on) < 0.6 * _followup_ttft(off)
    systems = plan_sessions(parse_workload(wl)).system_prompts()
    m = session_metrics(list(on.records), block_tokens=16, system_prompts=systems)
    assert m is not None and m.measured_hit_rate is not None
    assert abs(m.measured_hit_rate - m.allowed_hit_rate) < 0.03
    assert session_metrics(list(off.records)).measured_hit_rate == 0


def test_the_allowed_hit_rate_counts_in_the_block_the_engine_reported() -> None:
    """vLLM CPU runs 128-token blocks when none is given: counting a bench run's allowed
    reuse in 16-token blocks (the GPU default) overstated what its cache could serve."""
    from servetune.results.schema import ServerSeries

    wl = chat(count=8, users=2, user_tokens={"dist": "fixed", "value": 100})
    res = sim(wl)
    configured = run_session_metrics(res)
    res.server = ServerSeries(values=[{"kv_block_tokens": 128.0}])
    reported = run_session_metrics(res)
    assert configured is not None and reported is not None
    systems = plan_sessions(parse_workload(wl)).system_prompts()
    by_block = {
        b: session_metrics(list(res.records), block_tokens=b, system_prompts=systems)
        for b in (16, 128)
    }
    assert configured.allowed_hit_rate == by_block[16].allowed_hit_rate  # type: ignore[union-attr]
    assert reported.allowed_hit_rate == by_block[128].allowed_hit_rate  # type: ignore[union-attr]
    assert reported.allowed_hit_rate < configured.allowed_hit_rate


def test_sim_eviction_under_a_small_pool_turns_hits_into_misses() -> None:
    wl = chat(count=24, users=8, user_tokens={"dist": "fixed", "value": 1500}, think_time_s=2.0)
    big = session_metrics(list(sim(wl).records))
    small = session_metrics(list(sim(wl, kv_cache_tokens=16_384).records))
    assert big.measured_hit_rate > 0.5 and small.measured_hit_rate < 0.7 * big.measured_hit_rate


def test_sim_llamacpp_reuses_a_sessions_slot() -> None:
    model, hw = get_model("gemma-3-270m"), get_hardware("cpu-host")
    wl = parse_workload(chat(count=4, users=2))
    few = EngineConfig(engine="llamacpp", parallel_slots=2, max_model_len=4096)
    res, _ = simulate(model, hw, few, wl)
    hit = session_metrics(list(res.records)).measured_hit_rate
    assert hit is not None and hit > 0.5  # a user's next turn finds its slot free
    res, _ = simulate(model, hw, few.with_(enable_prefix_caching=False), wl)
    assert session_metrics(list(res.records)).measured_hit_rate == 0


def test_sim_turns_follow_the_answer_plus_think_time() -> None:
    res = sim(chat(count=2, users=1, think_time_s=1.5))
    recs = sorted(res.records, key=lambda r: r.index)
    for prev, cur in zip(recs, recs[1:], strict=False):
        assert cur.send_ns >= prev.end_ns + (1.5e9 if cur.sub != "turn0" else 0)


def test_sim_slo_judges_the_chosen_turns() -> None:
    wl = chat(count=8, users=8, user_tokens={"dist": "fixed", "value": 3000}, slo_turns="followup")
    res, _ = simulate(get_model("llama-3.1-8b"), get_hardware("h100-sxm"),
                      EngineConfig(engine="vllm"), parse_workload(wl),
                      slo=SLO.model_validate({"ttft_ms": {"p95": 10_000}}))  # fmt: skip
    assert res.metrics.slo_checks and res.metrics.slo_checks[0].metric == "followup.ttft_ms"


def test_a_turn_class_slo_keeps_the_runs_window_rules() -> None:
    """The follow-ups' own verdict is computed over the run's window: with a cool-down,
    the class's goodput equals the class's metrics computed with that cool-down (before,
    the cool-down and `stream` were dropped for the class)."""
    wl = chat(count=8, users=8, user_tokens={"dist": "fixed", "value": 3000}, slo_turns="followup")
    spec = parse_workload({**wl, "cooldown_s": 2.0})
    slo = SLO.model_validate({"ttft_ms": {"p95": 10_000}})
    res, _ = simulate(get_model("llama-3.1-8b"), get_hardware("h100-sxm"),
                      EngineConfig(engine="vllm"), spec, slo=slo)  # fmt: skip
    part = [r for r in res.records if in_class(r.sub, "followup")]
    want = compute_metrics(part, cooldown_s=2.0, slo=slo)
    unwindowed = compute_metrics(part, slo=slo)
    assert res.metrics.goodput_req_s == pytest.approx(want.goodput_req_s)
    assert want.goodput_req_s != pytest.approx(unwindowed.goodput_req_s)


# --- bench's session driver -------------------------------------------------------------


def test_bench_chains_turns_with_the_answers_received() -> None:
    spec = parse_workload(chat(count=4, users=2, system_prompt={"groups": 1, "tokens": 30}))
    with mock_in_thread(MockConfig(ttft_ms=10, itl_ms=1)) as srv:
        opts = BenchOptions(url=f"http://127.0.0.1:{srv.port}", workers=1)
        res = run_point(spec, materialize(spec, WordTokenizer()), opts)
    recs = sorted(res.records, key=lambda r: r.index)
    assert res.metrics.completed == 16
    by_session: dict[int, list] = {}
    for r in recs:
        by_session.setdefault(r.prefix_group, []).append(r)
    for turns in by_session.values():
        for prev, cur in zip(turns, turns[1:], strict=False):
            # the mock counts words: the previous prompt, its answer and 100 new words
            assert cur.usage_prompt_tokens == prev.usage_prompt_tokens + 20 + 100
            assert cur.send_ns >= prev.end_ns + 0.2e9  # think time after the answer
    in_flight = max(sum(1 for r in recs if r.send_ns <= t < r.end_ns) for t in
                    (r.send_ns for r in recs))  # fmt: skip
    assert in_flight <= 2  # two users
    m = session_metrics(recs)
    assert m is not None and m.sessions == 4 and m.followup.requests == 12
    assert m.resent_tokens == sum(p.usage_prompt_tokens for t in by_session.values()
                                  for p in t[:-1])  # fmt: skip


# --- tune ---------------------------------------------------------------------------------


def test_tune_finds_the_agent_loops_capacity_in_users(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from servetune.cli.app import app

    monkeypatch.chdir(tmp_path)  # the study's report goes to ./out
    slo = tmp_path / "slo.yaml"
    # tight: binds at a few users on an H100 (vLLM's front end alone adds ~47 ms to TTFT)
    slo.write_text("ttft_ms: {p95: 80}\n")
    args = ["tune", "--backend", "sim", "--model", "llama-3.1-8b", "--gpu", "h100-sxm",
            "--space", str(ROOT / "examples/tune/vllm-gpu.yaml"),
            "--workload", str(ROOT / "examples/agent-loop.yaml"), "--slo", str(slo),
            "--trials", "1", "--no-edge", "--max-load", "64", "--json"]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    base = json.loads(res.stdout[res.stdout.index("{") :])["baseline"]
    points = {p["load"]: p["passed"] for p in base["points"]}
    assert all(p["load_kind"] == "concurrency" for p in base["points"])  # users
    assert 1 <= base["capacity"] < 64 and points[base["capacity"]]
    assert not all(points.values())  # a load beyond the capacity missed the SLO


def test_bench_open_loop_sessions_start_on_schedule() -> None:
    wl = chat(count=5, users=1, turns={"dist": "fixed", "value": 2})
    wl["arrival"] = {"kind": "poisson", "rate": 4}
    spec = parse_workload(wl)
    plan = plan_sessions(spec)
    with mock_in_thread(MockConfig(ttft_ms=10, itl_ms=1)) as srv:
        opts = BenchOptions(url=f"http://127.0.0.1:{srv.port}", workers=1)
        res = run_point(spec, materialize(spec, WordTokenizer()), opts)
    assert res.metrics.completed == 10
    # the schedule offers sessions: its rate and count are the first turns'
    assert res.metrics.offered_unit == "sessions/s" and res.metrics.offered_arrivals == 5
    firsts = {r.prefix_group: r for r in res.records if r.sub == "turn0"}
    for s in plan.sessions:  # each first turn at its planned start (the send lag is measured)
        assert firsts[s.index].scheduled_ns == int(s.start_s * 1e9)
        assert firsts[s.index].send_ns >= firsts[s.index].scheduled_ns
    assert all(r.scheduled_ns is None for r in res.records if r.sub != "turn0")


def test_a_session_a_failed_turn_ended_is_counted_not_dropped() -> None:
    """A failed turn ends its session: the session is still counted, the failure shows by
    turn, and its shortened span is no session duration. Only answered turns had counted:
    12 sessions with 3 broken on turn 0 read as 9, and a session cut short as a short one."""
    from servetune.status import RequestStatus

    recs = sorted(sim(chat(count=4, users=2)).records, key=lambda r: (r.prefix_group, r.sub))
    whole = session_metrics(recs)
    assert whole is not None and whole.sessions == 4 and whole.broken_sessions == 0
    s0 = recs[0].prefix_group
    kept = []
    for r in recs:  # session s0: turn 2 failed, turn 3 never sent
        if r.prefix_group == s0 and r.sub == "turn3":
            continue
        if r.prefix_group == s0 and r.sub == "turn2":
            r = r.model_copy(update={"status": RequestStatus.ERROR, "error": "http_5xx",
                                     "chunk_ns": [], "chunk_tokens": []})  # fmt: skip
        kept.append(r)
    m = session_metrics(kept)
    assert m is not None
    assert (m.sessions, m.broken_sessions, m.failed_turns, m.turns) == (4, 1, 1, 14)
    assert (m.by_turn[2].requests, m.by_turn[2].failed) == (3, 1)
    assert m.by_turn[3].requests == 3 and m.followup.failed == 1 and m.first.failed == 0
    assert m.session_duration_s.count == 3  # the broken one is no duration


def test_a_duration_that_outlasts_the_planned_sessions_is_said() -> None:
    """4 users of one-turn chats for 20 s at a 1 ms server: the 512 planned sessions ran
    out in a second or two and users dropped out one by one, said nowhere."""
    from servetune.metrics.turns import session_line

    wl = {"duration_s": 20, "arrival": {"kind": "closed", "concurrency": 4},
          "sessions": {"kind": "chat", "turns": {"dist": "fixed", "value": 1},
                       "user_tokens": {"dist": "fixed", "value": 10},
                       "output_tokens": {"dist": "fixed", "value": 4},
                       "think_time_s": 0}}  # fmt: skip
    spec = parse_workload(wl)
    with mock_in_thread(MockConfig(ttft_ms=1, itl_ms=1)) as srv:
        opts = BenchOptions(url=f"http://127.0.0.1:{srv.port}", workers=1)
        res = run_point(spec, materialize(spec, WordTokenizer()), opts)
    line = session_line(res)
    assert line is not None and line.startswith("512 sessions")
    assert "the 512 planned sessions ran out" in line and "s into the 20 s asked" in line
    whole = parse_workload({**wl, "duration_s": None, "count": 8})
    with mock_in_thread(MockConfig(ttft_ms=1, itl_ms=1)) as srv:
        opts = BenchOptions(url=f"http://127.0.0.1:{srv.port}", workers=1)
        counted = run_point(whole, materialize(whole, WordTokenizer()), opts)
    assert "ran out" not in (session_line(counted) or "")


def test_the_allowance_reads_a_cut_from_the_plan() -> None:
    """The agent-loop example's context cap cuts histories whose next message (tool
    results) outgrows what was dropped: guessed from lengths, those cuts were missed and
    the workload "allowed" 67% where the simulator hit, and the plan allows, 63%."""
    spec = parse_workload(yaml.safe_load((ROOT / "examples" / "agent-loop.yaml").read_text()))
    spec = spec.with_load(concurrency=4)
    res = simulate(get_model("llama-3.1-8b"), get_hardware("h100-sxm"), EngineConfig(), spec)[0]
    m = run_session_metrics(res)
    assert m is not None and m.measured_hit_rate is not None
    assert plan_sessions(spec).cuts()  # the cap cut some histories
    assert m.allowed_hit_rate == pytest.approx(m.measured_hit_rate, abs=0.01)
    guessed = session_metrics(list(res.records), block_tokens=16,
                              system_prompts=plan_sessions(spec).system_prompts())  # fmt: skip
    assert guessed is not None and guessed.allowed_hit_rate > m.allowed_hit_rate + 0.02
