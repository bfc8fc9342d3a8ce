"""The layout of exporter/ stays what docs/architecture.md says: imports point downstream, the pipeline is
assembled in one place, every module is on the map."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "exporter"


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        rel = p.relative_to(REPO).with_suffix("")
        name = ".".join(rel.parts).removesuffix(".__init__")
        out[name] = p
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    pkg = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}
    return {d for d in out if d in known and d != name}


def test_no_import_cycle_and_imports_point_downstream() -> None:
    mods = _modules()
    graph = {m: _imports(m, p, set(mods)) for m, p in mods.items()}
    for m, deps in graph.items():
        if m.startswith("exporter.collectors"):
            assert not [d for d in deps if d.startswith("exporter.derived")], f"{m} imports the derived layer"
        if m.startswith("exporter.derived"):
            assert not [d for d in deps if d.startswith("exporter.collectors")], f"{m} imports a collector"
    # Depth-first search for a cycle.
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in graph[m]:
            assert state.get(d) != 1, "import cycle: " + " -> ".join([*path, m, d])
            if d not in state:
                visit(d, [*path, m])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [])


def _unit(module: str) -> str:
    """The package a module belongs to (``exporter.gpu`` for ``exporter.gpu.session``), or the module itself at
    the top of exporter/."""
    return ".".join(module.split(".")[:2])


def test_no_two_packages_import_each_other() -> None:
    # Without a module-level cycle, two packages can still lean on each other (samples/ reading gpu/'s field
    # table while gpu/ builds samples): neither is then below the other, and the next import closes a cycle.
    mods = _modules()
    edges: dict[tuple[str, str], str] = {}
    for m, p in mods.items():
        for d in _imports(m, p, set(mods)):
            if _unit(m) != _unit(d):
                edges.setdefault((_unit(m), _unit(d)), f"{m} -> {d}")
    both = sorted(f"{edges[a, b]} and {edges[b, a]}" for a, b in edges if (b, a) in edges and a < b)
    assert both == [], "packages importing each other: " + "; ".join(both)


# The one class allowed past the size limit: the scheduler keeps its state in one place on purpose.
BIG_CLASS_OK = {"exporter.engine.Engine"}
MAX_CLASS_LINES = 500


def test_no_class_is_over_500_lines_but_the_engine() -> None:
    big = {}
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_CLASS_LINES and f"{name}.{node.name}" not in BIG_CLASS_OK:
                    big[f"{name}.{node.name}"] = lines
    assert big == {}, f"classes over {MAX_CLASS_LINES} lines: {big}"


def test_only_the_pipeline_constructs_the_engine_and_the_analyzer() -> None:
    builders: dict[str, set[str]] = {"Engine": set(), "Analyzer": set()}
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                called = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                if called in builders:
                    builders[called].add(name)
    assert builders == {"Engine": {"exporter.pipeline"}, "Analyzer": {"exporter.pipeline"}}


def test_no_collector_context_carries_an_untyped_shared_dict() -> None:
    src = (PKG / "sampling.py").read_text()
    assert "shared" not in re.findall(r"^\s+(\w+):", src, re.M)


def test_every_module_is_on_the_map_and_the_map_names_no_missing_file() -> None:
    doc = (REPO / "docs" / "architecture.md").read_text()
    tree = doc[doc.index("```\nexporter/"):]
    tree = tree[: tree.index("```", 4)]
    listed: set[str] = set()
    folder = ""
    for line in tree.splitlines()[2:]:
        indent = len(line) - len(line.lstrip())
        words = line.split()
        if not words:
            continue
        if words[0].endswith("/"):
            folder = words[0]
            continue
        for w in words:
            if not re.fullmatch(r"[\w.]+\.(py|yaml)", w):
                break
            listed.add((folder if indent > 2 else "") + w)
    actual = {str(p.relative_to(PKG)) for p in PKG.rglob("*.py")} | {"thresholds.yaml"}
    actual -= {f"{d}/__init__.py" for d in ("gpu", "samples", "derived", "sim", "fleet", "diagnose")}
    assert actual - listed == set(), "modules missing from docs/architecture.md"
    assert listed - actual == set(), "docs/architecture.md names files that do not exist"
