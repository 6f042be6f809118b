"""Reading a user's YAML/JSON file (workload, SLO, search space, preset) with the one-line
errors every such option gives: unreadable file, not text, not YAML (with the parser's
first line), or a document whose aliases expand past what any spec needs (a YAML bomb).

Why the alias bound: an anchor referenced nine times on each of nine levels is 9^9 = 387
million values once expanded. PyYAML builds it cheaply (aliases share one object), but
anything that walks it - pydantic's validation, an error message's repr - does not return
(2.3 GB and counting in 45 s). The composed node graph is measured before it is built.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from servetune.errors import InputError
from servetune.outfile import missing_file_fix

# Values a document may hold once its aliases are expanded. A workload's empirical
# histogram or a preset is thousands at most; the bound only stops expansion bombs.
MAX_EXPANDED_NODES = 1_000_000


class _TooLarge(ValueError):
    """The document's aliases expand to more than MAX_EXPANDED_NODES values."""


def parse_yaml(text: str) -> Any:
    """`yaml.safe_load` with libyaml's C parser when PyYAML was built with it (same safe
    subset, ~6x faster: the packaged hardware catalog parses in ~5 ms instead of ~27).
    A document with anchors is measured first: an alias bomb is a `yaml.YAMLError`, so
    every caller's "not valid YAML" line reports it."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if "&" in text:  # no anchor, no alias: the size is bounded by the text's
            try:
                expanded_size(node)
            except _TooLarge as exc:
                raise yaml.YAMLError(f"{exc}: write the values out, not nested aliases") from None
        return loader.construct_document(node)
    finally:
        loader.dispose()


def expanded_size(root: Any, limit: int = MAX_EXPANDED_NODES) -> int:
    """Nodes in the document with every alias expanded (shared nodes counted once per
    use), computed over the node graph without expanding it; `_TooLarge` past `limit`, or
    for a node that contains itself (expands forever)."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()

    def size(node: Any) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_:
            raise _TooLarge("an alias refers to a node that contains it")
        open_.add(key)
        n = 1
        for child in _children(node):
            n += size(child)
            if n > limit:
                raise _TooLarge(f"aliases expand to over {limit:,} values")
        open_.discard(key)
        sizes[key] = n
        return n

    return size(root)


def _children(node: Any) -> list[Any]:
    import yaml

    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [x for pair in node.value for x in pair]
    return []


def read_text(path: str | Path, field: str) -> str:
    """The text of `path`; an unreadable or binary file is one InputError naming `field`."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        fix = "check the path"
        if isinstance(exc, FileNotFoundError):
            fix = missing_file_fix(p, fix)
        raise InputError(field, f"cannot read {p}: {exc.strerror}", fix) from exc
    except ValueError as exc:  # e.g. a NUL byte in the path itself
        raise InputError(field, f"cannot read {p}: {exc}", "check the path") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            field, f"{p} is not a text file (byte {exc.start} is not UTF-8)", "give a text file"
        ) from None


def parse_yaml_text(text: str, field: str, where: str) -> Any:
    """`parse_yaml` with its failures as one InputError naming `field` (`where`: the
    file, for the message)."""
    import yaml

    try:
        return parse_yaml(text)
    except yaml.YAMLError as exc:
        raise InputError(field, f"{where} is not valid YAML", str(exc).splitlines()[0]) from exc
    except RecursionError:
        raise InputError(field, f"{where} nests too deeply", "flatten the document") from None


def load_yaml(path: str | Path, field: str) -> Any:
    """The parsed document of `path`; `field` names the option in the error (`--slo`)."""
    return parse_yaml_text(read_text(path, field), field, str(path))
