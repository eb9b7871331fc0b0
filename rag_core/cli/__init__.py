"""The ``rag`` command line (the cli extra). ``main`` is the console script: the command line, or
one line naming the ``cli`` extra when the core was installed without it. ``rag_core.cli.app`` is the
Typer app (``commands.app``), imported on first use so that importing this package needs no typer."""

from __future__ import annotations

import sys
from typing import Any

_CLI_PACKAGES = ("typer", "rich", "click")


def main() -> None:
    """Run ``rag_core.cli.commands.app``; exit 2 with one line when its packages are not installed."""
    try:
        from rag_core.cli.commands import app
    except ModuleNotFoundError as exc:
        if exc.name not in _CLI_PACKAGES:
            raise
        print(f"rag: the command line needs the cli extra: pip install 'rag-retrieval[cli]' ({exc})", file=sys.stderr)
        raise SystemExit(2) from None
    app()


def __getattr__(name: str) -> Any:
    """``rag_core.cli.app``: the Typer app of ``rag_core.cli.commands`` (PEP 562, loaded on first use)."""
    if name == "app":
        from rag_core.cli.commands import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
