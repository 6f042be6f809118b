"""Fixes to `quality`: the GPUs a build uses, simulated runs, degenerate corpora."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_run import run_cli
from servetune.engines.config import EngineConfig
from servetune.errors import InputError
from servetune.quality.corpus import load_corpus
from servetune.quality.stored import perf
from servetune.quality.verdict import judge
from servetune.store import Store
from synthetic_runs import synthetic_run

URLS = ("--baseline", "http://127.0.0.1:9", "--candidate", "http://127.0.0.1:9")


def _save(s: Store, run_id: str, cfg: EngineConfig | None, backend: str = "real") -> None:
    res, meta = synthetic_run(4, seed=1, n_requests=30, config=cfg, backend=backend)
    res.id = meta.id = run_id
    meta.hardware = {**meta.hardware, "gpu_count": 8}  # the host's nvidia-smi count
    if cfg is None:
        meta.engine_config = None
    s.save_result(res, meta)


def test_cost_counts_the_gpus_each_build_uses_not_the_hosts(tmp_path: Path) -> None:
    """TP=2 bf16 vs TP=1 AWQ on an 8-GPU host at the same throughput: half the cost."""
    with Store.open(str(tmp_path / "q.db")) as s:
        _save(s, "bf16", EngineConfig(max_num_seqs=64, tensor_parallel_size=2))
        _save(s, "awq", EngineConfig(max_num_seqs=64, quantization="awq"))
        _save(s, "dp", EngineConfig(max_num_seqs=64, tensor_parallel_size=2, data_parallel_size=2))
        _save(s, "bare", None)
        b, c = perf(s, "bf16", "--baseline-run"), perf(s, "awq", "--candidate-run")
        assert (b.gpu_count, c.gpu_count) == (2, 1)
        assert perf(s, "dp", "--baseline-run").gpu_count == 4
        assert perf(s, "bare", "--baseline-run").gpu_count == 8  # no config: the host's
    cost = {ch.name: ch for ch in judge(0.0, 0.05, b, c).checks}["cost"]
    assert "(-50.0%" in cost.evidence


def test_a_simulated_run_is_refused_as_a_measurement(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "q.db")
    with Store.open(db) as s:
        _save(s, "bench-a", EngineConfig(max_num_seqs=64))
        _save(s, "sim-b", EngineConfig(max_num_seqs=64), backend="sim")
    for flag, runs in (
        ("--candidate-run", ("--baseline-run", "bench-a", "--candidate-run", "sim-b")),
        ("--baseline-run", ("--baseline-run", "sim-b", "--candidate-run", "bench-a")),
        ("--candidate-run", ("--candidate-run", "sim-b")),
    ):
        code, _, err = run_cli(capsys, "quality", *URLS, *runs, "--db", db)
        assert code == 2 and err.count("\n") == 1, err
        assert err.startswith(f"error: {flag}") and "simulated" in err, err


def test_an_empty_passage_is_refused_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "c.yaml"
    bad.write_text('passages:\n  - {id: a, text: "one two three"}\n  - {id: b, text: "  "}\n')
    with pytest.raises(InputError, match=r"^--corpus: .*passage 'b' has no text"):
        load_corpus(bad)


class _OneToken:
    """An endpoint whose tokenizer gives a short passage one token (BOS only)."""

    url, weights = "http://a:1", None

    def tokenize(self, text: str) -> list[int]:
        return [1] if len(text.split()) < 2 else [1, 2, 3]


def test_a_passage_of_one_token_is_refused_before_scoring(tmp_path: Path) -> None:
    from servetune.quality.run import Settings, compare

    path = tmp_path / "c.yaml"
    path.write_text('passages:\n  - {id: a, text: "one two three"}\n  - {id: b, text: "x"}\n')
    ep = _OneToken()
    with pytest.raises(InputError, match=r"^--corpus: passage 'b' is 1 token\(s\) long"):
        compare(ep, ep, load_corpus(path), Settings())  # type: ignore[arg-type]
