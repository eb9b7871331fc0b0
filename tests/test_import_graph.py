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
