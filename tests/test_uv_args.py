"""scripts/uv_args.py hands uv the package sources pip is configured with (uv reads no pip
configuration): checked against pip itself, with PIP_* variables that must win over the
host's config files, as they do for pip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "uv_args.py"


def _args(config: str = os.devnull, **env: str) -> list[str]:
    """The script's options under exactly this pip config file and `env`'s PIP_* settings."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    out = subprocess.run(
        [sys.executable, str(SCRIPT)],
        capture_output=True, text=True, check=True, timeout=60,
        env={**clean, "PIP_CONFIG_FILE": config, **env},
    ).stdout  # fmt: skip
    return out.split("\n")[:-1]


def test_each_configured_source_becomes_a_uv_option_and_variables_win(tmp_path: Path) -> None:
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nfind-links = /from/file\nindex-url = https://mirror.test/simple\n")
    got = _args(
        str(conf),
        PIP_FIND_LINKS="/wheels/a /wheels/b",
        PIP_CONSTRAINT="/caps.txt",
        PIP_EXTRA_INDEX_URL="file:///mirror/simple",
    )
    pairs = list(zip(got[::2], got[1::2], strict=True))
    assert sorted(pairs) == [
        ("--constraint", "/caps.txt"),
        ("--extra-index-url", "file:///mirror/simple"),
        ("--find-links", "/wheels/a"),
        ("--find-links", "/wheels/b"),
        ("--index-url", "https://mirror.test/simple"),
    ]


def test_options_pip_has_no_use_for_in_uv_are_left_out() -> None:
    assert _args(PIP_DEFAULT_TIMEOUT="180", PIP_DISABLE_PIP_VERSION_CHECK="1") == []
