"""The package layering (DESIGN.md "Layers import downward only: no circles"), checked on
the source: every module under src/servetune is parsed with `ast`, and every servetune
import it makes -- at module level, inside functions, under TYPE_CHECKING -- is an edge
between the units of LAYERS. No unit may import from a unit on a later line, and the
units' graph has no circle. A deferred import hides a circle from Python, not from this.

See the graph (units by layer, each with what it imports):

    .venv/bin/python tests/test_layers.py
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# Lowest layer first; a unit may import from units on its own line or an earlier one.
# A unit is a package or module under servetune; a module belongs to the longest unit
# that prefixes it ("__init__" is servetune/__init__.py itself). `engines` is the engine
# knowledge (EngineConfig, each engine's flags and metric names: the planner prints
# flags, the load client reads metric names); starting engines is the later line.
LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "__init__",
        "errors",
        "filekinds",
        "units",
        "paths",
        "build",
        "outfile",
        "yamlfile",
        "slo",
        "status",
        "aio",
        "procfs",
        "lazy",
        "http_retry",
    ),
    ("model", "hardware", "workload", "results", "metrics", "engines"),
    ("plan",),
    ("sim", "bench", "mock", "telemetry"),
    (
        "engines.process",
        "engines.install",
        "engines.detached",
        "engines.testmodel",
        "engines.onnx_model",
    ),
    ("store",),
    ("measure",),
    ("validate",),
    ("tune",),
    ("accept", "quality", "diagnose", "monitor"),
    ("report",),
    ("cli",),
)


@dataclass(frozen=True)
class Edge:
    """`module` (line `line`) imports `target`; both are dotted servetune module names."""

    module: str
    line: int
    target: str


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path, modules: set[str]) -> list[Edge]:
    """Every servetune import in the file, wherever it sits. `from a import b` names the
    module a.b when there is one, else a."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges: list[Edge] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level-1 packages
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                       for a in node.names]  # fmt: skip
        else:
            continue
        edges += [Edge(name, node.lineno, t) for t in targets if t.split(".")[0] == "servetune"]
    return edges


def modules_under(root: Path) -> set[str]:
    return {module_name(f, root) for f in (root / "servetune").rglob("*.py")}


def collect(root: Path) -> list[Edge]:
    """The import edges of every module of the `servetune` package under `root`."""
    files = sorted((root / "servetune").rglob("*.py"))
    modules = modules_under(root)
    return [e for f in files for e in imports_of(f, root, modules)]


def unit_of(module: str, units: Iterable[str]) -> str | None:
    """The longest unit that prefixes `module` (None: the module has no place)."""
    rel = module.removeprefix("servetune.") if module != "servetune" else "__init__"
    hits = [u for u in units if rel == u or rel.startswith(u + ".")]
    return max(hits, key=len) if hits else None


def unit_graph(edges: Iterable[Edge], units: Iterable[str]) -> dict[tuple[str, str], list[Edge]]:
    """(importing unit, imported unit) -> the imports behind it; imports inside a unit,
    and modules without a unit, are left out."""
    units = list(units)
    graph: dict[tuple[str, str], list[Edge]] = defaultdict(list)
    for e in edges:
        a, b = unit_of(e.module, units), unit_of(e.target, units)
        if a is not None and b is not None and a != b:
            graph[(a, b)].append(e)
    return graph


def cycles(pairs: Iterable[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected groups of more than one unit (Tarjan), each sorted."""
    succ: dict[str, set[str]] = defaultdict(set)
    for a, b in pairs:
        succ[a].add(b)
        succ[b]
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(succ[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(succ):
        if v not in index:
            visit(v)
    return out


def violations(edges: Iterable[Edge], layers: tuple[tuple[str, ...], ...]) -> list[str]:
    """One line per problem: a module outside the table, an import of a later layer, a
    circle between units."""
    level = {u: i for i, line in enumerate(layers) for u in line}
    edges = list(edges)
    problems = sorted(
        {f"{m}: not in the layer table" for e in edges for m in (e.module, e.target)
         if unit_of(m, level) is None}
    )  # fmt: skip
    graph = unit_graph(edges, level)
    for (a, b), why in sorted(graph.items()):
        if level[b] > level[a]:
            where = ", ".join(dict.fromkeys(f"{e.module}:{e.line}" for e in why))
            problems.append(f"{a} (layer {level[a]}) imports {b} (layer {level[b]}): {where}")
    for group in cycles(graph):
        problems.append("circle between " + ", ".join(group))
    return problems


def render(graph: Mapping[tuple[str, str], list[Edge]], layers: tuple[tuple[str, ...], ...]) -> str:
    """Units by layer, each with the units it imports."""
    succ: dict[str, set[str]] = defaultdict(set)
    for a, b in graph:
        succ[a].add(b)
    lines = []
    for i, line in enumerate(layers):
        for u in line:
            lines.append(f"{i:>2} {u:18s} -> {', '.join(sorted(succ[u])) or '-'}")
    return "\n".join(lines)


# -- the checks ------------------------------------------------------------------------


def test_servetune_layers_import_downward_only_without_circles() -> None:
    edges = collect(SRC)
    assert len(edges) > 300  # the walk found the package's imports
    assert violations(edges, LAYERS) == []


def test_every_servetune_import_names_a_module_that_exists() -> None:
    """A stale import under TYPE_CHECKING or in a cold function fails only when it runs;
    here it fails at once."""
    modules = modules_under(SRC)
    assert sorted({f"{e.module}:{e.line} {e.target}" for e in collect(SRC)
                   if e.target not in modules}) == []  # fmt: skip


def test_the_checker_catches_an_upward_import_hidden_in_a_function(tmp_path: Path) -> None:
    pkg = tmp_path / "servetune"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("")
    (pkg / "low" / "maths.py").write_text("def f():\n    from servetune.high import g\n")
    (pkg / "high.py").write_text("from servetune.low import maths\n\ndef g(): ...\n")
    (pkg / "stray.py").write_text("from . import high\n")
    layers = (("low",), ("high",))

    found = violations(collect(tmp_path), layers)

    assert found == [
        "servetune.stray: not in the layer table",
        "low (layer 0) imports high (layer 1): servetune.low.maths:2",
        "circle between high, low",
    ]
    assert violations(collect(tmp_path), (("low", "high", "stray"),)) == [
        "circle between high, low"
    ]


def test_cycles_finds_every_circle_and_nothing_else() -> None:
    pairs = [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("d", "e"), ("e", "d"), ("f", "a")]
    assert cycles(pairs) == [["d", "e"], ["a", "b", "c"]]
    assert cycles([("a", "b"), ("b", "c")]) == []


if __name__ == "__main__":
    print(render(unit_graph(collect(SRC), [u for line in LAYERS for u in line]), LAYERS))
    for problem in violations(collect(SRC), LAYERS):
        print("problem:", problem)
