"""`servetune simulate` / `calibrate` through the real entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

WL = {
    "count": 120,
    "arrival": {"kind": "poisson", "rate": 10},
    "input_tokens": {"dist": "fixed", "value": 256},
    "output_tokens": {"dist": "fixed", "value": 32},
}


def cli(*args: str) -> subprocess.CompletedProcess:
    code = "from servetune.cli.app import main; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120
    )


def test_simulate_json_and_files(tmp_path: Path):
    w = tmp_path / "w.yaml"
    w.write_text(yaml.safe_dump(WL))
    out, tr = tmp_path / "r.json", tmp_path / "t.csv"
    p = cli(
        "simulate",
        "--model",
        "llama-3.1-8b",
        "--gpu",
        "h100-sxm",
        "--set",
        "max_num_seqs=32",
        "--set",
        "max_model_len=4096",
        "--workload",
        str(w),
        "--json",
        "-o",
        str(out),
        "--trace",
        str(tr),
    )
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s["completed"] == 120 and s["tier"] == "roofline"
    assert json.loads(out.read_text())["backend"] == "sim"
    assert tr.read_text().startswith("step,steps,")
    # calibrate from that result (as if measured), then simulate with the profile
    prof = tmp_path / "p.json"
    p = cli("calibrate", str(out), "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "-o", str(prof))
    assert p.returncode == 0, p.stderr
    p = cli(
        "simulate",
        "--model",
        "llama-3.1-8b",
        "--gpu",
        "h100-sxm",
        "--set",
        "max_model_len=4096",
        "--workload",
        str(w),
        "--profile",
        str(prof),
        "--json",
    )
    assert p.returncode == 0 and json.loads(p.stdout)["tier"] == "calibrated"
    p = cli(
        "simulate",
        "--model",
        "qwen3-8b",
        "--gpu",
        "h100-sxm",
        "--set",
        "max_model_len=4096",
        "--workload",
        str(w),
        "--profile",
        str(prof),
    )
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "profile is for" in p.stderr


def test_bad_config_is_one_line(tmp_path: Path):
    w = tmp_path / "w.yaml"
    w.write_text(yaml.safe_dump(WL))
    p = cli(
        "simulate", "--gpu", "cpu-host", "--set", "kv_cache_space_gib=0.001", "--workload", str(w)
    )
    assert p.returncode == 2 and p.stderr.count("\n") == 1
    p = cli(
        "simulate",
        "--set",
        "max_num_seqs=512",
        "--set",
        "max_num_batched_tokens=256",
        "--workload",
        str(w),
    )
    assert p.returncode == 2 and "max_num_batched_tokens" in p.stderr
