"""An installed engine's own --help, read for the option spellings it lists together: the
adapters' `ALIASES` are checked against the engine they name."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping, Sequence


def option_groups(help_text: str) -> list[set[str]]:
    """Each help line's option names (`-np,   --parallel N` -> {-np, --parallel}), for the
    lines that list an option (argparse and llama.cpp's common/arg both start it with -)."""
    groups = []
    for line in help_text.splitlines():
        if line.lstrip().startswith("-"):
            names = set(re.findall(r"(?:^|[\s,])(--?[A-Za-z][\w-]*)", line))
            if names:
                groups.append(names)
    return groups


def missing_aliases(aliases: Mapping[str, str], argv: Sequence[str], env: dict) -> list[str]:
    """The `alias -> flag` pairs no line of `argv`'s help lists together."""
    text = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env).stdout
    groups = option_groups(text)
    return [f"{a} -> {f}" for a, f in aliases.items() if not any({a, f} <= g for g in groups)]
