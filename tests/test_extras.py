"""Every extra that a message or the docs tell a user to install exists in pyproject.toml; the cli extra's
packages are imported by the command line only."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# "pip install 'rag-retrieval[pg]'", "rag-retrieval[dagster,ui]", "the cli extra", "the 'torch' extra"
NAMED = re.compile(r"rag-retrieval\[([\w,-]+)\]|\bthe [`'\"]?([\w-]+)[`'\"]? extra\b")


def _extras() -> set[str]:
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def _named(text: str) -> set[str]:
    names: set[str] = set()
    for listed, single in NAMED.findall(text):
        names.update(n for n in (listed.split(",") if listed else [single]) if n)
    return names


def test_the_pattern_finds_both_spellings():
    assert _named("needs the pg extra (pip install 'rag-retrieval[cli,use]')") == {"pg", "cli", "use"}
    assert _named("install the 'torch' extra") == {"torch"}


def test_every_extra_named_in_code_and_docs_exists():
    files = [*ROOT.glob("rag_core/**/*.py"), *ROOT.glob("rag_assets/**/*.py"), ROOT / "README.md", ROOT / "Makefile"]
    unknown = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in files
        for name in _named(path.read_text(encoding="utf-8"))
        if name not in _extras()
    }
    assert not unknown, f"extras named but not in pyproject.toml: {sorted(unknown)}"


def _cli_packages() -> tuple[str, ...]:
    """The import names of the cli extra's packages (``typer``, ``rich``): only the command line
    (``rag_core/cli/``) may import them, so the library and the Dagster code location work without it."""
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["cli"]
    return tuple(sorted(re.match(r"[\w-]+", spec).group().replace("-", "_") for spec in extra))


def _imported_top_names(path: Path) -> set[str]:
    """Top-level package names ``path`` imports anywhere (module top or inside a function)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_the_scan_sees_imports_inside_functions(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from typer.testing import CliRunner\n    import rich.table\n")
    assert {"typer", "rich"} <= _imported_top_names(module)


def test_no_cli_package_is_imported_outside_rag_core_cli():
    assert "typer" in _cli_packages()
    cli_dir = ROOT / "rag_core" / "cli"
    offenders = sorted(
        f"{path.relative_to(ROOT)}: {name}"
        for path in [*ROOT.glob("rag_core/**/*.py"), *ROOT.glob("rag_assets/**/*.py")]
        if cli_dir not in path.parents
        for name in _imported_top_names(path) & set(_cli_packages())
    )
    assert not offenders, f"the cli extra imported outside rag_core/cli/: {offenders}"


_BLOCK_CLI = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, Block())
import rag_core.evaluation.calibrate, rag_core.recording.record, rag_core.recording.suites
from rag_assets.definitions import defs
assert defs.assets, "no assets loaded"
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {blocked!r})
print("loaded:", loaded)
"""


def test_the_library_and_dagster_code_location_import_without_the_cli_extra():
    script = _BLOCK_CLI.format(blocked=_cli_packages())
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "loaded: []" in done.stdout
