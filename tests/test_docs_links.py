"""Every relative link in README.md and docs/*.md resolves: the file exists, and a
`#anchor` names a heading of the target. Anchors are GitHub's heading ids (lower case,
punctuation other than `-` and `_` dropped, spaces as `-`, a repeated heading gets `-1`,
`-2`, ...), the form a reader clicks on. Web links are not fetched (no network here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"`+[^`]*`+")


def prose_lines(text: str) -> list[str]:
    """The page's lines outside fenced code blocks (a link shown as code is no link)."""
    out, in_fence = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            out.append(line)
    return out


def slug(heading: str) -> str:
    """GitHub's id for a heading's text: markup and punctuation dropped, lower case,
    each space a hyphen (github.com's anchor rule; hyphens and underscores kept)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The ids of every heading of `page`, repeats numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    ids = set()
    for line in prose_lines(page.read_text()):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        ids.add(base if n == 0 else f"{base}-{n}")
    return ids


def links(page: Path) -> list[str]:
    """Every link target written in `page`'s prose (inline and reference definitions)."""
    found = []
    for line in prose_lines(page.read_text()):
        found += INLINE_LINK.findall(CODE_SPAN.sub("", line))  # nor is one in backticks
        m = REFERENCE_DEF.match(line)
        if m:
            found.append(m.group(1))
    return found


def is_relative(target: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE)


def broken_links(page: Path) -> list[str]:
    """`page`'s relative links whose file is missing or whose anchor is no heading there."""
    bad = []
    for target in filter(is_relative, links(page)):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no file {path}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {dest.name}")
    return bad


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_anchors_resolve(page: Path) -> None:
    assert broken_links(page) == []


def test_the_checker_sees_missing_files_and_anchors(tmp_path: Path) -> None:
    """The checker itself: a good link, a missing file, a missing anchor, an anchor built
    from a heading with code and punctuation, a repeated heading, links in code ignored."""
    (tmp_path / "other.md").write_text("# Title\n\n## `--gpu local`: this host, measured\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n## Notes\n\n## Notes\n\n"
        "[ok](other.md) [ok](other.md#--gpu-local-this-host-measured) [self](#notes-1)\n"
        "[web](https://example.com/x.md) [gone](missing.md) [bad](other.md#nope)\n"
        "[bad self](#notes-2) `[code](nowhere.md)`\n\n```\n[fenced](nowhere.md)\n```\n"
        "[ref]: other.md#title\n"
    )
    assert broken_links(page) == [
        "missing.md: no file missing.md",
        "other.md#nope: no heading #nope in other.md",
        "#notes-2: no heading #notes-2 in page.md",
    ]
