"""Print, one per line, the `uv pip install` options that give uv the package sources pip
is configured with here (index, extra indexes, find-links, constraints): uv reads no pip
configuration, and a host's pip config may point at local mirrors or cap versions.
Source: `pip config list` (every scope, then PIP_* variables, as pip itself ranks them)."""

from __future__ import annotations

import subprocess
import sys

# pip option -> uv option (uv pip install --help); each may hold several space-separated values
OPTIONS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}


def main() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
    ).stdout
    found: dict[str, str] = {}
    lines = out.splitlines()  # e.g. global.find-links='/opt/wheels'; PIP_* (":env:") win
    for line in sorted(lines, key=lambda line: line.startswith(":env:")):
        key, _, value = line.partition("=")
        name = key.rsplit(".", 1)[-1]
        if name in OPTIONS and value:
            found[name] = value.strip().strip("'\"")
    for name, value in found.items():
        for v in value.split():
            print(OPTIONS[name])
            print(v)


if __name__ == "__main__":
    main()
