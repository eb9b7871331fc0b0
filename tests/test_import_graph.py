"""rag_core's modules import one way: no import circle, counting imports inside functions too
(a lazy import still ties two modules together)."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return name.removesuffix(".__init__")


def import_graph(package: str = "rag_core") -> dict[str, set[str]]:
    """Module -> the modules it imports, for every ``import`` / ``from ... import`` of ``package``'s own modules."""
    modules = {_module(p): p for p in (ROOT / package).rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules]
                targets = subs or [node.module]  # `from pkg import submodule` depends on the submodule
            else:
                continue
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def test_the_graph_sees_lazy_imports():
    assert "rag_core.stores.idle_stop" in import_graph()["rag_core.stores.milvus_server"]  # inside a function
    with pytest.raises(CycleError):
        TopologicalSorter({"a": {"b"}, "b": {"a"}}).prepare()


def test_rag_core_has_no_import_circle():
    try:
        TopologicalSorter(import_graph()).prepare()
    except CycleError as exc:
        pytest.fail(f"import circle: {' -> '.join(exc.args[1])}")


def package_graph(package: str = "rag_core") -> dict[str, set[str]]:
    """The import graph one level down: each subpackage or top-level module of ``package`` (``rag_core.ingest``,
    ``rag_core.health``...) -> those its modules import. A circle here is two parts that lean on each other
    even when no module does: ``ingest.pipeline -> health -> ingest.chunking``."""

    def part(module: str) -> str:
        return ".".join(module.split(".")[:2])

    graph: dict[str, set[str]] = {}
    for module, targets in import_graph(package).items():
        graph.setdefault(part(module), set()).update(part(t) for t in targets if part(t) != part(module))
    return graph


def test_the_part_graph_sees_a_circle_through_two_modules():
    graph = {"p.a.x": {"p.b"}, "p.b": {"p.a.y"}, "p.a.y": set()}  # no module circle, but p.a <-> p.b
    TopologicalSorter(graph).prepare()
    parts = {"p.a": {"p.b"}, "p.b": {"p.a"}}
    with pytest.raises(CycleError):
        TopologicalSorter(parts).prepare()
    assert "rag_core.ingest" in package_graph()["rag_core.health"]  # health reads ingest's index state


def test_ingest_and_health_do_not_import_each_other():
    graph = package_graph()
    assert "rag_core.health" not in graph["rag_core.ingest"], "ingest must not import rag_core.health"


def test_rag_core_parts_have_no_import_circle():
    try:
        TopologicalSorter(package_graph()).prepare()
    except CycleError as exc:
        pytest.fail(f"import circle between parts of rag_core: {' -> '.join(exc.args[1])}")
