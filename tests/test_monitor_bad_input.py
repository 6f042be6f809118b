"""`monitor export` prints the limits its files use, and names the flag of a limit that
cannot be written (NaN, inf, past any replica's queue) in one line, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from tests.cli_run import run_cli

from servetune.errors import InputError
from servetune.measure.result import PointResult
from servetune.monitor import from_summary
from servetune.monitor.deployment import plain
from servetune.store import Store
from servetune.tune.trial import TrialResult, TrialStatus


def _summary(signals: dict) -> dict:
    """A tune summary whose vLLM winner was measured with `signals` at its best point."""
    best = PointResult("concurrency", 24.0, True, req_s=3.0, signals=signals)
    win = TrialResult(
        key="k1", config={"engine": "vllm", "max_num_seqs": 16}, label="win",
        backend="real", status=TrialStatus.OK, capacity=24.0, best=best, points=[best],
    )  # fmt: skip
    return {"study": "s", "winner": win.to_json()}


def _study(tmp_path: Path, signals: dict) -> str:
    """A store holding that summary as study `s`; its --db."""
    db = f"sqlite:///{tmp_path / 's.db'}"
    with Store.open(db) as store:
        store.update_study_meta("s", {"summary": _summary(signals)}, "tune")
    return db


MEASURED = {"requests_waiting_max": 0, "kv_cache_usage_max": 0.24}


def test_the_summary_prints_the_hand_limits_the_files_use(capsys, tmp_path: Path):
    db, out = _study(tmp_path, MEASURED), tmp_path / "mon"
    code, printed, err = run_cli(capsys, "monitor", "export", "--from-study", "s", "--db", db,
                                 "--queue-target", "3", "--kv-threshold", "0.5",
                                 "-o", str(out))  # fmt: skip
    assert code == 0, err
    notes = [ln.strip() for ln in printed.splitlines()]
    assert (
        "queue target 3/replica: given by hand (--queue-target 3); "
        "measured 1/replica: peak queue 0 at measured capacity"
    ) in notes
    assert (
        "KV threshold 50%: given by hand (--kv-threshold 0.5); "
        "measured 24%: KV peak at measured capacity"
    ) in notes
    assert not any(n.startswith(("queue target 1/", "KV threshold 24%")) for n in notes)
    groups = yaml.safe_load((out / "prometheus-rules.yaml").read_text())["groups"]
    alerts = {r["alert"]: r["expr"] for r in groups[1]["rules"]}
    assert "> 3 * servetune:replicas:value{" in alerts["ServetuneScaleOutPending"]
    assert alerts["ServetuneScaleOutKVCache"].endswith("} > 0.5")
    hpa = yaml.safe_load((out / "hpa.yaml").read_text())
    targets = [m["external"]["target"] for m in hpa["spec"]["metrics"]]
    assert {"type": "AverageValue", "averageValue": "3"} in targets
    assert {"type": "Value", "value": "0.5"} in targets


def test_a_zero_hand_limit_is_refused_not_replaced_by_the_measured_one():
    with pytest.raises(InputError, match="--queue-target"):
        from_summary(_summary(MEASURED), queue_target=0.0)
    with pytest.raises(InputError, match="--kv-threshold"):
        from_summary(_summary(MEASURED), kv_threshold=0.0)


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--queue-target", "nan"),
        ("--queue-target", "inf"),
        ("--queue-target", "1e300"),
        ("--queue-target", "0"),
        ("--queue-target", "1e-300"),  # 0 to the HPA, which reads thousandths
        ("--kv-threshold", "nan"),
        ("--kv-threshold", "inf"),
        ("--kv-threshold", "1e300"),
    ],
)
def test_a_limit_that_cannot_be_written_names_its_flag(capsys, tmp_path: Path, flag, value):
    hand = {"--queue-target": "2", "--kv-threshold": "0.8", flag: value}
    args = [a for kv in hand.items() for a in kv]
    code, _, err = run_cli(capsys, "monitor", "export", "--engine", "vllm", *args,
                           "-o", str(tmp_path / "mon"))  # fmt: skip
    assert code == 2 and err.startswith(f"error: {flag}:") and err.count("\n") == 1, err
    assert "schema" not in err and not (tmp_path / "mon" / "hpa.yaml").exists()
    # and before the study is read: a bad flag is named even beside a missing study
    code, _, err = run_cli(capsys, "monitor", "export", "--from-study", "nope", "--db",
                           f"sqlite:///{tmp_path / 'none.db'}", flag, value,
                           "-o", str(tmp_path / "mon2"))  # fmt: skip
    assert code == 2 and err.startswith(f"error: {flag}:"), err


def test_replicas_past_what_kubernetes_stores_are_refused(capsys, tmp_path: Path):
    """maxReplicas is an int32: a larger bound was written and kubectl would refuse it."""
    code, _, err = run_cli(capsys, "monitor", "export", "--engine", "vllm", "--queue-target",
                           "2", "--kv-threshold", "0.8", "--replicas", "1:99999999999999999999",
                           "-o", str(tmp_path / "mon"))  # fmt: skip
    assert code == 2 and err.startswith("error: --replicas:") and err.count("\n") == 1, err
    assert not (tmp_path / "mon").exists()


def test_a_large_queue_target_is_written_as_a_plain_quantity(capsys, tmp_path: Path):
    """`:g` wrote 1e+06, which no Kubernetes quantity parses (the HPA schema refused it)."""
    out = tmp_path / "mon"
    code, _, err = run_cli(capsys, "monitor", "export", "--engine", "vllm", "--queue-target",
                           "1000000", "--kv-threshold", "0.8", "-o", str(out))  # fmt: skip
    assert code == 0, err
    assert "averageValue: '1000000'" in (out / "hpa.yaml").read_text()
    assert plain(1e-9) == "0.000000001" and plain(0.24037360435156027) == "0.240374"


@pytest.mark.parametrize("engine", ["trtllm", "mlx", "transformers"])
def test_an_engine_with_nothing_to_scale_on_is_named_not_a_schema_error(capsys, tmp_path, engine):
    """trtllm exports no pending-requests gauge: KEDA's triggers came out empty and the
    schema refused the file; with --kv-threshold the fix named a queue it does not have."""
    for extra in ([], ["--kv-threshold", "0.8"]):
        code, _, err = run_cli(capsys, "monitor", "export", "--engine", engine,
                               "--queue-target", "4", *extra,
                               "-o", str(tmp_path / "mon"))  # fmt: skip
        assert code == 2 and err.count("\n") == 1, err
        assert err.startswith(f"error: --engine: {engine} exports no /metrics servetune can scale")
        assert "use vllm, sglang, tgi, llamacpp or onnx" in err and "schema" not in err
        assert "pending queue" not in err and not (tmp_path / "mon").exists()
    # a study tuned on it: named the same way, the study being what gave the engine
    s = _summary(MEASURED)
    s["winner"]["config"]["engine"] = engine
    with pytest.raises(InputError, match=f"--from-study: {engine} exports no /metrics"):
        from_summary(s)


def test_a_prometheus_url_keda_cannot_query_is_refused(capsys, tmp_path: Path):
    """An empty --prometheus-url was written as `serverAddress: ''` (exit 0)."""

    def export(url: str, out: Path) -> tuple[int, str]:
        code, _, err = run_cli(capsys, "monitor", "export", "--engine", "vllm", "--queue-target",
                               "2", "--kv-threshold", "0.8", "--prometheus-url", url,
                               "-o", str(out))  # fmt: skip
        return code, err

    for url in ("", "not a url", "prometheus:9090", "ftp://prom:9090", "http://",
                "http://p:0", "http://prom:9090/?x=1"):  # fmt: skip
        code, err = export(url, tmp_path / "bad")
        assert code == 2 and err.startswith("error: --prometheus-url:"), (url, err)
        assert err.count("\n") == 1 and not (tmp_path / "bad").exists()
    for k, url in enumerate(("https://prom.example:9443", "http://gw.monitoring/prometheus")):
        code, err = export(url, tmp_path / f"ok{k}")
        assert code == 0, err
        keda = yaml.safe_load((tmp_path / f"ok{k}" / "keda-scaledobject.yaml").read_text())
        assert {t["metadata"]["serverAddress"] for t in keda["spec"]["triggers"]} == {url}
