"""Every extra that a message or the docs tell a user to install exists in pyproject.toml."""

from __future__ import annotations

import re
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
