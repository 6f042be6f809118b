"""Which servetune produced a result: a digest of the package's own code and data.

The version string (`servetune.__version__`) stays the same across every change made
between releases, so a stored simulated run that today's simulator no longer reproduces
could not say whether the simulator changed since or something else did (a
--hardware-file, a --replay). The digest changes with any file of the package, so two
runs of the same build are simulated by the same code and figures."""

from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path

from servetune import __version__

SKIP_DIRS = frozenset({"__pycache__"})
SKIP_SUFFIXES = frozenset({".pyc", ".pyo", ".so"})  # compiled by-products, not the source


def tree_digest(root: Path) -> str:
    """12 hex digits of BLAKE2b over every file below `root` (relative path and bytes, in
    path order), by-products left out: equal for equal trees wherever they are."""
    files: list[tuple[str, str]] = []  # (relative posix path, full path)
    for top, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        rel = Path(top).relative_to(root).as_posix()
        for name in names:
            if os.path.splitext(name)[1] not in SKIP_SUFFIXES:
                files.append((name if rel == "." else f"{rel}/{name}", os.path.join(top, name)))
    h = hashlib.blake2b(digest_size=6)
    for rel_path, full in sorted(files):
        with open(full, "rb") as fh:
            h.update(rel_path.encode() + b"\0" + fh.read() + b"\0")
    return h.hexdigest()


@lru_cache(maxsize=1)
def build_id() -> str:
    """This servetune's build: the digest of its installed package (once a process)."""
    return tree_digest(Path(__file__).resolve().parent)


def with_build(version: str, build: str | None) -> str:
    """A version with the build that tells two servetunes of one version apart:
    "0.1.0 (build 4f77139818c8)", the version alone where no build is named."""
    return f"{version} (build {build})" if build else version


def version_line() -> str:
    """What a page this servetune writes says of it: "servetune 0.1.0 (build ...)"."""
    return f"servetune {with_build(__version__, build_id())}"
